"""The award rule: lowest load wins, ties broken by node id.

Rule: the ranking key is ``(load, node_id)`` — total, deterministic, independent of the
order bids arrived in. Loads that are not finite non-negative numbers never reach here
(`shared.auction` rejects them on receipt).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

__all__ = ["NodeBid", "NodeDecline", "pick", "rank"]


class NodeBid(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    load: float
    strategy: str = ""


class NodeDecline(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    reason: str
    detail: str = ""


def rank(bids: Iterable[NodeBid]) -> list[NodeBid]:
    """Best first."""
    return sorted(bids, key=lambda b: (b.load, b.node_id))


def pick(bids: Iterable[NodeBid]) -> tuple[NodeBid, bool] | None:
    """The winner and whether the tie-break decided it (another bid had the same load)."""
    best: NodeBid | None = None
    tied = False
    for bid in bids:
        if best is None or (bid.load, bid.node_id) < (best.load, best.node_id):
            tied = best is not None and bid.load == best.load
            best = bid
        elif bid.load == best.load:
            tied = True
    return None if best is None else (best, tied)
