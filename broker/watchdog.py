"""The watchdog: which promises have been broken by the clock.

Rules (every deadline comes from `Timing`; ``now`` is passed in — this module is pure):
1. Provisioning: a winner that has not confirmed (a `provisioning`/`running` report, or
   its heartbeat listing the instance) within `provisioning_s` of the award loses it.
2. Node health is `shared.health` rule 1's: once the node is offline each of its
   instances is re-auctioned or, out of attempts, `lost`.
3. Timeout backstop: an instance with ``timeout_s`` whose node has not reported its end by
   timeout + kill grace + lease grace is failed by the broker itself (the lease never
   expires under a task that is still legitimately running).
4. Cancel: a node that does not confirm a cancel within `cancel_grace_s` is overruled.
After a broker restart every clock starts at the restart (`Timers.resume`), so nothing is
revoked early; and a placement found in git is not a fresh award: its provisioning clock
starts only at its node's first heartbeat, so a node that is quiet for less than
`offline_s` keeps its instances whether or not the broker restarted meanwhile.
Each pass costs what is outstanding, not the size of the cluster: the clocks are kept per
instance that has one running, never found by scanning every placement.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from enum import StrEnum

from gavel.broker.ledger.state import State
from gavel.shared.health import Health, Liveness
from gavel.shared.timing import Timing

__all__ = ["Action", "Kind", "Timers", "due"]


class Kind(StrEnum):
    REVOKE = "revoke"
    EXPIRE = "expire"
    TIMEOUT = "timeout"
    CANCEL_EXPIRED = "cancel-expired"


@dataclass(frozen=True)
class Action:
    kind: Kind
    instance_id: str
    node_id: str


@dataclass
class Timers:
    """The clocks of promises in flight, per instance: (node, since/at)."""

    started: float
    awaiting: dict[str, tuple[str, float]] = field(default_factory=dict)
    deadlines: dict[str, tuple[str, float]] = field(default_factory=dict)
    cancel_at: dict[str, tuple[str, float]] = field(default_factory=dict)
    running: set[str] = field(default_factory=set)
    #: Placements found in git at a restart whose node has not been heard since: instance
    #: -> node, and the same indexed by node.
    resumed: dict[str, str] = field(default_factory=dict)
    resumed_on: dict[str, set[str]] = field(default_factory=dict)

    def placed(self, iid: str, node: str, now: float, timing: Timing,
               timeout_s: float | None) -> None:
        self.forget(iid)
        self.awaiting[iid] = (node, now)
        if timeout_s is not None:
            self.deadlines[iid] = (node, now + timeout_s + timing.kill_grace_s
                                   + timing.provisioning_s + timing.lease_grace_s)

    def accepted(self, iid: str) -> None:
        self.awaiting.pop(iid, None)

    def started_running(self, iid: str, node: str, now: float, timing: Timing,
                        timeout_s: float | None) -> None:
        self.awaiting.pop(iid, None)
        if iid in self.running:
            return
        self.running.add(iid)
        if timeout_s is not None:
            self.deadlines[iid] = (node, now + timeout_s + timing.kill_grace_s
                                   + timing.lease_grace_s)

    def cancelling(self, iid: str, node: str, now: float) -> None:
        self.cancel_at.setdefault(iid, (node, now))

    def heard(self, node: str, listed: Collection[str], now: float) -> None:
        """`node` heartbeated, listing `listed`: what it was resumed with and does not list
        now has `provisioning_s` from `now` to show up, like a fresh award."""
        for iid in self.resumed_on.pop(node, ()):
            del self.resumed[iid]
            if iid not in listed:
                self.awaiting[iid] = (node, now)

    def forget(self, iid: str) -> None:
        self.awaiting.pop(iid, None)
        self.deadlines.pop(iid, None)
        self.cancel_at.pop(iid, None)
        self.running.discard(iid)
        node = self.resumed.pop(iid, None)
        if node is not None:
            self.resumed_on[node].discard(iid)

    def resume(self, state: State, timing: Timing) -> None:
        """After a restart: every placement gets its clocks afresh from `started`."""
        for iid, node in state.where.items():
            rec = state.instances.get(iid)
            if rec is None:
                continue
            self.placed(iid, node, self.started, timing, rec.spec.timeout_s)
            del self.awaiting[iid]  # not until its node is heard (`heard`)
            self.resumed[iid] = node
            self.resumed_on.setdefault(node, set()).add(iid)
            if rec.cancelling:
                self.cancelling(iid, node, self.started)


def due(state: State, liveness: Liveness, timers: Timers, timing: Timing,
        now: float) -> list[Action]:
    out: list[Action] = []
    for node_id in sorted(state.nodes):
        if liveness.health(node_id, now) is Health.OFFLINE:
            out.extend(Action(Kind.EXPIRE, iid, node_id)
                       for iid in sorted(state.nodes[node_id].instances))
    expiring = {a.instance_id for a in out}

    def still(iid: str, node: str) -> bool:
        return iid not in expiring and state.where.get(iid) == node

    for iid, (node, at) in sorted(timers.cancel_at.items()):
        if still(iid, node) and now - at >= timing.cancel_grace_s:
            out.append(Action(Kind.CANCEL_EXPIRED, iid, node))
    cancelling = set(timers.cancel_at)
    for iid, (node, since) in sorted(timers.awaiting.items()):
        if iid not in cancelling and still(iid, node) and now - since >= timing.provisioning_s:
            out.append(Action(Kind.REVOKE, iid, node))
    for iid, (node, at) in sorted(timers.deadlines.items()):
        if iid not in cancelling and iid not in timers.awaiting and still(iid, node) \
                and now >= at:
            out.append(Action(Kind.TIMEOUT, iid, node))
    return out
