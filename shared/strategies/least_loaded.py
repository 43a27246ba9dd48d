"""least-loaded: bid the node's current utilisation (host stats and commitments).

The seed rule. Work flows to the emptiest node, which spreads load evenly.
"""

from __future__ import annotations

from gavel.shared.feasibility import NodeView, Refusal
from gavel.shared.messages import Shape
from gavel.shared.strategies.base import Params, utilisation


class LeastLoaded:
    name = "least-loaded"
    depends_on_request = False

    def __init__(self, params: Params | None = None) -> None:
        del params

    def bid(self, request: Shape, node: NodeView) -> float | Refusal:
        del request
        return utilisation(node)
