"""Node liveness from heartbeats, as a pure function of the last time each node was heard.

Rules:
1. Heard within `unreachable_s` → healthy (eligible for auctions); then unreachable (its
   instances keep running and are not re-placed); past `offline_s` → offline (its leases
   expire). Only healthy nodes are asked to bid: waiting on a node that stopped talking
   would stretch every round to the bid deadline.
2. A broker that starts presumes each node it holds placements for heard as long before
   now as the node had been silent when the broker started (`silences`: from the
   heartbeat stream's server timestamps, relative to the freshest of them, so an outage
   that silenced everyone counts against no one), but never less than `unreachable_s`
   before it would be offline: a stored heartbeat may be older than the node's last (one
   too big to store, one stored just before an outage), and a live node on a loaded
   machine may be late by more than a heartbeat - what the cluster grants any node before
   it stops counting on it, a starting broker grants every node before it declares one
   offline (Nomad's failover heartbeat TTL). A node the stream does not know is presumed
   heard at start.
3. Time the broker could not hear (`Deafness`: its connection down, its heartbeat feed
   losing its own probes) counts against no node: every clock is shifted by it.

`eligible` is asked on every auction, so it is kept, not recomputed: the sorted list stays
true until the quietest eligible node crosses `unreachable_s` (times only grow: a heartbeat
moves a node's time later, `shift` moves every time later) or a node outside it is heard.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum

from gavel.shared.messages import Heartbeat
from gavel.shared.timing import Timing

__all__ = ["Deafness", "Health", "Liveness", "silences"]


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

    def presume(self, node_id: str, now: float, silent_s: float = 0.0) -> None:
        """Count a node we hold placements for as heard `silent_s` before `now`, and at
        least `unreachable_s` short of offline (rule 2). A presumed node is not eligible
        until a real heartbeat arrives; the first presumption stands."""
        most = max(0.0, self.timing.offline_s - self.timing.unreachable_s)
        self.presumed.setdefault(node_id, now - min(max(0.0, silent_s), most))

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


def silences(stamps: Mapping[str, float], nodes: Iterable[str]) -> dict[str, float]:
    """Rule 2: how long each of `nodes` that has a stamp had been silent when the freshest
    stamp was taken. `stamps`: subject token -> the server time its newest heartbeat (or
    the broker's probe) was stored, seconds; only stamps are compared, never a local clock."""
    if not stamps:
        return {}
    freshest = max(stamps.values())
    return {n: freshest - stamps[n] for n in nodes if n in stamps}


class Deafness:
    """Rule 3: since when the observer could not hear, for each cause (its connection, its
    feed), and what it owes the nodes once every cause has ended."""

    def __init__(self) -> None:
        self._causes: dict[str, float] = {}
        self.since: float | None = None

    @property
    def deaf(self) -> bool:
        return self.since is not None

    def begin(self, cause: str, at: float) -> bool:
        """`cause` stops the observer hearing from `at`; True if it was hearing until now."""
        self._causes.setdefault(cause, at)
        was = self.since is None
        self.since = at if self.since is None else min(self.since, at)
        return was

    def end(self, cause: str, now: float) -> float | None:
        """`cause` is over; the seconds to shift every node's clock by once no cause is
        left (None while another goes on, or if `cause` had not begun)."""
        if self._causes.pop(cause, None) is None or self._causes or self.since is None:
            return None
        outage, self.since = max(0.0, now - self.since), None
        return outage
