"""One auction, as a sans-IO state machine.

Rules:
1. The auction is fed replies and ``now``; it never reads a clock and never sends anything.
   `rfb()` is what to broadcast: the distinct shapes of its requests, asked once each.
2. It is complete when every eligible node has answered, or ``now`` reaches the deadline.
3. A reply counts once per node, only from an eligible node, only before the deadline, only
   for this auction, with one answer per shape at most; every other reply is rejected whole
   with a `Verdict` the shell counts. A node that answered but skipped a shape is silent
   for that shape.
4. `decide` awards each request in order to the lowest ``(effective load, node_id)`` among
   the bids for its shape that still fit. A node's effective load is its bid plus its
   `step` for every instance it already won in this batch, and every award is charged
   against the winner's free capacity — so a batch decides as a sequence of single
   auctions would (exactly so for strategies linear in what a node holds), and never
   over-commits a node.
5. A service's replica (a request with a `group`) is awarded by the spread rule instead
   (`shared.spread`): told how many replicas of each group each node holds now and each
   node's labels, `decide` counts its own awards as it goes. Its requests share shapes only
   with their own group's, and a batch without replicas is decided exactly as rule 4 says.
6. An auction of one request that is not a replica is decided by one walk down its bids in
   award order — rule 4's award, tie and declines without building its heaps (one request
   per round is the common case at low load, and every round of the simulator's fast path).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum

import msgspec

from gavel.shared.award import NodeBid, NodeDecline, order
from gavel.shared.feasibility import shortfall
from gavel.shared.messages import RFB, Bid, BidReply, Capacity, Request, Shape
from gavel.shared.reasons import DECLINES, Reason, render, summarize_declines
from gavel.shared.spread import Rank, Tally, rank

__all__ = ["Auction", "Awarded", "Decision", "Unschedulable", "Verdict", "group_shapes"]


class Verdict(StrEnum):
    ACCEPTED = "accepted"
    LATE = "late bid"
    WRONG_AUCTION = "bid for an unknown auction"
    NOT_ELIGIBLE = "bid from a node that was not asked"
    DUPLICATE = "duplicate bid"
    BAD_LOAD = "bid load is not a finite non-negative number"
    UNKNOWN_REQUEST = "answer for a shape not in the auction"
    BAD_REASON = "decline with a reason outside the fixed set"


class Awarded(msgspec.Struct, frozen=True, kw_only=True):
    request: Request
    winner: NodeBid  # load is the effective load the winner won at
    tie_broken: bool
    bids: Sequence[NodeBid]  # every bid for the request's shape, as received, best first
    declines: Sequence[NodeDecline]
    silent: Sequence[str]


class Unschedulable(msgspec.Struct, frozen=True, kw_only=True):
    request: Request
    reason: Reason
    summary: str
    bids: Sequence[NodeBid]
    declines: Sequence[NodeDecline]
    silent: Sequence[str]


Decision = Awarded | Unschedulable

_NO_ANSWER = "no answer before the deadline"
_REASONS = frozenset(r.value for r in DECLINES)


class _ShapeBook:
    """Answers for one shape."""

    __slots__ = ("bids", "declines", "shape", "steps")

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.bids: dict[str, NodeBid] = {}
        self.steps: dict[str, float] = {}
        self.declines: list[NodeDecline] = []


class Auction:
    def __init__(
        self,
        auction_id: str,
        requests: Sequence[Request],
        eligible: Iterable[str],
        opened_at: float,
        deadline_s: float,
    ) -> None:
        self.auction_id = auction_id
        self.requests = list(requests)
        self.eligible = frozenset(eligible)
        self.opened_at = opened_at
        self.deadline = opened_at + deadline_s
        self.deadline_s = deadline_s
        self._shape_of: list[int] = []
        self._books: list[_ShapeBook] = []
        #: The groups whose replicas this auction places (rule 5).
        self.groups: set[str] = set()
        self._answered: set[str] = set()
        self.closed_at: float | None = None
        if len(self.requests) == 1:  # one request, one shape: nothing to group (rule 6)
            only = self.requests[0]
            if only.group:
                self.groups.add(only.group)
            self._shape_of.append(0)
            self._books.append(_ShapeBook(only.shape()))
            return
        if len({r.instance_id for r in self.requests}) != len(self.requests):
            raise ValueError(f"auction {auction_id} lists an instance twice")
        index: dict[object, int] = {}
        for r in self.requests:
            if r.group:  # a group's requests share shapes with their own group's only
                self.groups.add(r.group)
                s = index.setdefault((r.key(), r.group), len(index))
            else:
                s = index.setdefault(r.key(), len(index))
            if s == len(self._books):
                self._books.append(_ShapeBook(r.shape()))
            self._shape_of.append(s)

    @property
    def shapes(self) -> list[Shape]:
        return [b.shape for b in self._books]

    @property
    def shape_of(self) -> list[int]:
        """Each request's shape index, in request order."""
        return self._shape_of

    def rfb(self) -> RFB:
        counts = Counter(self._shape_of)
        return RFB(auction_id=self.auction_id, shapes=self.shapes,
                   deadline_s=self.deadline_s, counts=[counts[i] for i in range(len(counts))])

    # -- input ---------------------------------------------------------------------------
    def receive(self, reply: BidReply, now: float) -> Verdict:
        if reply.auction_id != self.auction_id:
            return Verdict.WRONG_AUCTION
        if self.closed_at is not None or now >= self.deadline:
            return Verdict.LATE
        node = reply.node_id
        if node not in self.eligible:
            return Verdict.NOT_ELIGIBLE
        if node in self._answered:
            return Verdict.DUPLICATE
        n = len(self._books)
        seen: set[int] = set()
        for ans in reply.answers:
            i = ans.shape
            if not 0 <= i < n:
                return Verdict.UNKNOWN_REQUEST
            if i in seen:
                return Verdict.DUPLICATE
            seen.add(i)
            if isinstance(ans, Bid):
                if not (math.isfinite(ans.load) and ans.load >= 0.0) or math.isnan(ans.step) \
                        or ans.step == -math.inf:
                    return Verdict.BAD_LOAD
            elif ans.reason not in _REASONS:
                return Verdict.BAD_REASON
        for ans in reply.answers:
            book = self._books[ans.shape]
            if isinstance(ans, Bid):
                book.bids[node] = NodeBid(node_id=node, load=ans.load, strategy=ans.strategy)
                book.steps[node] = ans.step
            else:
                book.declines.append(NodeDecline(node_id=node, reason=ans.reason,
                                                 detail=ans.detail))
        self._answered.add(node)
        return Verdict.ACCEPTED

    # -- timers --------------------------------------------------------------------------
    def done(self, now: float) -> bool:
        # `receive` admits only eligible nodes, once each: counting is enough (a set
        # comparison is O(nodes) per reply - quadratic over a broadcast round).
        return self.closed_at is not None or now >= self.deadline or (
            len(self._answered) == len(self.eligible)
        )

    def timer(self) -> float:
        """When the shell must call `done` again at the latest."""
        return self.deadline

    @property
    def answered(self) -> frozenset[str]:
        return frozenset(self._answered)

    def bid_counts(self) -> dict[str, int]:
        """Bids received per strategy (for metrics)."""
        out: Counter[str] = Counter()
        for book in self._books:
            out.update(b.strategy for b in book.bids.values())
        return dict(out)

    def decline_counts(self) -> dict[str, int]:
        """Declines received per reason (for metrics)."""
        out: Counter[str] = Counter()
        for book in self._books:
            out.update(d.reason for d in book.declines)
        return dict(out)

    # -- output --------------------------------------------------------------------------
    def decide(self, now: float, free: Mapping[str, Capacity] | None = None, *,
               held: Mapping[str, Mapping[str, int]] | None = None,
               labels: Mapping[str, Mapping[str, str]] | None = None) -> list[Decision]:
        """Close the auction and award every request (rules 4 and 5). `held`: group -> node
        -> replicas the node holds now; `labels`: each node's labels (both for replicas)."""
        self.closed_at = now
        if len(self.requests) == 1 and not self.groups:
            return [self._single(free or {})]
        return self._batch(free or {}, held or {}, labels or {})

    def _batch(self, free: Mapping[str, Capacity], held: Mapping[str, Mapping[str, int]],
               labels: Mapping[str, Mapping[str, str]]) -> list[Decision]:
        """Rules 4 and 5 over any batch."""
        remaining = {n: c.copy() for n, c in free.items()}
        extra: dict[str, float] = {}
        version: dict[str, int] = {}
        heaps: list[list[tuple[float, str, int]]] = []
        # Per shape: node -> version of its one live heap entry (absent: out of the running).
        live: list[dict[str, int]] = []
        ranked: list[list[NodeBid]] = []
        declines: list[tuple[NodeDecline, ...]] = []
        silent: list[list[str]] = []
        for book in self._books:
            heap = [(b.load, n, 0) for n, b in book.bids.items()]
            heapq.heapify(heap)
            heaps.append(heap)
            live.append(dict.fromkeys(book.bids, 0))
            ranked.append(sorted(book.bids.values(), key=order))
            declines.append(tuple(sorted(book.declines, key=lambda d: d.node_id)))
            silent.append(self._silent(book))
        decisions: list[Decision] = []
        tally = Tally(held, labels) if self.groups else None
        for request, s in zip(self.requests, self._shape_of, strict=True):
            if tally is not None and request.group:
                decisions.append(self._replica(request, s, tally, remaining, extra, version,
                                               live, heaps, ranked, declines, silent))
                continue
            book, heap = self._books[s], heaps[s]
            winner = self._top(heap, book, extra, version, live[s], remaining, declines, s,
                               request)
            if winner is None:
                decisions.append(self._unschedulable(request, ranked[s], declines[s],
                                                     silent[s]))
                continue
            load, node = winner
            entry = heapq.heappop(heap)
            nxt = self._top(heap, book, extra, version, live[s], remaining, declines, s,
                            request)
            tied = nxt is not None and nxt[0] == load
            heapq.heappush(heap, entry)
            room = remaining.get(node)
            if room is not None:
                room.charge(request, -1)
            step = book.steps[node]
            extra[node] = extra.get(node, 0.0) + step
            version[node] = ver = version.get(node, 0) + 1
            if step < 0.0:
                self._rekey(node, ver, live, heaps, extra)
            won = NodeBid(node_id=node, load=load, strategy=book.bids[node].strategy)
            decisions.append(Awarded(request=request, winner=won, tie_broken=tied,
                                     bids=ranked[s], declines=declines[s], silent=silent[s]))
        return decisions

    def _single(self, free: Mapping[str, Capacity]) -> Decision:
        """Rule 6: the first two bids in award order that fit (and are finite) are the
        winner and the bid that could tie it; the ones passed over for want of room join
        the declines, as `_top` adds them."""
        request, book = self.requests[0], self._books[0]
        ranked = sorted(book.bids.values(), key=order)
        found: list[NodeBid] = []
        short_of: list[NodeDecline] = []
        for bid in ranked:
            room = free.get(bid.node_id)
            short = shortfall(request, room) if room is not None else None
            if short is not None:
                short_of.append(NodeDecline(node_id=bid.node_id, reason=short.reason,
                                            detail=short.detail))
            elif math.isfinite(bid.load):
                found.append(bid)
                if len(found) == 2:
                    break
        declines = tuple(sorted((*book.declines, *short_of), key=lambda d: d.node_id))
        silent = self._silent(book)
        if not found:
            return self._unschedulable(request, ranked, declines, silent)
        won = found[0]
        tied = len(found) == 2 and found[1].load == won.load
        return Awarded(request=request, winner=won, tie_broken=tied, bids=ranked,
                       declines=declines, silent=silent)

    def _silent(self, book: _ShapeBook) -> list[str]:
        """The eligible nodes that said nothing of the shape, sorted (rule 3)."""
        spoke = book.bids.keys() | {d.node_id for d in book.declines}
        return sorted(self.eligible - spoke) if len(spoke) < len(self.eligible) else []

    def _rekey(self, node: str, ver: int, live: list[dict[str, int]],
               heaps: list[list[tuple[float, str, int]]], extra: dict[str, float]) -> None:
        """The node's load fell: a stale entry would sit too deep for the lazy refresh to
        reach, so re-key the node now in every shape it still competes in."""
        for t, alive in enumerate(live):
            if node in alive:
                alive[node] = ver
                fresh = self._books[t].bids[node].load + extra[node]
                heapq.heappush(heaps[t], (fresh, node, ver))

    def _replica(self, request: Request, s: int, tally: Tally,
                 remaining: dict[str, Capacity], extra: dict[str, float],
                 version: dict[str, int], live: list[dict[str, int]],
                 heaps: list[list[tuple[float, str, int]]], ranked: list[list[NodeBid]],
                 declines: list[tuple[NodeDecline, ...]], silent: list[list[str]]) -> Decision:
        """Award one replica by the spread rule (rule 5, `shared.spread`): a scan of its
        shape's bidders still in the running, those out of room leaving it as in `_top`."""
        book, alive = self._books[s], live[s]
        best: Rank | None = None
        second: Rank | None = None
        for node in list(alive):
            room = remaining.get(node)
            short = shortfall(request, room) if room is not None else None
            if short is not None:
                del alive[node]
                declines[s] = tuple(sorted(
                    (*declines[s], NodeDecline(node_id=node, reason=short.reason,
                                               detail=short.detail)),
                    key=lambda d: d.node_id))
                continue
            load = book.bids[node].load + extra.get(node, 0.0)
            if not math.isfinite(load):  # the strategy refuses another one
                continue
            key = rank(request, node, load, tally)
            if best is None or key < best:
                best, second = key, best
            elif second is None or key < second:
                second = key
        if best is None:
            return self._unschedulable(request, ranked[s], declines[s], silent[s])
        label = request.spread
        if label and not request.spread_soft:
            values = self._spread_values(s, label, tally)
            floor = tally.floor(request.group, label, values)
            if floor is None or best[0] > floor:
                return self._unspread(request, tally, values, ranked[s], declines[s],
                                      silent[s])
        _, _, load, node = best
        room = remaining.get(node)
        if room is not None:
            room.charge(request, -1)
        step = book.steps[node]
        extra[node] = extra.get(node, 0.0) + step
        version[node] = ver = version.get(node, 0) + 1
        if step < 0.0:
            self._rekey(node, ver, live, heaps, extra)
        tally.add(request.group, node)
        won = NodeBid(node_id=node, load=load, strategy=book.bids[node].strategy)
        tied = second is not None and second[:3] == best[:3]
        return Awarded(request=request, winner=won, tie_broken=tied, bids=ranked[s],
                       declines=declines[s], silent=silent[s])

    def _spread_values(self, s: int, label: str, tally: Tally) -> set[str]:
        """The label's values among the nodes that could take shape `s` (`shared.spread`
        rule 3): its bidders, and the nodes that declined it for want of room."""
        book = self._books[s]
        nodes = [*book.bids, *(d.node_id for d in book.declines if d.reason in _CAPACITY)]
        return {v for n in nodes if (v := tally.label(n, label)) is not None}

    def _unspread(self, request: Request, tally: Tally, values: set[str],
                  bids: Sequence[NodeBid], declines: Sequence[NodeDecline],
                  silent: Sequence[str]) -> Unschedulable:
        """A hard spread no fitting bidder keeps: the replica waits, the label named with
        how many replicas each of its values holds."""
        label = request.spread
        rendered = [render(d.reason, d.detail) for d in declines] + [_NO_ANSWER] * len(silent)
        head = summarize_declines(len(self.eligible), len(bids), rendered)
        counts = ", ".join(f"{v} {tally.in_value(request.group, label, v)}"
                           for v in sorted(values)) or "no node has it"
        return Unschedulable(request=request, reason=Reason.SPREAD,
                             summary=f"{head}; {Reason.SPREAD} ({label}: {counts})",
                             bids=bids, declines=declines, silent=silent)

    @staticmethod
    def _top(heap: list[tuple[float, str, int]], book: _ShapeBook, extra: dict[str, float],
             version: dict[str, int], live: dict[str, int], remaining: dict[str, Capacity],
             declines: list[tuple[NodeDecline, ...]], s: int,
             request: Request) -> tuple[float, str] | None:
        """The best fresh, fitting entry (left on top of the heap), or None.

        A stale entry's key never exceeds the node's effective load (steps that lower it
        re-key at once), so refreshing entries as they surface finds the true minimum."""
        while heap:
            load, node, ver = heap[0]
            if live.get(node) != ver:  # superseded by a re-keyed entry, or out of the running
                heapq.heappop(heap)
                continue
            current = version.get(node, 0)
            if ver != current:
                fresh = book.bids[node].load + extra.get(node, 0.0)
                live[node] = current
                heapq.heapreplace(heap, (fresh, node, current))
                continue
            room = remaining.get(node)
            short = shortfall(request, room) if room is not None else None
            if short is None and math.isfinite(load):  # inf: "only one"; -inf: steps overflowed
                return load, node
            heapq.heappop(heap)
            del live[node]
            if short is not None:
                declines[s] = tuple(sorted(
                    (*declines[s], NodeDecline(node_id=node, reason=short.reason,
                                               detail=short.detail)),
                    key=lambda d: d.node_id))
        return None

    def _unschedulable(self, request: Request, bids: Sequence[NodeBid],
                       declines: Sequence[NodeDecline], silent: Sequence[str]) -> Unschedulable:
        total = len(self.eligible)
        rendered = [render(d.reason, d.detail) for d in declines] + [_NO_ANSWER] * len(silent)
        if total == 0:
            reason, summary = Reason.NO_NODES, f"0/0 nodes bid: {Reason.NO_NODES}"
        else:
            reason, summary = _main_reason(declines), summarize_declines(total, 0, rendered)
        return Unschedulable(request=request, reason=reason, summary=summary, bids=bids,
                             declines=declines, silent=silent)


_CAPACITY = frozenset(
    {Reason.NO_ROOM_CPU, Reason.NO_ROOM_MEMORY, Reason.NO_ROOM_PORTS, Reason.OVER_CEILING}
)


def _main_reason(declines: Sequence[NodeDecline]) -> Reason:
    """One reason for the whole round: the shared one, "all full", or the most common."""
    if not declines:
        return Reason.NO_BIDS
    kinds = Counter(Reason(d.reason) for d in declines)
    if len(kinds) == 1:
        return next(iter(kinds))
    if set(kinds) <= _CAPACITY:
        return Reason.ALL_FULL
    return min(kinds, key=lambda k: (-kinds[k], k.value))


def group_shapes(requests: list[Request]) -> tuple[list[Shape], list[int]]:
    """The distinct shapes of `requests` (first seen first) and how many ask for each."""
    if not requests:
        return [], []
    first = requests[0]
    if all(r.cpu == first.cpu and r.memory_mb == first.memory_mb and r.ports == first.ports
           and r.labels == first.labels for r in requests):  # the common batch: one shape
        return [first], [len(requests)]
    index: dict[object, int] = {}
    shapes: list[Shape] = []
    counts: list[int] = []
    for r in requests:
        i = index.setdefault(r.key(), len(shapes))
        if i == len(shapes):
            shapes.append(r)
            counts.append(0)
        counts[i] += 1
    return shapes, counts
