"""Preemption as a bid: what a node with no room would stop for higher-priority work, and
which such offer the broker takes.

Rules:
1. A node may displace only instances at least `GAP` below the request's priority (Nomad's
   gap): never equal or higher priority, and two jobs a few points apart never take turns
   evicting each other. With the default priority 50 for everything, nothing is ever
   preempted.
2. A node offers to displace only when its one refusal is a want of room (cpu, memory,
   ports): labels, drain, engine and volumes are not things stopping work can give. A system
   job's instance and one already being stopped are never victims (the worker leaves them
   out of `NodeView.residents`).
3. The node's choice (`victims`, the default every strategy uses unless it brings its own
   ``victims`` method): the fewest instances that make room, then the lowest total
   priority, then the least reserved cpu and memory, then instance ids - searched exactly
   over sets of up to `EXACT_SETS` combinations, greedily beyond (lowest priority first,
   largest first, then any victim the rest makes unnecessary is spared).
4. The offer's price is the node's strategy's bid on the node as it would be once the
   victims are gone; a strategy that refuses even then makes no offer.
5. The broker's order over offers (`offer_key`): fewest evictions, then lowest total evicted
   priority, then the price, then node id - total and deterministic, as the award rule is.
   Ordinary bids always come first: an offer is taken only when no bid fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import msgspec

from gavel.shared.feasibility import NodeView, shortfall
from gavel.shared.messages import Capacity, Shape, Victim

__all__ = ["EXACT_SETS", "GAP", "Offer", "displaceable", "freed", "offer_key", "victims"]

#: The least priority difference that lets work displace other work (rule 1).
GAP = 10
#: How many candidate sets the exact search may try before it turns greedy (rule 3): it runs
#: in the node's answer to a request for bids, so its cost is bounded.
EXACT_SETS = 500
#: As `shared.feasibility`'s: a cpu sum that fits exactly is not refused for rounding.
_EPS = 1e-9


class Offer(msgspec.Struct, frozen=True, kw_only=True):
    """One node's preempting offer for a shape, as the broker keeps it."""

    node_id: str
    load: float
    victims: tuple[Victim, ...]

    @property
    def evicted_priority(self) -> int:
        return sum(v.priority for v in self.victims)


def offer_key(offer: Offer) -> tuple[int, int, float, str]:
    """Rule 5: the lower wins."""
    return len(offer.victims), offer.evicted_priority, offer.load, offer.node_id


def displaceable(priority: int, victim: int) -> bool:
    """Rule 1: may work of `priority` displace work of priority `victim`?"""
    return victim <= priority - GAP


def freed(room: Capacity, gone: Sequence[Victim]) -> Capacity:
    """`room` once `gone` stop."""
    out = room.copy()
    for v in gone:
        out.charge(v)
    return out


def _cost(chosen: Sequence[Victim]) -> tuple[int, float, int]:
    return (sum(v.priority for v in chosen), sum(v.cpu for v in chosen),
            sum(v.memory_mb for v in chosen))


def victims(shape: Shape, node: NodeView) -> list[Victim] | None:
    """Rule 3: the instances to stop so `shape` fits on `node`, or None when no set of
    displaceable instances makes room."""
    pool = sorted((v for v in node.residents if displaceable(shape.priority, v.priority)),
                  key=lambda v: v.instance_id)
    if not pool:
        return None
    room = node.capacity - node.committed
    if shortfall(shape, freed(room, pool)) is not None:
        return None  # all of them would not be enough
    # What the victims must free at least, in each of cpu, memory and ports.
    cpu = shape.cpu - room.cpu - _EPS
    memory = shape.memory_mb - room.memory_mb
    ports = shape.ports - room.ports
    tried = 0
    for k in range(1, len(pool) + 1):
        best: tuple[Victim, ...] | None = None
        best_cost: tuple[int, float, int] | None = None
        for chosen in combinations(pool, k):
            tried += 1
            if tried > EXACT_SETS:
                return _greedy(shape, room, pool)
            if sum(v.cpu for v in chosen) >= cpu \
                    and sum(v.memory_mb for v in chosen) >= memory \
                    and sum(v.ports for v in chosen) >= ports:
                cost = _cost(chosen)  # ties: the first in id order (the pool is sorted)
                if best_cost is None or cost < best_cost:
                    best, best_cost = chosen, cost
        if best is not None:
            return sorted(best, key=lambda v: (v.priority, v.instance_id))
    return None  # unreachable: the whole pool fits


def _greedy(shape: Shape, room: Capacity, pool: Sequence[Victim]) -> list[Victim]:
    """Rule 3 beyond the exact search: lowest priority first, largest first; then spare
    each victim (highest priority first) the others make unnecessary."""
    order = sorted(pool, key=lambda v: (v.priority, -v.cpu, -v.memory_mb, v.instance_id))
    chosen: list[Victim] = []
    for v in order:
        chosen.append(v)
        if shortfall(shape, freed(room, chosen)) is None:
            break
    for v in sorted(chosen, key=lambda v: (-v.priority, v.instance_id)):
        rest = [c for c in chosen if c is not v]
        if shortfall(shape, freed(room, rest)) is None:
            chosen = rest
    return sorted(chosen, key=lambda v: (v.priority, v.instance_id))
