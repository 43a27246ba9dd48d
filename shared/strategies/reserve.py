"""reserve: a node that keeps itself for the work only it can take.

Rules:
1. A node reserved for label keys (``reserve_for``, e.g. ``gpu``) prices a request that
   requires one of those keys as its strategy does, and any other request at its strategy's
   price plus `PREMIUM`: it still bids, so nothing it could take goes unplaced for want of
   it, but it wins such work only when no unreserved node bids. Scarce nodes filled by work
   that could have run anywhere are how labelled jobs starve under a packing fleet
   (docs/simulator.md); Kubernetes calls this a soft taint.
2. `PREMIUM` is 1.0, a whole node: every built-in strategy's load lies in [0, 1], so a
   reserved node's premium bid loses to every unreserved bid and the ranking among reserved
   nodes is their strategies' own. The marginal step is unchanged (both prices carry the
   premium), so batch pricing is as without it.
3. The wrapper keeps the strategy's name: bids and reports say which rule priced them.
"""

from __future__ import annotations

from collections.abc import Iterable

from gavel.shared.feasibility import NodeView, Refusal
from gavel.shared.messages import Shape
from gavel.shared.strategies.base import Strategy

__all__ = ["PREMIUM", "Reserved", "reserve"]

PREMIUM = 1.0


class Reserved:
    def __init__(self, inner: Strategy, keys: Iterable[str]) -> None:
        self.inner = inner
        self.keys = frozenset(keys)
        self.name = inner.name
        # whether a request asks for a reserved key is the request's own: the price depends
        # on the request whenever the node is reserved at all
        self.depends_on_request = True

    def bid(self, request: Shape, node: NodeView) -> float | Refusal:
        priced = self.inner.bid(request, node)
        if isinstance(priced, Refusal) or not self.keys.isdisjoint(request.labels):
            return priced
        return priced + PREMIUM

    def __repr__(self) -> str:
        return f"Reserved({self.inner.name}, {sorted(self.keys)})"


def reserve(strategy: Strategy, keys: Iterable[str]) -> Strategy:
    """`strategy` reserved for `keys` (rule 1); `strategy` itself when there are none."""
    kept = frozenset(keys)
    return Reserved(strategy, kept) if kept else strategy
