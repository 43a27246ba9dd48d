"""The strategy contract: a node's own rule for how much it wants a request.

Rule: a strategy sees one request and its own node (never the cluster) and returns a load
(lower wins) or a `Refusal`. Hard constraints are checked before it is asked (see
`shared.feasibility`), so a strategy only ever prices work the node can take.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from gavel.shared.feasibility import NodeView, Refusal
from gavel.shared.messages import Shape

__all__ = ["Params", "Strategy", "committed_share", "utilisation"]

Params = Mapping[str, float]


class Strategy(Protocol):
    name: str
    #: False when the load ignores the request: the simulator may then cache a node's bid
    #: until its own state changes.
    depends_on_request: bool

    def bid(self, request: Shape, node: NodeView) -> float | Refusal: ...


def _share(used: float, total: float) -> float:
    return used / total if total > 0 else 1.0


def committed_share(node: NodeView, request: Shape | None = None) -> tuple[float, float]:
    """(cpu, memory) fraction of capacity committed, counting `request` if given."""
    cpu = node.committed.cpu + (request.cpu if request else 0.0)
    mem = node.committed.memory_mb + (request.memory_mb if request else 0)
    return _share(cpu, node.capacity.cpu), _share(mem, node.capacity.memory_mb)


def utilisation(node: NodeView, request: Shape | None = None) -> float:
    """Mean over cpu and memory of max(measured host use, committed share)."""
    cpu, mem = committed_share(node, request)
    return (max(cpu, node.stats.cpu_ratio) + max(mem, node.stats.memory_ratio)) / 2.0
