"""spread: bid the node's committed share, ignoring what the host measures.

Counts reservations only, so a node running few instances wins even if some other process
keeps its CPU busy. Load = mean of committed cpu and memory fractions.
"""

from __future__ import annotations

from gavel.shared.feasibility import NodeView, Refusal
from gavel.shared.messages import Shape
from gavel.shared.strategies.base import Params, committed_share


class Spread:
    name = "spread"
    depends_on_request = False

    def __init__(self, params: Params | None = None) -> None:
        del params

    def bid(self, request: Shape, node: NodeView) -> float | Refusal:
        del request
        cpu, mem = committed_share(node)
        return (cpu + mem) / 2.0
