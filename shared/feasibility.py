"""Can this node take this request at all? Hard constraints, checked before any strategy.

Rule: labels are hard constraints, draining declines everything, and cpu, memory and ports
are reservations against capacity minus what is already committed. The first failing check
is the decline, in that fixed order, so the same node state always gives the same reason.
"""

from __future__ import annotations

import msgspec

from gavel.shared.messages import Capacity, HostStats, Shape
from gavel.shared.reasons import Reason

__all__ = ["NodeView", "Refusal", "check", "free_of"]


class NodeView(msgspec.Struct, kw_only=True):
    """What a bidder knows about its own node when it answers an RFB."""

    node_id: str
    capacity: Capacity
    committed: Capacity = msgspec.field(default_factory=Capacity)
    stats: HostStats = msgspec.field(default_factory=HostStats)
    labels: dict[str, str] = {}
    draining: bool = False


class Refusal(msgspec.Struct, frozen=True):
    reason: Reason
    detail: str = ""


def free_of(capacity: Capacity, committed: Capacity) -> Capacity:
    return Capacity(
        cpu=capacity.cpu - committed.cpu,
        memory_mb=capacity.memory_mb - committed.memory_mb,
        ports=capacity.ports - committed.ports,
    )


_EPS = 1e-9


def check(request: Shape, node: NodeView) -> Refusal | None:
    """None when the node may bid; otherwise the one reason it must decline."""
    for key, value in sorted(request.labels.items()):
        if node.labels.get(key) != value:
            return Refusal(Reason.MISSING_LABEL, f"{key}={value}")
    if node.draining:
        return Refusal(Reason.DRAINING)
    free = free_of(node.capacity, node.committed)
    if request.cpu > free.cpu + _EPS:
        return Refusal(Reason.NO_ROOM_CPU, f"{request.cpu:g}")
    if request.memory_mb > free.memory_mb:
        return Refusal(Reason.NO_ROOM_MEMORY, f"{request.memory_mb}")
    if request.ports > free.ports:
        return Refusal(Reason.NO_ROOM_PORTS)
    return None
