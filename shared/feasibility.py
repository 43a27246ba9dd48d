"""Can this node take this request at all? Hard constraints, checked before any strategy.

Rule: labels are hard constraints, draining declines everything, a process that asks for
root needs a node whose config allows it (a container's user is its engine's business), an
image needs a container engine on the node, every named host volume must be held, and cpu,
memory and ports are reservations against capacity minus what is already committed. The
first failing check is the decline, in that fixed order, so the same node state always gives
the same reason.
"""

from __future__ import annotations

import msgspec

from gavel.shared.messages import Amounts, Capacity, HostStats, Shape, Victim
from gavel.shared.reasons import Reason

__all__ = ["NodeView", "Refusal", "check", "shortfall"]


class NodeView(msgspec.Struct, kw_only=True):
    """What a bidder knows about its own node when it answers an RFB."""

    node_id: str
    capacity: Capacity
    committed: Capacity = msgspec.field(default_factory=Capacity)
    stats: HostStats = msgspec.field(default_factory=HostStats)
    labels: dict[str, str] = {}
    draining: bool = False
    #: A container engine answers on this node (`worker.engine`).
    engine: bool = False
    #: The image names (tags, digests, ids) the engine holds.
    images: frozenset[str] = frozenset()
    #: The host volumes this node's worker config names.
    volumes: frozenset[str] = frozenset()
    #: Whether a process asking for root may run here (the worker's ``allow_root``, or its
    #: isolation off). A view that cannot know (the broker's candidate index, the
    #: simulator) says yes: the node's own bid declines.
    allow_root: bool = True
    #: The instances this node runs that it may stop for higher-priority work
    #: (`gavel.shared.preemption`): not those being stopped, not a system job's.
    residents: tuple[Victim, ...] = ()


class Refusal(msgspec.Struct, frozen=True):
    reason: Reason
    detail: str = ""


#: Cpu is a float sum of many awards: a request that fits exactly must not be refused for
#: the last bits of rounding.
_EPS = 1e-9


def shortfall(request: Amounts, free: Capacity) -> Refusal | None:
    """The fit check, the one every node and the auction use: None when `request` fits in
    `free`; otherwise the first of cpu, memory, ports that does not."""
    if request.cpu > free.cpu + _EPS:
        return Refusal(Reason.NO_ROOM_CPU, f"{request.cpu:g}")
    if request.memory_mb > free.memory_mb:
        return Refusal(Reason.NO_ROOM_MEMORY, f"{request.memory_mb}")
    if request.ports > free.ports:
        return Refusal(Reason.NO_ROOM_PORTS)
    return None


def check(request: Shape, node: NodeView) -> Refusal | None:
    """None when the node may bid; otherwise the one reason it must decline."""
    for key, value in sorted(request.labels.items()):
        if node.labels.get(key) != value:
            return Refusal(Reason.MISSING_LABEL, f"{key}={value}")
    if node.draining:
        return Refusal(Reason.DRAINING)
    if request.root and not request.image and not node.allow_root:
        return Refusal(Reason.ROOT_REFUSED)
    if request.image and not node.engine:
        return Refusal(Reason.NO_ENGINE)
    for name in sorted(request.volumes):
        if name not in node.volumes:
            return Refusal(Reason.MISSING_VOLUME, name)
    return shortfall(request, node.capacity - node.committed)
