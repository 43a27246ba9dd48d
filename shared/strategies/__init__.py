"""Bidding strategies: a Protocol, a registry, and the one function every shell calls.

Rule: `answer` is the only path from an RFB request to a Bid or Decline — the worker, the
broker's tests and the simulator all go through it, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable

from shared.feasibility import NodeView, Refusal, check
from shared.messages import Bid, Decline, Request
from shared.strategies.base import Params, Strategy
from shared.strategies.binpack import Binpack
from shared.strategies.headroom import Headroom
from shared.strategies.least_loaded import LeastLoaded
from shared.strategies.spread import Spread

__all__ = ["REGISTRY", "Params", "Strategy", "answer", "make_strategy", "names"]

REGISTRY: dict[str, Callable[[Params | None], Strategy]] = {
    LeastLoaded.name: LeastLoaded,
    Binpack.name: Binpack,
    Spread.name: Spread,
    Headroom.name: Headroom,
}


def names() -> list[str]:
    return sorted(REGISTRY)


def make_strategy(name: str, params: Params | None = None) -> Strategy:
    try:
        factory = REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown strategy {name!r}: expected one of {', '.join(names())}"
        ) from None
    return factory(params)


def answer(strategy: Strategy, request: Request, node: NodeView) -> Bid | Decline:
    """Feasibility first, then the strategy's price."""
    refusal = check(request, node)
    if refusal is None:
        priced = strategy.bid(request, node)
        if isinstance(priced, Refusal):
            refusal = priced
        else:
            return Bid(instance_id=request.instance_id, load=priced, strategy=strategy.name)
    return Decline(instance_id=request.instance_id, reason=refusal.reason, detail=refusal.detail)
