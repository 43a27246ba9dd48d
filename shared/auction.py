"""One auction, as a sans-IO state machine.

Rules:
1. The auction is fed replies and ``now``; it never reads a clock and never sends anything.
2. It is complete when every eligible node has answered, or ``now`` reaches the deadline.
3. A reply counts once per node, only from an eligible node, only before the deadline and
   only for this auction; every other reply is rejected with a `Verdict` the shell counts.
4. `decide` awards each request in order to the lowest ``(load, node_id)`` among the bids
   that still fit, charging each award against the winner's free capacity so one batch
   never over-commits a node.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum

import msgspec

from shared.award import NodeBid, NodeDecline, pick
from shared.messages import Bid, BidReply, Capacity, Request
from shared.reasons import DECLINES, Reason, render, summarize_declines

__all__ = ["Auction", "Awarded", "Decision", "Unschedulable", "Verdict"]


class Verdict(StrEnum):
    ACCEPTED = "accepted"
    LATE = "late bid"
    WRONG_AUCTION = "bid for an unknown auction"
    NOT_ELIGIBLE = "bid from a node that was not asked"
    DUPLICATE = "duplicate bid"
    BAD_LOAD = "bid load is not a finite non-negative number"
    UNKNOWN_REQUEST = "answer for an instance not in the auction"
    BAD_REASON = "decline with a reason outside the fixed set"


class Awarded(msgspec.Struct, frozen=True, kw_only=True):
    request: Request
    winner: NodeBid
    tie_broken: bool
    bids: list[NodeBid]
    declines: list[NodeDecline]
    silent: list[str]


class Unschedulable(msgspec.Struct, frozen=True, kw_only=True):
    request: Request
    reason: Reason
    summary: str
    bids: list[NodeBid]
    declines: list[NodeDecline]
    silent: list[str]


Decision = Awarded | Unschedulable

_NO_ANSWER = "no answer before the deadline"
_REASONS = frozenset(r.value for r in DECLINES)


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
        self._index = {r.instance_id: i for i, r in enumerate(self.requests)}
        if len(self._index) != len(self.requests):
            raise ValueError(f"auction {auction_id} lists an instance twice")
        self._bids: list[list[NodeBid]] = [[] for _ in self.requests]
        self._declines: list[list[NodeDecline]] = [[] for _ in self.requests]
        self._answered: set[str] = set()
        self.closed_at: float | None = None

    # -- input ---------------------------------------------------------------------------
    def receive(self, reply: BidReply, now: float) -> Verdict:
        if reply.auction_id != self.auction_id:
            return Verdict.WRONG_AUCTION
        if self.closed_at is not None or now >= self.deadline:
            return Verdict.LATE
        if reply.node_id not in self.eligible:
            return Verdict.NOT_ELIGIBLE
        if reply.node_id in self._answered:
            return Verdict.DUPLICATE
        staged: list[tuple[int, NodeBid | NodeDecline]] = []
        seen: set[int] = set()
        for ans in reply.answers:
            i = self._index.get(ans.instance_id)
            if i is None:
                return Verdict.UNKNOWN_REQUEST
            if i in seen:
                return Verdict.DUPLICATE
            seen.add(i)
            if isinstance(ans, Bid):
                if not (math.isfinite(ans.load) and ans.load >= 0.0):
                    return Verdict.BAD_LOAD
                staged.append((i, NodeBid(node_id=reply.node_id, load=ans.load,
                                          strategy=ans.strategy)))
            else:
                if ans.reason not in _REASONS:
                    return Verdict.BAD_REASON
                staged.append((i, NodeDecline(node_id=reply.node_id, reason=ans.reason,
                                              detail=ans.detail)))
        for i, item in staged:
            if isinstance(item, NodeBid):
                self._bids[i].append(item)
            else:
                self._declines[i].append(item)
        self._answered.add(reply.node_id)
        return Verdict.ACCEPTED

    # -- timers --------------------------------------------------------------------------
    def done(self, now: float) -> bool:
        return self.closed_at is not None or now >= self.deadline or (
            self._answered >= self.eligible
        )

    def timer(self) -> float:
        """When the shell must call `done` again at the latest."""
        return self.deadline

    @property
    def answered(self) -> frozenset[str]:
        return frozenset(self._answered)

    def bid_counts(self) -> dict[str, int]:
        """Bids received per strategy (for metrics)."""
        out: dict[str, int] = {}
        for bids in self._bids:
            for b in bids:
                out[b.strategy] = out.get(b.strategy, 0) + 1
        return out

    def decline_counts(self) -> dict[str, int]:
        """Declines received per reason (for metrics)."""
        out: dict[str, int] = {}
        for declines in self._declines:
            for d in declines:
                out[d.reason] = out.get(d.reason, 0) + 1
        return out

    # -- output --------------------------------------------------------------------------
    def decide(self, now: float, free: Mapping[str, Capacity] | None = None) -> list[Decision]:
        """Close the auction and award every request (see rule 4)."""
        self.closed_at = now
        remaining = {n: Capacity(cpu=c.cpu, memory_mb=c.memory_mb, ports=c.ports)
                     for n, c in (free or {}).items()}
        decisions: list[Decision] = []
        for i, request in enumerate(self.requests):
            # A node that answered the RFB but skipped this request is silent for it.
            spoke = {b.node_id for b in self._bids[i]} | {d.node_id for d in self._declines[i]}
            silent = sorted(self.eligible - spoke)
            declines = list(self._declines[i])
            fitting: list[NodeBid] = []
            for bid in self._bids[i]:
                room = remaining.get(bid.node_id)
                short = _shortfall(request, room) if room is not None else None
                if short is None:
                    fitting.append(bid)
                else:
                    declines.append(NodeDecline(node_id=bid.node_id, reason=short[0],
                                                detail=short[1]))
            declines.sort(key=lambda d: d.node_id)
            bids = sorted(self._bids[i], key=lambda b: (b.load, b.node_id))
            chosen = pick(fitting)
            if chosen is not None:
                winner, tied = chosen
                room = remaining.get(winner.node_id)
                if room is not None:
                    room.cpu -= request.cpu
                    room.memory_mb -= request.memory_mb
                    room.ports -= request.ports
                decisions.append(Awarded(request=request, winner=winner, tie_broken=tied,
                                         bids=bids, declines=declines, silent=silent))
            else:
                decisions.append(self._unschedulable(request, bids, declines, silent))
        return decisions

    def _unschedulable(self, request: Request, bids: list[NodeBid],
                       declines: list[NodeDecline], silent: list[str]) -> Unschedulable:
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


def _shortfall(request: Request, room: Capacity) -> tuple[Reason, str] | None:
    if request.cpu > room.cpu + 1e-9:
        return Reason.NO_ROOM_CPU, f"{request.cpu:g}"
    if request.memory_mb > room.memory_mb:
        return Reason.NO_ROOM_MEMORY, f"{request.memory_mb}"
    if request.ports > room.ports:
        return Reason.NO_ROOM_PORTS, ""
    return None
