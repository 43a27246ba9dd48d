"""binpack: bid lower the fuller the node would be after taking the request.

Attracts work to nodes that are already busy, so other nodes stay empty (and can be
scaled down or take big requests later). Load = 1 - utilisation-after-placement.
"""

from __future__ import annotations

from gavel.shared.feasibility import NodeView, Refusal
from gavel.shared.messages import Shape
from gavel.shared.strategies.base import Params, utilisation


class Binpack:
    name = "binpack"
    depends_on_request = True

    def __init__(self, params: Params | None = None) -> None:
        del params

    def bid(self, request: Shape, node: NodeView) -> float | Refusal:
        return max(0.0, 1.0 - utilisation(node, request))
