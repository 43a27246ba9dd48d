"""Node liveness from heartbeats, as a pure function of the last time each node was heard.

Rules: heard within `unreachable_s` → healthy (eligible for auctions); then unreachable (its
instances keep running and are not re-placed); past `offline_s` → offline (its leases
expire). Only healthy nodes are asked to bid: waiting on a node that stopped talking would
stretch every round to the bid deadline.
"""

from __future__ import annotations

from enum import StrEnum

from shared.messages import Heartbeat
from shared.timing import Timing

__all__ = ["Health", "Liveness"]


class Health(StrEnum):
    HEALTHY = "healthy"
    UNREACHABLE = "unreachable"
    OFFLINE = "offline"


class Liveness:
    def __init__(self, timing: Timing) -> None:
        self.timing = timing
        self.last_seen: dict[str, float] = {}
        self.heartbeats: dict[str, Heartbeat] = {}
        self.presumed: dict[str, float] = {}

    def record(self, hb: Heartbeat, now: float) -> Health | None:
        """Store a heartbeat; returns the node's health before it, None for a new node."""
        before = self.health(hb.node_id, now) if hb.node_id in self.last_seen else None
        self.last_seen[hb.node_id] = now
        self.heartbeats[hb.node_id] = hb
        return before

    def presume(self, node_id: str, now: float) -> None:
        """Count a node we hold placements for as heard at `now` (a broker that just started
        must give every node the full thresholds before declaring it offline). A presumed
        node is not eligible until a real heartbeat arrives."""
        self.presumed.setdefault(node_id, now)

    def health(self, node_id: str, now: float) -> Health:
        seen = self.last_seen.get(node_id, self.presumed.get(node_id))
        if seen is None:
            return Health.OFFLINE
        quiet = now - seen
        if quiet < self.timing.unreachable_s:
            return Health.HEALTHY
        if quiet < self.timing.offline_s:
            return Health.UNREACHABLE
        return Health.OFFLINE

    def eligible(self, now: float) -> list[str]:
        """Healthy nodes, sorted."""
        return sorted(n for n in self.last_seen if self.health(n, now) is Health.HEALTHY)

    def known(self) -> list[str]:
        return sorted(self.last_seen)

    def shift(self, seconds: float) -> None:
        """The observer was deaf for `seconds` (its own connection was down): nothing it
        failed to hear in that time counts against a node."""
        for table in (self.last_seen, self.presumed):
            for node in table:
                table[node] += seconds
