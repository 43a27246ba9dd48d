"""The broker shell: NATS I/O, the git ledger, liveness, the API and the CLI.

The decisions themselves come from `shared` (the pure core); this package only moves
messages and commits.
"""

__all__ = ["Broker", "Ledger"]

from broker.ledger import Ledger
from broker.service import Broker
