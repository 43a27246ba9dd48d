"""The award rule: lowest load wins, ties broken by node id — one rule for a single request,
a batch and a service's replicas.

Rules:
1. The ranking key is `order`, ``(load, node_id)``: total, deterministic, independent of the
   order bids arrived in. Loads that are not finite non-negative numbers never reach here
   (the auction rejects them on receipt).
2. A `Round` awards requests one after another (`Round.award`), each to the lowest
   ``(effective load, node_id)`` among its shape's bids that still fit. A node's effective
   load is its bid plus its `step` for every instance it already won in the round, and
   every award is charged against the winner's free capacity, so a batch decides as a
   sequence of single auctions would (exactly so for strategies linear in what a node
   holds) and never over-commits a node. A bid passed over for want of room leaves its
   shape's running and joins the shape's declines with the reason the node would have
   given; a bid whose effective load is not finite (the strategy takes only one) leaves
   the running without a decline.
3. The winner is tied when the next bid that would win in its place has the same
   effective load (for a replica: the same rank but for the node id).
4. A service's replica (a request with a `group`, in a round given a `Tally`) is awarded by
   the spread rule instead (`shared.spread`), over its shape's bidders still in the
   running; the round counts its own awards into the tally as it goes.
5. The order of a shape's bidders is found as cheaply as the round allows, never
   differently: until the round's first award every effective load is the bid itself, so
   a request walks its shape's bids sorted once (one request — the common case, and every
   round of the simulator — costs one sort and a walk to its second fitting bid); after
   it, a shape keeps a heap of ``(effective load, node_id, version)`` entries, built when
   first needed, whose stale entries are refreshed as they surface.
6. A capacity is copied only when the round charges it: the caller's `free` is never
   written. The round's last award charges nothing: no award follows it to see the charge.
7. Only when no bid fits does a request take a preempting offer (`shared.preemption`): the
   lowest by `offer_key` whose node has not displaced for another request of the round and
   whose room, once its victims are gone, fits the request. The award names the victims
   (`Awarded.displaced`); its room is charged as the room freed less the request.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Mapping, Sequence

import msgspec

from gavel.shared.feasibility import Refusal, shortfall
from gavel.shared.messages import Capacity, Request, Victim
from gavel.shared.preemption import Offer, freed, offer_key
from gavel.shared.reasons import Reason, render, summarize_declines
from gavel.shared.spread import Rank, Tally, rank

__all__ = ["Awarded", "Decision", "NodeBid", "NodeDecline", "Round", "Row", "Unschedulable",
           "order"]


class NodeBid(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A node's bid as the award ranks it. Encoded without its defaults: every commit's
    trailer carries every bid, and a bid no affinity moved reads as it always did."""

    node_id: str
    load: float
    strategy: str = ""
    #: What the request's soft affinities added to the node's own bid (`shared.affinity`):
    #: `load` is the bid plus this, the load the award ranks.
    affinity: float = 0.0


class NodeDecline(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    reason: str
    detail: str = ""


def order(bid: NodeBid) -> tuple[float, str]:
    """The award rule's key: the lower wins."""
    return bid.load, bid.node_id


class Awarded(msgspec.Struct, frozen=True, kw_only=True):
    request: Request
    winner: NodeBid  # load is the effective load the winner won at
    tie_broken: bool
    bids: Sequence[NodeBid]  # every bid for the request's shape, as received, best first
    declines: Sequence[NodeDecline]
    silent: Sequence[str]
    #: The instances the winner stops to make room (rule 7); empty for an ordinary award.
    displaced: Sequence[Victim] = ()
    #: Every preempting offer for the shape, best first, when the award displaced.
    offers: Sequence[Offer] = ()


class Unschedulable(msgspec.Struct, frozen=True, kw_only=True):
    request: Request
    reason: Reason
    summary: str
    bids: Sequence[NodeBid]
    declines: Sequence[NodeDecline]
    silent: Sequence[str]


Decision = Awarded | Unschedulable

_NO_ANSWER = "no answer before the deadline"
_CAPACITY = frozenset(
    {Reason.NO_ROOM_CPU, Reason.NO_ROOM_MEMORY, Reason.NO_ROOM_PORTS, Reason.OVER_CEILING}
)
_Entry = tuple[float, str, int]  # (effective load, node, version)


def _by_node(d: NodeDecline) -> str:
    return d.node_id


class Row:
    """One shape's answers during a round: its bids ranked, its declines so far (those sent,
    then those passed over for room, sorted by node), its silent nodes, and the bidders still
    in the running (node -> version of its heap entry)."""

    __slots__ = ("bids", "declines", "heap", "live", "offers", "ranked", "sent", "silent",
                 "steps")

    def __init__(self, bids: Mapping[str, NodeBid], steps: Mapping[str, float],
                 sent: Sequence[NodeDecline], silent: Sequence[str],
                 offers: Sequence[Offer] = ()) -> None:
        self.offers = sorted(offers, key=offer_key) if offers else ()
        self.bids = bids
        self.steps = steps
        self.sent = sent
        self.ranked = sorted(bids.values(), key=order)
        self.declines: tuple[NodeDecline, ...] = tuple(sorted(sent, key=_by_node)) if sent \
            else ()
        self.silent = silent
        self.live: dict[str, int] = dict.fromkeys(bids, 0)
        self.heap: list[_Entry] | None = None

    def drop(self, node: str, short: Refusal) -> None:
        """Take `node` out of the running for want of room, as the decline it would have sent
        (rule 2)."""
        del self.live[node]
        self.declines = tuple(sorted(
            (*self.declines, NodeDecline(node_id=node, reason=short.reason, detail=short.detail)),
            key=_by_node))


class Round:
    """One `decide`: the rows of an auction's shapes, what the round has charged, and the
    spread tally when it places replicas."""

    __slots__ = ("charged", "displacing", "eligible", "extra", "free", "rows", "tally",
                 "version")

    def __init__(self, rows: Sequence[Row], free: Mapping[str, Capacity], eligible: int,
                 tally: Tally | None = None) -> None:
        self.rows = rows
        self.free = free
        self.eligible = eligible
        self.tally = tally
        self.charged: dict[str, Capacity] = {}  # rule 6
        self.extra: dict[str, float] = {}  # node -> the steps of what it won (rule 2)
        self.version: dict[str, int] = {}  # node -> awards it won, to tell stale heap entries
        self.displacing: set[str] = set()  # nodes that displace for a request (rule 7)

    def room(self, node: str) -> Capacity | None:
        room = self.charged.get(node)
        return self.free.get(node) if room is None else room

    def award(self, request: Request, s: int, *, last: bool = False) -> Decision:
        """Award `request`, of shape `s`, by rule 2 (rule 4 for a replica). The round's
        `last` award is not charged: nothing follows it that the charge could change."""
        row = self.rows[s]
        if self.tally is not None and request.group:
            return self._replica(request, row, self.tally, last)
        if self.extra:
            winner, tied = self._by_heap(request, row)
        else:
            winner, tied = self._by_walk(request, row)
        if winner is None:
            return self._displace(request, row, last) or self._unschedulable(request, row)
        if not last:
            self._charge(request, row, winner.node_id)
        return Awarded(request=request, winner=winner, tie_broken=tied, bids=row.ranked,
                       declines=row.declines, silent=row.silent)

    def _by_walk(self, request: Request, row: Row) -> tuple[NodeBid | None, bool]:
        """Rule 5 before the first award: the first two fitting bids in award order."""
        live, free = row.live, self.free  # nothing is charged before the first award
        winner: NodeBid | None = None
        for bid in row.ranked:
            node = bid.node_id
            if node not in live:
                continue
            room = free.get(node)
            if room is not None and (short := shortfall(request, room)) is not None:
                row.drop(node, short)
                continue
            if not math.isfinite(bid.load):
                del live[node]
            elif winner is None:
                winner = bid
            else:
                return winner, bid.load == winner.load
        return winner, False

    def _by_heap(self, request: Request, row: Row) -> tuple[NodeBid | None, bool]:
        """Rule 5 after the first award: the heap's best fitting entry, and the next."""
        heap = row.heap
        if heap is None:
            live, version, extra, bids = row.live, self.version, self.extra, row.bids
            for node in live:
                live[node] = version.get(node, 0)
            heap = row.heap = [(bids[n].load + extra.get(n, 0.0), n, v) for n, v in live.items()]
            heapq.heapify(heap)
        best = self._top(request, row, heap)
        if best is None:
            return None, False
        entry = heapq.heappop(heap)
        nxt = self._top(request, row, heap)
        heapq.heappush(heap, entry)
        load, node = best
        winner = NodeBid(node_id=node, load=load, strategy=row.bids[node].strategy,
                         affinity=row.bids[node].affinity)
        return winner, nxt is not None and nxt[0] == load

    def _load(self, row: Row, node: str) -> float:
        return row.bids[node].load + self.extra.get(node, 0.0)

    def _top(self, request: Request, row: Row, heap: list[_Entry]) -> tuple[float, str] | None:
        """The best fresh, fitting entry (left on top of the heap), or None.

        A stale entry's key never exceeds the node's effective load (steps that lower it
        re-key at once, `_charge`), so refreshing entries as they surface finds the true
        minimum."""
        live = row.live
        while heap:
            load, node, ver = heap[0]
            if live.get(node) != ver:  # superseded by a re-keyed entry, or out of the running
                heapq.heappop(heap)
                continue
            current = self.version.get(node, 0)
            if ver != current:
                live[node] = current
                heapq.heapreplace(heap, (self._load(row, node), node, current))
                continue
            room = self.room(node)
            short = shortfall(request, room) if room is not None else None
            if short is not None:
                heapq.heappop(heap)
                row.drop(node, short)
            elif math.isfinite(load):  # inf: "only one"; -inf: steps overflowed
                return load, node
            else:
                heapq.heappop(heap)
                del live[node]
        return None

    def _charge(self, request: Request, row: Row, node: str) -> None:
        """The award's cost: the winner's room, its effective load, its heap entries."""
        room = self.charged.get(node)
        if room is None and (src := self.free.get(node)) is not None:
            room = self.charged[node] = src.copy()
        if room is not None:
            room.charge(request, -1)
        step = row.steps[node]
        self.extra[node] = self.extra.get(node, 0.0) + step
        self.version[node] = ver = self.version.get(node, 0) + 1
        if step < 0.0:  # the load fell: a stale entry would sit too deep to surface in time
            for other in self.rows:
                if other.heap is not None and node in other.live:
                    other.live[node] = ver
                    heapq.heappush(other.heap, (self._load(other, node), node, ver))

    def _replica(self, request: Request, row: Row, tally: Tally, last: bool) -> Decision:
        """Rule 4: a scan of the shape's bidders still in the running."""
        best: Rank | None = None
        second: Rank | None = None
        charged, free, extra, bids = self.charged, self.free, self.extra, row.bids
        for node in list(row.live):
            room = charged.get(node) or free.get(node)
            if room is not None and (short := shortfall(request, room)) is not None:
                row.drop(node, short)
                continue
            load = bids[node].load + extra.get(node, 0.0)
            if not math.isfinite(load):  # the strategy refuses another one
                continue
            key = rank(request, node, load, tally)
            if best is None or key < best:
                best, second = key, best
            elif second is None or key < second:
                second = key
        if best is None:
            displacing = self._displace(request, row, last)
            if displacing is not None and not last:
                tally.add(request.group, displacing.winner.node_id)
            return displacing or self._unschedulable(request, row)
        label = request.spread
        if label and not request.spread_soft:
            values = _spread_values(row, label, tally)
            floor = tally.floor(request.group, label, values)
            if floor is None or best[0] > floor:
                return self._unspread(request, row, tally, values)
        _, _, load, node = best
        if not last:
            self._charge(request, row, node)
            tally.add(request.group, node)
        won = NodeBid(node_id=node, load=load, strategy=row.bids[node].strategy,
                      affinity=row.bids[node].affinity)
        tied = second is not None and second[:3] == best[:3]
        return Awarded(request=request, winner=won, tie_broken=tied, bids=row.ranked,
                       declines=row.declines, silent=row.silent)

    def _displace(self, request: Request, row: Row, last: bool) -> Awarded | None:
        """Rule 7: the best preempting offer that still makes room, or None."""
        if not row.offers:
            return None
        best: Offer | None = None
        tied = False
        for offer in row.offers:
            node = offer.node_id
            if node in self.displacing:
                continue
            room = self.room(node)
            if room is not None and shortfall(request, freed(room, offer.victims)) is not None:
                continue
            if best is not None:
                tied = offer_key(offer)[:3] == offer_key(best)[:3]
                break
            best = offer
        if best is None:
            return None
        node = best.node_id
        self.displacing.add(node)
        if not last:
            room = self.room(node)
            if room is not None:  # never more room than before: the victims are gone only
                after = freed(room, best.victims)  # if this award's commit lands
                after.charge(request, -1)
                self.charged[node] = Capacity(cpu=min(after.cpu, room.cpu),
                                              memory_mb=min(after.memory_mb, room.memory_mb),
                                              ports=min(after.ports, room.ports))
        won = NodeBid(node_id=node, load=best.load, strategy="preempting")
        return Awarded(request=request, winner=won, tie_broken=tied, bids=row.ranked,
                       declines=row.declines, silent=row.silent, displaced=best.victims,
                       offers=row.offers)

    def _rendered(self, row: Row) -> list[str]:
        return [render(d.reason, d.detail) for d in row.declines] + [_NO_ANSWER] * len(
            row.silent)

    def _unspread(self, request: Request, row: Row, tally: Tally,
                  values: set[str]) -> Unschedulable:
        """A hard spread no fitting bidder keeps: the replica waits, the label named with
        how many replicas each of its values holds."""
        label = request.spread
        head = summarize_declines(self.eligible, len(row.ranked), self._rendered(row))
        counts = ", ".join(f"{v} {tally.in_value(request.group, label, v)}"
                           for v in sorted(values)) or "no node has it"
        return Unschedulable(request=request, reason=Reason.SPREAD,
                             summary=f"{head}; {Reason.SPREAD} ({label}: {counts})",
                             bids=row.ranked, declines=row.declines, silent=row.silent)

    def _unschedulable(self, request: Request, row: Row) -> Unschedulable:
        if self.eligible == 0:
            reason, summary = Reason.NO_NODES, f"0/0 nodes bid: {Reason.NO_NODES}"
        else:
            reason = _main_reason(row.declines)
            summary = summarize_declines(self.eligible, 0, self._rendered(row))
        return Unschedulable(request=request, reason=reason, summary=summary, bids=row.ranked,
                             declines=row.declines, silent=row.silent)


def _spread_values(row: Row, label: str, tally: Tally) -> set[str]:
    """The label's values among the nodes that could take the shape (`shared.spread` rule 3):
    its bidders, and the nodes that declined it for want of room."""
    nodes = [*row.bids, *(d.node_id for d in row.sent if d.reason in _CAPACITY)]
    return {v for n in nodes if (v := tally.label(n, label)) is not None}


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
