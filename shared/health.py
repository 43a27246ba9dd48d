"""Node liveness from heartbeats, as a pure function of the last time each node was heard.

Rules: heard within `unreachable_s` → healthy (eligible for auctions); then unreachable (its
instances keep running and are not re-placed); past `offline_s` → offline (its leases
expire). Only healthy nodes are asked to bid: waiting on a node that stopped talking would
stretch every round to the bid deadline.

`eligible` is asked on every auction, so it is kept, not recomputed: the sorted list stays
true until the quietest eligible node crosses `unreachable_s` (times only grow: a heartbeat
moves a node's time later, `shift` moves every time later) or a node outside it is heard.
"""

from __future__ import annotations

from enum import StrEnum

from gavel.shared.messages import Heartbeat
from gavel.shared.timing import Timing

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
        self._eligible: list[str] = []
        self._eligible_set: frozenset[str] = frozenset()
        #: `_eligible` is exact for `now` in [_valid_from, _valid_until).
        self._valid_from = float("inf")
        self._valid_until = float("-inf")

    def record(self, hb: Heartbeat, now: float) -> Health | None:
        """Store a heartbeat; returns the node's health before it, None for a new node."""
        before = self.health(hb.node_id, now) if hb.node_id in self.last_seen else None
        self.last_seen[hb.node_id] = now
        self.heartbeats[hb.node_id] = hb
        if hb.node_id not in self._eligible_set:
            self._valid_until = float("-inf")  # a new or returning node: look again
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
        """Healthy nodes, sorted (the list is shared: do not change it)."""
        if self._valid_from <= now < self._valid_until:
            return self._eligible
        limit = self.timing.unreachable_s
        seen = self.last_seen
        nodes = sorted(n for n, t in seen.items() if now - t < limit)
        self._eligible = nodes
        self._eligible_set = frozenset(nodes)
        self._valid_from = now
        self._valid_until = min((seen[n] for n in nodes), default=float("inf")) + limit
        return nodes

    def known(self) -> list[str]:
        return sorted(self.last_seen)

    def shift(self, seconds: float) -> None:
        """The observer was deaf for `seconds` (its own connection was down): nothing it
        failed to hear in that time counts against a node."""
        for table in (self.last_seen, self.presumed):
            for node in table:
                table[node] += seconds
        self._valid_until = float("-inf")
