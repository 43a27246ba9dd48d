"""What the auctioneer core (`shared.auctioneer`) reads and what it asks its shell to do.

Rules:
1. The `World` is read, never written: git's pending work (oldest first) and what it commits
   on each node, and the nodes as their heartbeats describe them. The broker's is git and
   its liveness (`broker.auctionworld`), the simulator's its own ledger (`sim.marketworld`).
2. An action is done in the order the core made it: `Open` sends an auction's RFB (to the
   listed nodes, or broadcast), `Decided` commits decisions, `Pinned` reports instances the
   ledger cannot place, `Wake` runs another pass soon.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import NamedTuple, Protocol

from gavel.shared.auction import Auction, Decision
from gavel.shared.messages import Capacity
from gavel.shared.records import InstanceRecord

__all__ = ["Action", "Decided", "Open", "Pinned", "Wake", "World"]


class World(Protocol):
    """What the auctioneer reads of the world: git's pending work and the nodes."""

    def pending(self) -> Iterable[str]:
        """Instance ids waiting for a node, oldest first."""

    def record(self, iid: str) -> InstanceRecord: ...

    def eligible(self, now: float) -> list[str]:
        """The nodes that may be asked now (heard recently, usable), sorted."""

    def draining(self) -> AbstractSet[str]: ...

    def free(self, nodes: Iterable[str], reserved: Mapping[str, Capacity]
             ) -> dict[str, Capacity]:
        """Per node heard: heartbeat capacity minus what git commits there and `reserved`."""

    def held_by(self, group: str) -> dict[str, int]:
        """Replicas of a service per node, in git."""

    def placed(self, iid: str) -> bool:
        """Whether git records a node for the instance."""

    def labels(self) -> Mapping[str, Mapping[str, str]]:
        """Every heard node's labels."""

    @property
    def pinned(self) -> bool:
        """The ledger cannot be written (a pinned deployment)."""


class Open(NamedTuple):
    auction: Auction
    #: The nodes to address one by one; None: broadcast.
    to: list[str] | None


class Decided(NamedTuple):
    auction: Auction
    decisions: list[Decision]
    round_s: float


class Pinned(NamedTuple):
    instances: list[str]


class Wake(NamedTuple):
    pass


Action = Open | Decided | Pinned | Wake
