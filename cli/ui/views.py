"""What the page is sent: the API's replies shaped into plain JSON the browser draws.

Rules:
1. Plain data only, built from the API's Structs: the page does no arithmetic the award rule
   owns. Bids come ranked by `shared.award.order` (the winner first), each flagged as the
   winner or as tied with it; a decline carries its sentence (`shared.reasons.render`).
2. The overview lists at most `INSTANCES_SHOWN` instances, the ones still to run or running
   first (a broker keeps ended ones too), and counts every instance by state: a large
   cluster is a summary, never a page that grows without end.
3. `services` is None when the broker does not serve the service verbs: the page then says
   nothing about services (an empty list is a broker that has none).
4. An instance's auctions carry when each was committed; a run of auctions in a row that
   came out the same (the same bids, declines, silences and outcome: an instance waiting
   for room, asked again and again) is one entry with how many times and since when.
5. Preemption is shown where it happened: an auction lists the nodes' preempting offers in
   the broker's order (`shared.preemption.offer_key`, the taken one flagged) and the
   instances its award displaced; an instance displaced by one names its preemptor.
6. Batch arrays are listed with the broker's own tally of each (`shared.arrays`: done,
   running, failed, pending), the ones not ended first, at most `ARRAYS_SHOWN`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import msgspec

from gavel.shared import cron
from gavel.shared.api import (
    ArrayStatus,
    InstanceStatus,
    NodeStatus,
    PeriodicStatus,
    ServiceStatus,
    WhyReply,
)
from gavel.shared.award import order
from gavel.shared.messages import Event, EventType, InstanceState, Victim
from gavel.shared.preemption import offer_key
from gavel.shared.reasons import render
from gavel.shared.records import RAISED, AuctionRecord

__all__ = ["ARRAYS_SHOWN", "INSTANCES_SHOWN", "arrays_shown", "auction", "collapsed", "event",
           "instance_page", "overview"]

#: Rule 2.
INSTANCES_SHOWN = 500
#: Rule 6: the arrays the overview asks the broker to tally, each refresh.
ARRAYS_SHOWN = 50

_ENDED = frozenset(s.value for s in InstanceState if s.terminal)


def _plain(obj: Any) -> Any:
    return msgspec.to_builtins(obj)


def overview(*, nodes: list[NodeStatus], instances: list[InstanceStatus],
             services: list[ServiceStatus] | None, error: str = "",
             services_error: str = "", at: float = 0.0,
             periodic: list[PeriodicStatus] | None = None,
             arrays: list[ArrayStatus] | None = None,
             counts: dict[str, int] | None = None, total: int | None = None
             ) -> dict[str, Any]:
    """Rules 2, 3 and 6: the dashboard's front page. With `counts` and `total` (the
    broker's summary) `instances` are some of them, already chosen; without, all of them."""
    live = [i for i in instances if i.state not in _ENDED]
    ended = [i for i in instances if i.state in _ENDED]
    shown = (live + ended)[:INSTANCES_SHOWN]
    return {
        "at": at,
        "error": error,
        "nodes": [_plain(n) for n in sorted(nodes, key=lambda n: n.node_id)],
        "instances": [_plain(i) for i in shown],
        "instances_total": len(instances) if total is None else total,
        "counts": dict(sorted((Counter(i.state for i in instances) if counts is None
                               else counts).items())),
        "services": None if services is None else [_plain(s) for s in services],
        "services_error": services_error,
        "periodic": [_periodic(p) for p in periodic or []],
        "arrays": [_plain(a) for a in sorted(arrays or [],
                                             key=lambda a: (a.ended, a.array_id))],
    }


def _periodic(p: PeriodicStatus) -> dict[str, Any]:
    """A periodic job, its fire times also as its schedule reads them (in its zone)."""
    out: dict[str, Any] = _plain(p)
    out["last_run_local"] = cron.zoned(p.last_run, p.time_zone) if p.last_run else ""
    out["next_run_local"] = cron.zoned(p.next_run, p.time_zone) if p.next_run else ""
    return out


def arrays_shown(instances: list[InstanceStatus]) -> list[str]:
    """Rule 6: the arrays to tally - those with a task not ended first, then by id."""
    live: dict[str, bool] = {}
    for i in instances:
        if i.array:
            live[i.array] = live.get(i.array, False) or i.state not in _ENDED
    return sorted(live, key=lambda a: (not live[a], a))[:ARRAYS_SHOWN]


def _victims(victims: Iterable[Victim]) -> list[dict[str, Any]]:
    return [{"instance_id": v.instance_id, "priority": v.priority}
            for v in sorted(victims, key=lambda v: (v.priority, v.instance_id))]


def auction(a: AuctionRecord) -> dict[str, Any]:
    """Rule 1: one auction, ready to draw as bars."""
    bids = sorted(a.bids, key=order)
    top = max((b.load for b in bids), default=0.0)
    won_at = a.load
    raised = a.raised()
    decided = ""
    if a.winner and a.displaced:
        decided = "preempting offer: fewest evictions, then lowest evicted priority, " \
            "then load, then node id"
    elif a.winner:
        decided = "tie broken on node id (the lower id wins)" if a.tie_broken else \
            "lowest load"
    return {
        "auction_id": a.auction_id,
        "winner": a.winner,
        "load": won_at,
        "tie_broken": a.tie_broken,
        "decided_by": decided,
        "bids": [{
            "node_id": b.node_id,
            "load": b.load,
            "strategy": b.strategy,
            "affinity": b.affinity,  # what soft affinities added (`gavel.shared.affinity`)
            "share": max(0.0, b.load / top) if top > 0 else 0.0,
            "winner": bool(a.winner) and b.node_id == a.winner,
            "tied": a.tie_broken and b.node_id != a.winner and won_at is not None
            and b.load == won_at,
            # ranked above its bid: it won earlier in the same round (`AuctionRecord.raised`)
            "raised": RAISED if b.node_id in raised else "",
        } for b in bids],
        "declines": [{"node_id": d.node_id, "reason": d.reason, "detail": d.detail,
                      "text": render(d.reason, d.detail)}
                     for d in sorted(a.declines, key=lambda d: d.node_id)],
        "silent": sorted(a.silent),
        "offers": [{"node_id": o.node_id, "load": o.load, "victims": _victims(o.victims),
                    "taken": bool(a.displaced) and o.node_id == a.winner}
                   for o in sorted(a.offers, key=offer_key)],
        "displaced": _victims(a.displaced),
        "reason": a.reason,
        "summary": a.summary,
        "at": a.at,
        "repeat": 1,
        "first_at": a.at,
    }


def _outcome(a: AuctionRecord) -> tuple[Any, ...]:
    """Rule 4: what makes two auctions come out the same (not their id or time)."""
    return (a.winner, a.load, a.tie_broken, a.reason, a.summary,
            sorted((b.node_id, b.load, b.strategy) for b in a.bids),
            sorted((d.node_id, d.reason, d.detail) for d in a.declines), sorted(a.silent),
            sorted(offer_key(o) for o in a.offers), sorted(v.instance_id for v in a.displaced))


def collapsed(auctions: list[AuctionRecord]) -> list[dict[str, Any]]:
    """Rule 4, over auctions newest first: each run of the same outcome as its newest, with
    `repeat` (how many) and `first_at` (when the oldest of them was committed)."""
    out: list[dict[str, Any]] = []
    last: tuple[Any, ...] | None = None
    for a in auctions:
        key = _outcome(a)
        if out and key == last:
            out[-1]["repeat"] += 1
            out[-1]["first_at"] = a.at or out[-1]["first_at"]
            continue
        out.append(auction(a))
        last = key
    return out


def instance_page(why: WhyReply, events: Iterable[Event] = ()) -> dict[str, Any]:
    """One instance: its status, each time it was displaced, by whom, on which node (rule
    5; from its `events`), and every auction it went through, newest first (rule 4)."""
    preempted = [{"instance_id": e.detail.partition(" (priority ")[0], "node_id": e.node_id,
                  "at": e.at, "text": render(e.reason, e.detail)}
                 for e in sorted(events, key=lambda e: e.at, reverse=True)
                 if e.type == EventType.PREEMPTED and e.detail]  # `reasons.preempted_by`
    return {"instance": _plain(why.instance), "preempted_by": preempted,
            "auctions": collapsed(why.auctions)}


def event(e: Event) -> dict[str, Any]:
    """An event as the page lists it; `text` is its reason and detail in one line (the
    detail alone when it already says the reason, as an unschedulable summary does)."""
    out: dict[str, Any] = _plain(e)
    out.pop("v", None)
    out.pop("kind", None)
    if e.reason and e.detail:
        out["text"] = e.detail if e.reason in e.detail else f"{e.reason}: {e.detail}"
    else:
        out["text"] = e.reason or e.detail
    return out
