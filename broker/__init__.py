"""The broker: runs auctions over NATS and commits their awards to git.

Its parts - the auctioneer, the promises a placement makes, the API, retention, metrics, the
KV mirror - each take a narrow `Context` (`gavel.broker.context`), never the whole `Broker`;
`gavel.broker.ledger` is the git state repository. The decisions themselves come from
`gavel.shared`, the pure core. Submodules load lazily: importing this package costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Broker", "Ledger"]

if TYPE_CHECKING:
    from gavel.broker.ledger.repository import Ledger
    from gavel.broker.service import Broker


def __getattr__(name: str) -> Any:
    if name == "Broker":
        from gavel.broker.service import Broker

        return Broker
    if name == "Ledger":
        from gavel.broker.ledger.repository import Ledger

        return Ledger
    raise AttributeError(f"module 'gavel.broker' has no attribute {name!r}")
