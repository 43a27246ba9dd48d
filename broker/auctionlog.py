"""What the broker keeps and writes of a decided auction: the commit's lines and trailer, and
the recent decisions `gavel why` and `gavel nodes NODE` read.

Rules:
1. A batch's trailer carries each shape's bids once, from the last decision made for that
   shape, whose declines include any node that ran out of room during the batch.
2. The newest `kept` decisions are remembered, one per instance (its latest); the oldest
   goes first, from an `OrderedDict`: a plain dict's first key, after many taken from the
   front, is found by walking past their deleted slots, once a placement.
"""

from __future__ import annotations

from collections import OrderedDict

from gavel.broker.metrics import Metrics
from gavel.shared.auction import Auction, Awarded, Decision
from gavel.shared.award import NodeDecline
from gavel.shared.reasons import render
from gavel.shared.records import AuctionRecord, BatchRecord, Outcome, ShapeRecord

__all__ = ["Recent", "batch_record", "count", "place_line", "record", "shapes_of"]


class Recent:
    """The latest decision of each of the newest `kept` instances (rule 2)."""

    __slots__ = ("_kept", "_recent")

    def __init__(self, kept: int) -> None:
        self._kept = kept
        self._recent: OrderedDict[str, tuple[str, Decision]] = OrderedDict()  # oldest first

    def remember(self, iid: str, aid: str, d: Decision) -> None:
        recent = self._recent
        recent.pop(iid, None)
        recent[iid] = (aid, d)
        if len(recent) > self._kept:
            recent.popitem(last=False)

    def declines_by(self, node_id: str, limit: int) -> list[tuple[str, str, NodeDecline]]:
        """(instance, auction, decline) of `node_id` in the decisions remembered, newest
        first, at most `limit`."""
        out: list[tuple[str, str, NodeDecline]] = []
        for iid, (aid, d) in reversed(self._recent.items()):
            for dec in d.declines:
                if dec.node_id == node_id:
                    out.append((iid, aid, dec))
                    break
            if len(out) >= limit:
                break
        return out

    def record(self, iid: str) -> AuctionRecord | None:
        got = self._recent.get(iid)
        return None if got is None else record(*got)


def shapes_of(auction: Auction, decisions: list[Decision]) -> list[int]:
    """Each decision's shape index: all the auction's requests, or those left after some were
    asked again of more nodes (rule 11)."""
    if len(decisions) == len(auction.requests):
        return auction.shape_of
    index = {r.instance_id: s for r, s in zip(auction.requests, auction.shape_of, strict=True)}
    return [index[d.request.instance_id] for d in decisions]


def record(aid: str, d: Decision) -> AuctionRecord:
    if isinstance(d, Awarded):
        return AuctionRecord(auction_id=aid, instance_id=d.request.instance_id,
                             winner=d.winner.node_id, load=d.winner.load,
                             tie_broken=d.tie_broken, bids=list(d.bids),
                             declines=list(d.declines), silent=list(d.silent),
                             offers=list(d.offers), displaced=list(d.displaced))
    return AuctionRecord(auction_id=aid, instance_id=d.request.instance_id, bids=list(d.bids),
                         declines=list(d.declines), silent=list(d.silent), reason=d.reason,
                         summary=d.summary)


def batch_record(auction: Auction, decisions: list[Decision],
                  outcomes: list[Outcome]) -> BatchRecord:
    """One trailer for the auction: each shape's bids once (from the last decision made
    for it, whose declines include any node that ran out of room during the batch)."""
    last: dict[int, Decision] = {}
    for d, s in zip(decisions, shapes_of(auction, decisions), strict=True):
        last[s] = d
    offers = {s: list(d.offers) for d, s in zip(decisions, shapes_of(auction, decisions),
                                                 strict=True)
              if isinstance(d, Awarded) and d.offers}
    shapes = [ShapeRecord(shape=shape, bids=list(last[i].bids),
                          declines=list(last[i].declines), silent=list(last[i].silent),
                          offers=offers.get(i, []))
              for i, shape in enumerate(auction.shapes) if i in last]
    return BatchRecord(auction_id=auction.auction_id, shapes=shapes, outcomes=outcomes)


def place_line(d: Awarded) -> str:
    w = d.winner
    others = len(d.bids) - 1
    tie = ", tie broken on node id" if d.tie_broken else ""
    declines = "; ".join(f"{x.node_id} {render(x.reason, x.detail)}" for x in d.declines)
    if d.displaced:
        gone = ", ".join(f"{v.instance_id} (priority {v.priority})" for v in d.displaced)
        return (f"place {d.request.instance_id} (priority {d.request.priority}) on "
                f"{w.node_id} displacing {gone}: no node bid, {len(d.offers)} preempting "
                f"offer{'s' if len(d.offers) != 1 else ''}, the cheapest displacement"
                + (f"; declined: {declines}" if declines else ""))
    return (f"place {d.request.instance_id} on {w.node_id}: load {w.load:.3f} "
            f"({w.strategy}) beat {others} other bid{'s' if others != 1 else ''}{tie}"
            + (f"; declined: {declines}" if declines else ""))




def count(m: Metrics, auction: Auction, decisions: list[Decision], round_s: float) -> None:
    """The auction in the broker's metrics (`broker.metrics.Metrics`): its round's length,
    its outcomes, its bids by strategy and its declines by reason."""
    m.round_seconds.observe(round_s)
    awarded = sum(1 for d in decisions if isinstance(d, Awarded))
    if awarded:
        m.auctions.labels(outcome="awarded").inc(awarded)
    if awarded < len(decisions):
        m.auctions.labels(outcome="unschedulable").inc(len(decisions) - awarded)
    for strategy, n in auction.bid_counts().items():
        m.bids.labels(strategy=strategy).inc(n)
    for reason, n in auction.decline_counts().items():
        m.declines.labels(reason=reason).inc(n)
