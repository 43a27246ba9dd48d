"""Bidding strategies: a Protocol, a registry, and the one function every shell calls.

Rule: `answer` is the only path from an RFB request to a Bid or Decline — the worker, the
broker's tests and the simulator all go through it, so they cannot disagree. A decline for
want of room carries a preempting offer when the node could make room by stopping
lower-priority work (`gavel.shared.preemption`); a strategy may choose its own victims with a
``victims(shape, node)`` method, as `gavel.shared.preemption.victims` does for the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import msgspec

from gavel.shared import preemption
from gavel.shared.feasibility import NodeView, Refusal, check
from gavel.shared.messages import Bid, Decline, Shape
from gavel.shared.reasons import Reason
from gavel.shared.strategies.base import Params, Strategy
from gavel.shared.strategies.binpack import Binpack
from gavel.shared.strategies.headroom import Headroom
from gavel.shared.strategies.least_loaded import LeastLoaded
from gavel.shared.strategies.spread import Spread

__all__ = ["REGISTRY", "WARM_BONUS", "Params", "Strategy", "answer", "make_strategy", "names"]

REGISTRY: dict[str, Callable[[Params | None], Strategy]] = {
    LeastLoaded.name: LeastLoaded,
    Binpack.name: Binpack,
    Spread.name: Spread,
    Headroom.name: Headroom,
}


#: How much higher a node that lacks a shape's image bids than one that holds it (in the
#: strategies' units of utilisation, 0..1): a warm node wins unless a cold one is this much
#: emptier, since a pull costs seconds to minutes and a warm start well under one. Added to
#: the cold node's price (a bid is never negative).
WARM_BONUS = 0.1


def names() -> list[str]:
    return sorted(REGISTRY)


def make_strategy(name: str, params: Params | None = None) -> Strategy:
    """The strategy `name` with `params`; a ValueError sentence for an unknown name or a
    parameter the strategy does not take (a misspelt ``ceilng`` is refused, not ignored)."""
    try:
        factory = REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown strategy {name!r}: expected one of {', '.join(names())}"
        ) from None
    takes: frozenset[str] = getattr(factory, "PARAMS", frozenset())
    unknown = sorted(set(params or {}) - takes)
    if unknown:
        which = f"it takes {', '.join(sorted(takes))}" if takes else "it takes none"
        raise ValueError(f"strategy {name} has no parameter {unknown[0]!r} ({which})")
    return factory(params)


def answer(strategy: Strategy, shape: Shape, node: NodeView, index: int = 0) -> Bid | Decline:
    """Feasibility first, then the strategy's price and its marginal step for one more.

    `index` is the shape's position in the RFB, echoed so the broker can match answers."""
    refusal = check(shape, node)
    if refusal is None:
        priced = strategy.bid(shape, node)
        if isinstance(priced, Refusal):
            refusal = priced
        else:
            warm = bool(shape.image) and shape.image in node.images
            cold = bool(shape.image) and not warm
            return Bid(shape=index, load=priced + (WARM_BONUS if cold else 0.0),
                       step=_step(strategy, shape, node, priced), strategy=strategy.name,
                       warm=warm)
    elif node.residents and refusal.reason in _ROOM:
        return _preempting(strategy, shape, node, index, refusal)
    return Decline(shape=index, reason=refusal.reason, detail=refusal.detail)


_ROOM = frozenset({Reason.NO_ROOM_CPU, Reason.NO_ROOM_MEMORY, Reason.NO_ROOM_PORTS})


def _preempting(strategy: Strategy, shape: Shape, node: NodeView, index: int,
                refusal: Refusal) -> Decline:
    """The decline for want of room, with the node's preempting offer when it has one
    (`gavel.shared.preemption` rules 2-4)."""
    choose = getattr(strategy, "victims", None) or preemption.victims
    chosen = choose(shape, node)
    if chosen:
        left = node.committed.copy()
        for v in chosen:
            left.charge(v, -1)
        after = msgspec.structs.replace(node, committed=left)
        priced = strategy.bid(shape, after)
        if not isinstance(priced, Refusal):
            cold = bool(shape.image) and shape.image not in node.images
            return Decline(shape=index, reason=refusal.reason, detail=refusal.detail,
                           evict=list(chosen),
                           evict_load=priced + (WARM_BONUS if cold else 0.0))
    return Decline(shape=index, reason=refusal.reason, detail=refusal.detail)


def _step(strategy: Strategy, shape: Shape, node: NodeView, load: float) -> float:
    """How much the price rises once the node holds one more of `shape`.

    Room is not checked here — the broker charges every award against the node's free
    capacity — so the step stays finite while the strategy would still price another;
    ``inf`` means the strategy itself refuses a second one (a ceiling)."""
    after = msgspec.structs.replace(node, committed=node.committed + shape)
    again = strategy.bid(shape, after)
    return math.inf if isinstance(again, Refusal) else again - load
