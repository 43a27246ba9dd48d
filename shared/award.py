"""The award rule: lowest load wins, ties broken by node id.

Rule: the ranking key is `order`, ``(load, node_id)`` - total, deterministic, independent of
the order bids arrived in. `shared.auction` is the one place that applies it: it ranks each
shape's bids by this key, and its per-shape heaps hold ``(load, node_id, version)`` entries,
the same key with a version to tell stale entries. Loads that are not finite non-negative
numbers never reach here (the auction rejects them on receipt).
"""

from __future__ import annotations

import msgspec

__all__ = ["NodeBid", "NodeDecline", "order"]


class NodeBid(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    load: float
    strategy: str = ""


class NodeDecline(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    reason: str
    detail: str = ""


def order(bid: NodeBid) -> tuple[float, str]:
    """The award rule's key: the lower wins."""
    return bid.load, bid.node_id
