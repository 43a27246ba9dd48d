"""One auction, as a sans-IO state machine.

Rules:
1. The auction is fed replies and ``now``; it never reads a clock and never sends anything.
   `rfb()` is what to broadcast: the distinct shapes of its requests, asked once each.
2. It is complete when every eligible node has answered, or ``now`` reaches the deadline.
3. A reply counts once per node, only from an eligible node, only before the deadline, only
   for this auction, with one answer per shape at most; every other reply is rejected whole
   with a `Verdict` the shell counts. A node that answered but skipped a shape is silent
   for that shape. A decline's preempting offer (`shared.preemption`) counts only if it
   displaces work at least the gap below the shape's priority, each instance once, at a
   finite non-negative price; it is kept beside the decline for the award (rule 4).
4. `decide` closes the auction and awards its requests in order by the award rule, the one
   rule for a single request, a batch and a service's replicas (`shared.award`: lowest
   effective load that still fits, each award charged to the winner; a replica by the
   spread rule, told how many replicas of each group each node holds now and each node's
   labels). A group's requests share shapes only with their own group's.
5. A request with soft affinities (`shared.affinity`) shares shapes only with requests of
   the same affinities; its shape's bids are ranked at their loads adjusted by the
   affinities their nodes' labels match, so every part of the award rule (the walk, the
   heap, the spread) sees the adjusted load, and each bid says how much was added.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum

from gavel.shared.affinity import Affinity, adjustment
from gavel.shared.award import Awarded, Decision, NodeBid, NodeDecline, Round, Row, Unschedulable
from gavel.shared.messages import RFB, Bid, BidReply, Capacity, Decline, Request, Shape
from gavel.shared.preemption import Offer, displaceable
from gavel.shared.reasons import DECLINES
from gavel.shared.spread import Tally

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
    BAD_OFFER = "preempting offer that displaces work not far enough below the request's " \
        "priority, or at a price that is not a finite non-negative number"


_REASONS = frozenset(r.value for r in DECLINES)


class _ShapeBook:
    """Answers for one shape."""

    __slots__ = ("affinities", "bids", "declines", "offers", "shape", "steps")

    def __init__(self, shape: Shape, affinities: tuple[Affinity, ...] = ()) -> None:
        self.shape = shape
        self.affinities = affinities
        self.bids: dict[str, NodeBid] = {}
        self.steps: dict[str, float] = {}
        self.declines: list[NodeDecline] = []
        self.offers: list[Offer] = []


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
        if len(self.requests) == 1:  # one request, one shape: nothing to group
            only = self.requests[0]
            if only.group:
                self.groups.add(only.group)
            self._shape_of.append(0)
            self._books.append(_ShapeBook(only.shape(), only.affinities))
            return
        if len({r.instance_id for r in self.requests}) != len(self.requests):
            raise ValueError(f"auction {auction_id} lists an instance twice")
        index: dict[object, int] = {}
        for r in self.requests:
            if r.group:  # a group's requests share shapes with their own group's only
                self.groups.add(r.group)
                s = index.setdefault((r.key(), r.group, r.affinities), len(index))
            elif r.affinities:  # rule 5
                s = index.setdefault((r.key(), r.affinities), len(index))
            else:
                s = index.setdefault(r.key(), len(index))
            if s == len(self._books):
                self._books.append(_ShapeBook(r.shape(), r.affinities))
            self._shape_of.append(s)

    @property
    def shapes(self) -> list[Shape]:
        return [b.shape for b in self._books]

    @property
    def affine(self) -> bool:
        """Whether a request has soft affinities: its round needs the nodes' labels."""
        return any(b.affinities for b in self._books)

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
            elif ans.evict and not self._fair(ans):
                return Verdict.BAD_OFFER
        for ans in reply.answers:
            book = self._books[ans.shape]
            if isinstance(ans, Bid):
                book.bids[node] = NodeBid(node_id=node, load=ans.load, strategy=ans.strategy)
                book.steps[node] = ans.step
            else:
                book.declines.append(NodeDecline(node_id=node, reason=ans.reason,
                                                 detail=ans.detail))
                if ans.evict:
                    book.offers.append(Offer(node_id=node, load=ans.evict_load,
                                             victims=tuple(ans.evict)))
        self._answered.add(node)
        return Verdict.ACCEPTED

    def _fair(self, ans: Decline) -> bool:
        """A preempting offer displaces only work `GAP` below the shape's priority, once
        each, at a finite non-negative price (`shared.preemption` rule 1)."""
        priority = self._books[ans.shape].shape.priority
        ids = {v.instance_id for v in ans.evict}
        return math.isfinite(ans.evict_load) and ans.evict_load >= 0.0 \
            and len(ids) == len(ans.evict) \
            and all(displaceable(priority, v.priority) for v in ans.evict)

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
        """Close the auction and award every request in order by the award rule (rule 4).
        `held`: group -> node -> replicas the node holds now; `labels`: each node's labels
        (both for replicas)."""
        self.closed_at = now
        award = self._round(free or {}, held or {}, labels or {}).award
        last = len(self.requests) - 1
        if not last:  # one request (the common case): nothing to loop over
            return [award(self.requests[0], 0, last=True)]
        return [award(r, s, last=k == last)
                for k, (r, s) in enumerate(zip(self.requests, self._shape_of, strict=True))]

    def _round(self, free: Mapping[str, Capacity], held: Mapping[str, Mapping[str, int]],
               labels: Mapping[str, Mapping[str, str]]) -> Round:
        rows = [Row(_adjusted(b.bids, b.affinities, labels) if b.affinities else b.bids,
                    b.steps, b.declines, self._silent(b), b.offers) for b in self._books]
        return Round(rows, free, len(self.eligible), Tally(held, labels) if self.groups
                     else None)

    def _silent(self, book: _ShapeBook) -> list[str]:
        """The eligible nodes that said nothing of the shape, sorted (rule 3)."""
        spoke = book.bids.keys() | {d.node_id for d in book.declines}
        return sorted(self.eligible - spoke) if len(spoke) < len(self.eligible) else []


def _adjusted(bids: Mapping[str, NodeBid], affinities: tuple[Affinity, ...],
              labels: Mapping[str, Mapping[str, str]]) -> dict[str, NodeBid]:
    """Rule 5: each bid at its load plus what its node's labels match of the affinities."""
    out: dict[str, NodeBid] = {}
    for node, bid in bids.items():
        adj = adjustment(affinities, labels.get(node, {}))
        out[node] = NodeBid(node_id=node, load=bid.load + adj, strategy=bid.strategy,
                            affinity=adj) if adj else bid
    return out


def group_shapes(requests: list[Request]) -> tuple[list[Shape], list[int]]:
    """The distinct shapes of `requests` (first seen first) and how many ask for each."""
    if not requests:
        return [], []
    first = requests[0]
    if all(r.cpu == first.cpu and r.memory_mb == first.memory_mb and r.ports == first.ports
           and r.labels == first.labels and r.priority == first.priority
           for r in requests):  # the common batch: one shape
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
