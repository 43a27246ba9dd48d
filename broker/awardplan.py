"""The award as a plan: a closed auction's decisions applied to the view it reads, returning
the change and the effects that follow it (`broker.effects`), which the auctioneer carries
out once the commit is durable.

Rules:
1. An award lands only if `ledger.plan.place` still allows it on the view, and a displacing
   award only with its victims' evictions in the same commit (`broker.preemptions`);
   otherwise nothing of it is written and `NotPlaced` hands its reserved capacity back.
2. A landed award is `Placed`: its winner is told, its clocks start and its event goes out
   once the commit is durable (the award names the commit, so it is built then). Its
   victims' effects come before it, in the plan's order.
3. An unschedulable decision is written only when its reason or summary changed
   (`broker.auctioneer` rule 7); `Waits` carries whether, so the event follows a change only.
4. Effects keep the decisions' order; the batch's trailer records what was placed or newly
   unschedulable.
5. A commit given up for good lands none of the decisions: `AwardLost` lets the auctioneer
   forget them and tells each instance why.
6. The plan reads nothing but its arguments: each winner's port range (`winner_ports`, what
   its heartbeat said when the round closed) and the leadership's epoch are gathered by the
   auctioneer as it submits the plan, never read from the broker while planning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gavel.broker.auctionlog import batch_record, place_line, shapes_of
from gavel.broker.effects import Why
from gavel.broker.ledger.committer import Planned
from gavel.broker.ledger.plan import View, place, unschedulable
from gavel.broker.preemptions import plan_evictions
from gavel.shared.auction import Auction, Awarded, Decision, Unschedulable
from gavel.shared.messages import Heartbeat
from gavel.shared.records import Outcome, auction_trailer

__all__ = ["AwardLost", "NotPlaced", "Placed", "Waits", "plan_award", "winner_ports"]


@dataclass(frozen=True, slots=True)
class Placed:
    """Rule 2: `decision` landed in auction `auction_id`, as its instance's `attempt`."""

    decision: Awarded
    auction_id: str
    attempt: int
    round_s: float


@dataclass(frozen=True, slots=True)
class NotPlaced:
    """Rule 1: `decision` could not land; its capacity goes back and work may fit there."""

    decision: Awarded


@dataclass(frozen=True, slots=True)
class Waits:
    """Rule 3: `decision`'s instance waits; `changed`: its record says something new."""

    decision: Unschedulable
    auction_id: str
    changed: bool


@dataclass(frozen=True)
class AwardLost(Why):
    """The commit of `decisions` was given up for good (`broker.ledger.committer` rule 4):
    none of them landed, and each instance hears why."""

    decisions: tuple[Decision, ...]


def winner_ports(decisions: Sequence[Decision], heartbeats: Mapping[str, Heartbeat]
                 ) -> dict[str, Sequence[int]]:
    """Rule 6: each winner's port range as `heartbeats` say now (none heard: no ports)."""
    out: dict[str, Sequence[int]] = {}
    for d in decisions:
        if isinstance(d, Awarded) and d.winner.node_id not in out:
            hb = heartbeats.get(d.winner.node_id)
            out[d.winner.node_id] = hb.port_range if hb is not None else ()
    return out


def plan_award(view: View, auction: Auction, decisions: list[Decision], round_s: float, *,
               ports: Mapping[str, Sequence[int]], epoch: int) -> Planned:
    """Rules 1-4 for `auction`'s `decisions` on `view`; `ports` give each winner's port range
    (rule 6), `epoch` the stop messages of displaced victims."""
    out = Planned(lines=[])
    outcomes: list[Outcome] = []
    aid = auction.auction_id
    for d, shape in zip(decisions, shapes_of(auction, decisions), strict=True):
        iid = d.request.instance_id
        if isinstance(d, Awarded):
            port_range = ports.get(d.winner.node_id, ())
            if d.displaced:  # its victims leave in this commit, or nothing happens
                evicted = plan_evictions(view, d, port_range, epoch)
                if evicted is None:
                    out.effects.append(NotPlaced(d))
                    continue
                out.lines += evicted.lines
                out.effects += evicted.effects
            placement = place(view, d, aid, port_range)
            if placement is None:
                out.effects.append(NotPlaced(d))
                continue
            out.lines.append(place_line(d))
            outcomes.append(Outcome(instance_id=iid, shape=shape, winner=d.winner.node_id,
                                    load=d.winner.load, tie_broken=d.tie_broken,
                                    displaced=list(d.displaced)))
            out.effects.append(Placed(d, aid, placement.attempt, round_s))
        else:
            changed = unschedulable(view, d)
            if changed:
                out.lines.append(f"unschedulable {iid}: {d.summary}")
                outcomes.append(Outcome(instance_id=iid, shape=shape, reason=d.reason,
                                        summary=d.summary))
            out.effects.append(Waits(d, aid, changed))
    if outcomes:
        out.trailers.append(auction_trailer(batch_record(auction, decisions, outcomes)))
    return out
