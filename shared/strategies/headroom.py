"""headroom: least-loaded, but decline when taking the request would pass a ceiling.

Keeps a safety margin on every node: parameter ``ceiling`` (default 0.8) is the highest
utilisation, measured after placement, the node will accept.
"""

from __future__ import annotations

from gavel.shared.feasibility import NodeView, Refusal
from gavel.shared.messages import Shape
from gavel.shared.reasons import Reason
from gavel.shared.strategies.base import Params, utilisation


class Headroom:
    name = "headroom"
    depends_on_request = True
    PARAMS = frozenset({"ceiling"})

    def __init__(self, params: Params | None = None) -> None:
        ceiling = float((params or {}).get("ceiling", 0.8))
        if not 0.0 < ceiling <= 1.0:
            raise ValueError(f"headroom ceiling must be in (0, 1], got {ceiling}")
        self.ceiling = ceiling

    def bid(self, request: Shape, node: NodeView) -> float | Refusal:
        after = utilisation(node, request)
        if after > self.ceiling:
            return Refusal(Reason.OVER_CEILING, f"{self.ceiling:g}")
        return utilisation(node)
