"""The watchdog: which promises have been broken by the clock.

Rules (every deadline comes from `Timing`; ``now`` is passed in — this module is pure):
1. Provisioning: a winner that has not confirmed (a `provisioning`/`running` report, or
   its heartbeat listing the instance) within `provisioning_s` of the award loses it.
2. Node health: an unreachable node's instances are left alone; once the node is offline
   its leases expire and each instance is re-auctioned or, out of attempts, `lost`.
3. Timeout backstop: an instance with ``timeout_s`` whose node has not reported its end by
   timeout + kill grace + lease grace is failed by the broker itself (the lease never
   expires under a task that is still legitimately running).
4. Cancel: a node that does not confirm a cancel within `cancel_grace_s` is overruled.
After a broker restart every clock starts at the restart, so nothing is revoked early.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from broker.ledger import State
from shared.health import Health, Liveness
from shared.messages import InstanceState
from shared.timing import Timing

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
    """What the broker remembers about promises in flight (re-derivable: restarts reset)."""

    started: float
    placed_at: dict[str, float] = field(default_factory=dict)
    accepted: set[str] = field(default_factory=set)
    running_at: dict[str, float] = field(default_factory=dict)
    cancel_at: dict[str, float] = field(default_factory=dict)

    def forget(self, iid: str) -> None:
        self.placed_at.pop(iid, None)
        self.accepted.discard(iid)
        self.running_at.pop(iid, None)
        self.cancel_at.pop(iid, None)


def due(state: State, liveness: Liveness, timers: Timers, timing: Timing,
        now: float) -> list[Action]:
    out: list[Action] = []
    offline = {n for n in state.nodes if liveness.health(n, now) is Health.OFFLINE}
    for node_id in sorted(state.nodes):
        for iid in sorted(state.nodes[node_id].instances):
            rec = state.instances.get(iid)
            if rec is None or rec.state is not InstanceState.PLACED or rec.node_id != node_id:
                continue
            if node_id in offline:
                out.append(Action(Kind.EXPIRE, iid, node_id))
                continue
            placed = timers.placed_at.get(iid, timers.started)
            if rec.cancelling:
                if now - timers.cancel_at.get(iid, timers.started) >= timing.cancel_grace_s:
                    out.append(Action(Kind.CANCEL_EXPIRED, iid, node_id))
                continue
            if iid not in timers.accepted:
                if now - placed >= timing.provisioning_s:
                    out.append(Action(Kind.REVOKE, iid, node_id))
                continue
            limit = rec.spec.timeout_s
            if limit is not None:
                began = timers.running_at.get(iid, placed)
                if now - began >= limit + timing.kill_grace_s + timing.lease_grace_s:
                    out.append(Action(Kind.TIMEOUT, iid, node_id))
    return out
