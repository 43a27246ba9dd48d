"""The order book: every node's answer to every request shape, kept as arrays.

Rule 1: a node's answers are exactly what `shared.strategies.answer` returns for its current
view. `answer` is a pure function of (strategy, request, view) that reads, of the view, its
capacity, commitments, host stats, labels and draining flag — never the node id — so every
node in the same state under the same strategy gives the same answers. `Books.update` looks
that state (`state_key`) up in a memo and prices only a state no node has been in before; a
node's change re-prices nothing when it lands in a known state. The memo is bounded: past
`MEMO_LIMIT` states it is emptied (nodes keep their own answers), which changes only speed,
never an answer. An answer *object* (`book.answers[idx]`, fed to the `Auction`) is `answer`
itself, asked when first wanted and kept with the state.
Rule 2: ``loads[shape, node]`` holds the bid's load, +inf for a decline or no answer;
``codes[shape, node]`` the decline's reason code (its index in `REASONS`, -1 for none). A
node's change writes its column; nothing is sorted. The award rule ranks ``(load,
node_id)`` and index order is id order, so `Ranked` yields a row's bidders lowest load
first and, among equal loads, lowest index first — ``next(iter(ranked))`` is the award
rule's winner over all bids of the shape.
Rule 3: labels are checked before anything else and a node's labels never change, so a shape
asking for a label the node lacks gets the same missing-label decline in every state: it is
asked of `answer` once per (strategy, labels) and never priced again.
Rule 4: after labels, `shared.feasibility.check` declines a draining node, then the first of
cpu, memory, ports that does not fit, with a detail that names only the request. So a shape
that does not fit a state gets a decline fixed by (shape, which check failed): a new state
finds those shapes with the comparisons of `shortfall` (the same float arithmetic), and
`answer` confirms each (shape, failed check) the first time it occurs.
Rule 5: a shape that passes every check gets what `answer` gives it then: the strategy's
own `bid` on the view — its load, or its refusal as the decline. A strategy whose load
ignores the request (``depends_on_request`` false) is asked once for all of them.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

from gavel.shared.feasibility import NodeView, Refusal
from gavel.shared.messages import Bid, Decline, Request
from gavel.shared.reasons import Reason
from gavel.shared.strategies import Strategy, answer

__all__ = ["MEMO_LIMIT", "REASONS", "BidBook", "Books", "Ranked", "reason_code", "state_key"]

#: decline reasons by code; a reason outside `Reason` gets a new code when first seen
REASONS: list[str] = [r.value for r in Reason]
_CODES = {r: i for i, r in enumerate(REASONS)}

#: states the memo holds before it starts again (rule 1)
MEMO_LIMIT = 150_000

#: `shared.feasibility`'s cpu rounding allowance, which rule 4 must apply the same way
_EPS = 1e-9
# which check refused a shape (rule 4)
_DRAINING, _CPU, _MEMORY, _PORTS = range(4)
_REFUSED = {_DRAINING: Reason.DRAINING, _CPU: Reason.NO_ROOM_CPU,
            _MEMORY: Reason.NO_ROOM_MEMORY, _PORTS: Reason.NO_ROOM_PORTS}
_FAILED_CODE = [_CODES[_REFUSED[f]] for f in range(len(_REFUSED))]

Answer = Bid | Decline
StateKey = tuple[object, ...]
_Amounts = tuple[int, float, int, int]  # a shape's index, cpu, memory and ports


def reason_code(reason: str) -> int:
    code = _CODES.get(reason)
    if code is None:
        code = _CODES[reason] = len(REASONS)
        REASONS.append(reason)
    return code


def state_key(strategy: Strategy, view: NodeView) -> StateKey:
    """Everything `answer` may read: the strategy and the view without its node id."""
    cap, used, stats = view.capacity, view.committed, view.stats
    return (id(strategy), cap.cpu, cap.memory_mb, cap.ports, used.cpu, used.memory_mb,
            used.ports, stats.cpu_ratio, stats.memory_ratio, stats.cpu_count,
            stats.memory_total_mb, tuple(view.labels.items()), view.draining)


class _State:
    """One memoised state: each shape's load and decline code, and its answers on demand.

    ``answer(shape)`` is `shared.strategies.answer` itself, asked the first time the shape's
    answer object is wanted (a round's winner, a sampled reply), with the view of the first
    node seen in this state (rule 1: any node in it answers the same)."""

    __slots__ = ("_answers", "codes", "loads", "requests", "strategy", "view")

    def __init__(self, strategy: Strategy, view: NodeView, requests: Sequence[Request],
                 loads: npt.NDArray[np.float64], codes: npt.NDArray[np.int16]) -> None:
        self.strategy = strategy
        self.view = view
        self.requests = requests
        self.loads = loads
        self.codes = codes
        self._answers: dict[int, Answer] = {}

    def answer(self, shape: int) -> Answer:
        ans = self._answers.get(shape)
        if ans is None:
            ans = self._answers[shape] = answer(self.strategy, self.requests[shape], self.view)
        return ans


class Ranked:
    """One shape's bidders in award order, computed from its row of loads on demand.

    Iterating costs two `argmin` calls over parts of the row per bidder yielded: the
    best of a span of the row is its first minimum (lowest load, then lowest index), and
    once it is taken the next best is the best of the two spans either side of it."""

    __slots__ = ("row",)

    def __init__(self, row: npt.NDArray[np.float64]) -> None:
        self.row = row

    def __bool__(self) -> bool:
        return bool(self.row[self.row.argmin()] < math.inf)

    def __len__(self) -> int:
        return int(np.count_nonzero(self.row < math.inf))

    def _span(self, spans: list[tuple[float, int, int, int]], lo: int, hi: int) -> None:
        if lo < hi:
            best = lo + int(self.row[lo:hi].argmin())
            heapq.heappush(spans, (float(self.row[best]), best, lo, hi))

    def __iter__(self) -> Iterator[tuple[float, int]]:
        spans: list[tuple[float, int, int, int]] = []
        self._span(spans, 0, len(self.row))
        while spans:
            load, idx, lo, hi = heapq.heappop(spans)
            if load == math.inf:
                return
            yield load, idx
            self._span(spans, lo, idx)
            self._span(spans, idx + 1, hi)

    def __getitem__(self, k: int) -> tuple[float, int]:
        for pos, item in enumerate(self):
            if pos == k:
                return item
        raise IndexError(k)

    def bidders(self) -> npt.NDArray[np.intp]:
        """Every bidding node, in index order."""
        return np.flatnonzero(self.row < math.inf)


class _Answers:
    """``book.answers[idx]``: the node's current answer to this shape (None: no answer)."""

    __slots__ = ("shape", "states")

    def __init__(self, states: list[_State | None], shape: int) -> None:
        self.states = states
        self.shape = shape

    def __getitem__(self, idx: int) -> Answer | None:
        state = self.states[idx]
        return None if state is None else state.answer(self.shape)


class BidBook:
    """One request shape: its row of the order book."""

    __slots__ = ("answers", "codes", "ranked", "request")

    def __init__(self, request: Request, books: Books, shape: int) -> None:
        self.request = request
        self.ranked = Ranked(books.loads[shape])
        self.codes: npt.NDArray[np.int16] = books.codes[shape]
        self.answers = _Answers(books.states, shape)

    @property
    def declines(self) -> dict[str, int]:
        """How many nodes decline, per reason."""
        counts = np.bincount(self.codes[self.codes >= 0], minlength=len(REASONS))
        return {REASONS[c]: int(n) for c, n in enumerate(counts) if n}

    def decline_counts(self) -> dict[str, int]:
        return self.declines


class Books:
    """Every shape's row, kept current node by node (rules 1 and 2)."""

    def __init__(self, requests: Sequence[Request], size: int) -> None:
        self.requests = list(requests)
        self.loads: npt.NDArray[np.float64] = np.full((len(requests), size), math.inf)
        self.codes: npt.NDArray[np.int16] = np.full((len(requests), size), -1, dtype=np.int16)
        self.states: list[_State | None] = [None] * size
        self.memo: dict[StateKey, _State] = {}
        #: per (strategy, labels): the codes rule 3 fixes, and the shapes it leaves
        self._fixed: dict[tuple[object, ...], tuple[list[int], list[_Amounts]]] = {}
        #: (check, shape) pairs whose decline `answer` has confirmed (rule 4)
        self._vouched: set[tuple[int, int]] = set()
        self.books = [BidBook(r, self, k) for k, r in enumerate(self.requests)]
        #: states priced (memo misses) and node changes looked up, for the speed report
        self.priced = 0
        self.updates = 0

    def __getitem__(self, shape: int) -> BidBook:
        return self.books[shape]

    def update(self, idx: int, strategy: Strategy, view: NodeView | None) -> None:
        """Node `idx` is now in `view` (None: it cannot answer); write its column."""
        self.updates += 1
        if view is None:
            self.states[idx] = None
            self.loads[:, idx] = math.inf
            self.codes[:, idx] = -1
            return
        key = state_key(strategy, view)
        state = self.memo.get(key)
        if state is None:
            state = self._price(strategy, view)
            if len(self.memo) >= MEMO_LIMIT:
                self.memo.clear()
            self.memo[key] = state
        if self.states[idx] is state:
            return
        self.states[idx] = state
        self.loads[:, idx] = state.loads
        self.codes[:, idx] = state.codes

    def _price(self, strategy: Strategy, view: NodeView) -> _State:
        """Rules 3-5: the declines the checks make, then the strategy's own bids for the
        shapes that pass them. Plain lists: a few dozen shapes are too few for numpy."""
        self.priced += 1
        fixed, labelled = self._unlabelled(strategy, view)
        codes = fixed.copy()
        fits: list[int] = []
        vouched = self._vouched
        if view.draining:
            for k, _, _, _ in labelled:
                self._refuse(strategy, k, _DRAINING, view, codes)
        else:
            free = view.capacity - view.committed
            cpu, memory, ports = free.cpu + _EPS, free.memory_mb, free.ports
            for k, need_cpu, need_memory, need_ports in labelled:
                if need_cpu > cpu:  # the order and arithmetic of `shortfall`
                    failed = _CPU
                elif need_memory > memory:
                    failed = _MEMORY
                elif need_ports > ports:
                    failed = _PORTS
                else:
                    fits.append(k)
                    continue
                if (failed, k) in vouched:
                    codes[k] = _FAILED_CODE[failed]
                else:
                    self._refuse(strategy, k, failed, view, codes)
        loads = [math.inf] * len(codes)
        if fits:
            requests = self.requests
            if not strategy.depends_on_request:  # the load ignores the request: bid once
                once = strategy.bid(requests[fits[0]], view)
                if isinstance(once, Refusal):
                    refusal = reason_code(once.reason)
                    for k in fits:
                        codes[k] = refusal
                else:
                    for k in fits:
                        loads[k] = once
            else:
                for k in fits:
                    p = strategy.bid(requests[k], view)
                    if isinstance(p, Refusal):
                        codes[k] = reason_code(p.reason)
                    else:
                        loads[k] = p
        return _State(strategy, view, self.requests, np.array(loads, dtype=np.float64),
                      np.array(codes, dtype=np.int16))

    def _refuse(self, strategy: Strategy, k: int, failed: int, view: NodeView,
                codes: list[int]) -> None:
        """Rule 4, held to `answer`: the first time check `failed` refuses shape `k`, the
        real answer must be that decline (then it is for every state that fails it)."""
        if (failed, k) not in self._vouched:
            got = answer(strategy, self.requests[k], view)
            assert isinstance(got, Decline) and got.reason == _REFUSED[failed], got
            self._vouched.add((failed, k))
        codes[k] = _FAILED_CODE[failed]

    def _unlabelled(self, strategy: Strategy,
                    view: NodeView) -> tuple[list[int], list[_Amounts]]:
        """Rule 3: per shape, the missing-label code where the node lacks its labels (asked
        of `answer` once per strategy and labels), else -1; and the shapes left, with what
        each asks for."""
        key = (id(strategy), tuple(view.labels.items()))
        fixed = self._fixed.get(key)
        if fixed is None:
            codes = [-1] * len(self.requests)
            for k, request in enumerate(self.requests):
                if any(view.labels.get(name) != value for name, value in request.labels.items()):
                    ans = answer(strategy, request, view)
                    assert isinstance(ans, Decline) and ans.reason == Reason.MISSING_LABEL
                    codes[k] = reason_code(ans.reason)
            left = [(k, r.cpu, r.memory_mb, r.ports) for k, r in enumerate(self.requests)
                    if codes[k] < 0]
            fixed = self._fixed[key] = (codes, left)
        return fixed
