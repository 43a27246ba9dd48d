"""The broker shell: NATS I/O, the git ledger, liveness, the API and the CLI.

The decisions themselves come from `shared` (the pure core); this package only moves
messages and commits. Submodules load lazily: `gavel worker` lives in this package's CLI
and must not pay for pygit2 and the broker's service.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Broker", "Ledger"]

if TYPE_CHECKING:
    from broker.ledger import Ledger
    from broker.service import Broker


def __getattr__(name: str) -> Any:
    if name == "Broker":
        from broker.service import Broker

        return Broker
    if name == "Ledger":
        from broker.ledger import Ledger

        return Ledger
    raise AttributeError(f"module 'broker' has no attribute {name!r}")
