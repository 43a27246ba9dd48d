"""The keeper's decisions: what a service needs done now, from its record and what is known
of its replicas. Pure: no clock, no I/O - `broker.services` passes in each replica's health
and age, applies the decision through a plan, and re-decides on the plan's own view, so a
decision taken twice changes nothing the second time.

Rules:
1. A service keeps `count` live replicas of its version. Missing ones start (a replica that
   ended is replaced by a new one, through a new auction; `Backoff` may hold the start). A
   stopped service keeps none: every replica stops (SERVICE_STOPPED).
2. Replicas of another version (a deploy, a rollback) are replaced `max_parallel` at a time:
   new replicas start while fewer than `max_parallel` of them are unsettled (not yet healthy
   for `min_healthy_s`), and an old replica stops (SUPERSEDED) only once a settled new one
   stands for it. Old and new together therefore never hold fewer healthy replicas than the
   old ones did - never fewer than `count - max_parallel`. With no old replica left there is
   nothing to protect: every missing replica starts at once.
3. Surplus replicas stop (SCALED_DOWN), in `stop_order`: those still waiting for a node,
   then the unhealthy, then the least settled; ties on the id.
4. A running deployment succeeds once `count` replicas of its version are settled and no
   old one is left; that version becomes `healthy_version` (and its `healthy_at` the
   time). It fails (DEPLOY_UNHEALTHY) when
   a new replica is not healthy `healthy_deadline_s` after it appeared, or one ended on its
   own (failed or exited) since the deployment began. With `auto_revert` and an earlier
   healthy version the service goes back to it, in a deployment of its own (ROLLED_BACK),
   which ends ``rolled-back`` and never reverts in turn.
5. Back-off (`Backoff`): the k-th replica of a service to end in a row holds its service's
   starts for ``tick * 2**(k-1)`` (at most `BACKOFF_MAX_TICKS` ticks); the run resets once
   the service has been whole and healthy for `CALM_TICKS` ticks (or `min_healthy_s`, if
   longer). So a replica killed once is replaced a tick later, a crash-looping version slows
   to one attempt every few minutes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from gavel.shared.reasons import Reason
from gavel.shared.records import Deployment, ServiceRecord

__all__ = ["BACKOFF_MAX_TICKS", "CALM_TICKS", "Backoff", "Decision", "Replica", "decide",
           "stop_order"]

#: The longest a start is held back after ends in a row, in ticks (rule 5).
BACKOFF_MAX_TICKS = 300
#: How long a whole, healthy service must stay so before its run of ends is forgotten.
CALM_TICKS = 10


@dataclass(frozen=True)
class Replica:
    """A live replica as the keeper sees it (one being stopped is not counted at all)."""

    instance_id: str
    version: int
    #: No node holds it yet (queued, unschedulable, in an auction).
    waiting: bool = False
    #: Seconds it has been healthy; None while it is not.
    healthy_for: float | None = None
    #: Seconds since it appeared (the deploy deadline's clock).
    age: float = 0.0

    def settled(self, min_healthy_s: float) -> bool:
        return self.healthy_for is not None and self.healthy_for >= min_healthy_s


@dataclass
class Decision:
    #: New replicas of the service's version to start now.
    start: int = 0
    #: Replicas of the version the service lacks (more than `start` when the back-off or
    #: `max_parallel` holds some back); None for a deployment's verdict, which starts and
    #: stops nothing itself.
    missing: int | None = None
    stop: list[tuple[str, Reason]] = field(default_factory=list)
    #: The service record as it is to be written (None: unchanged).
    record: ServiceRecord | None = None
    #: The deployment this decision ended, as it ended.
    ended: Deployment | None = None

    def __bool__(self) -> bool:
        return bool(self.start or self.stop or self.record is not None)


def stop_order(replicas: Sequence[Replica]) -> list[Replica]:
    """Which replicas go first when some must (rule 3)."""
    return sorted(replicas, key=lambda r: (not r.waiting, r.healthy_for is not None,
                                           r.healthy_for or 0.0, r.instance_id))


def decide(svc: ServiceRecord, replicas: Sequence[Replica], *, failed: Sequence[str] = (),
           hold: bool = False, stamp: str = "") -> Decision:
    """What `svc` needs now. `replicas`: its live replicas, bar those being stopped;
    `failed`: replicas of the deploying version that ended on their own since the deployment
    began (rule 4); `hold`: the back-off holds new starts; `stamp`: now, as an end stamp."""
    if svc.stopped:
        return Decision(stop=[(r.instance_id, Reason.SERVICE_STOPPED)
                              for r in stop_order(replicas)])
    spec = svc.spec_of(svc.version)
    if spec is None:  # the ledger reads no such record; nothing sensible to do with one
        return Decision()
    update = spec.update
    dep = svc.deployment
    new = [r for r in replicas if r.version == svc.version]
    old = [r for r in replicas if r.version != svc.version]
    deploying = dep is not None and dep.state == "running" and dep.to_version == svc.version
    if deploying:
        assert dep is not None
        late = [r.instance_id for r in new
                if r.healthy_for is None and r.age >= update.healthy_deadline_s]
        bad = [*failed, *late]
        if bad:
            return _failed(svc, dep, bad[0], stamp)
    out = Decision()
    n = svc.count
    if len(new) > n:  # rule 3
        order = stop_order(new)
        out.stop += [(r.instance_id, Reason.SCALED_DOWN) for r in order[:len(new) - n]]
        new = order[len(new) - n:]
    settled = [r for r in new if r.settled(update.min_healthy_s)]
    keep_old = n - len(settled)  # rule 2: the old ones no settled new one stands for yet
    if len(old) > keep_old:
        order = stop_order(old)
        extra = len(old) - keep_old
        surplus = min(extra, max(0, len(old) - n))
        out.stop += [(r.instance_id, Reason.SCALED_DOWN) for r in order[:surplus]]
        out.stop += [(r.instance_id, Reason.SUPERSEDED) for r in order[surplus:extra]]
        old = order[extra:]
    out.missing = n - len(new)
    if out.missing > 0 and not hold:
        room = out.missing
        if old:
            room = min(room, max(0, update.max_parallel - (len(new) - len(settled))))
        out.start = room
    if not old and len(new) == n and len(settled) == n:  # rule 4: whole and settled
        rec = svc
        if n > 0 and svc.healthy_version != svc.version:
            rec = msgspec.structs.replace(rec, healthy_version=svc.version, versions=[
                msgspec.structs.replace(v, healthy_at=stamp) if v.version == svc.version
                else v for v in svc.versions])
        if deploying:
            assert dep is not None
            state = "rolled-back" if dep.reason == Reason.ROLLED_BACK else "succeeded"
            out.ended = msgspec.structs.replace(dep, state=state, ended_at=stamp)
            rec = msgspec.structs.replace(rec, deployment=out.ended)
        if rec is not svc:
            out.record = rec
    return out


def _failed(svc: ServiceRecord, dep: Deployment, replica: str, stamp: str) -> Decision:
    """Rule 4: the deployment failed because of `replica`; revert when the spec says so."""
    ended = msgspec.structs.replace(dep, state="failed", ended_at=stamp,
                                    reason=str(Reason.DEPLOY_UNHEALTHY), detail=replica)
    spec = svc.spec_of(svc.version)
    back = svc.healthy_version
    if spec is not None and spec.update.auto_revert and dep.reason != Reason.ROLLED_BACK \
            and back and back != svc.version and svc.spec_of(back) is not None:
        revert = Deployment(to_version=back, from_version=svc.version, started_at=stamp,
                            reason=str(Reason.ROLLED_BACK),
                            detail=f"version {svc.version}: {Reason.DEPLOY_UNHEALTHY} "
                                   f"({replica})")
        return Decision(record=msgspec.structs.replace(svc, version=back, deployment=revert),
                        ended=ended)
    return Decision(record=msgspec.structs.replace(svc, deployment=ended), ended=ended)


@dataclass
class Backoff:
    """Rule 5, for one service: a run of ends and the time its starts are held until."""

    streak: int = 0
    until: float = float("-inf")
    calm_since: float | None = None

    @staticmethod
    def delay(k: int, tick_s: float) -> float:
        """How long the k-th end in a row holds the service's starts (k >= 1)."""
        return min(BACKOFF_MAX_TICKS * tick_s, tick_s * 2.0 ** max(0, k - 1))

    def ended(self, now: float, tick_s: float) -> None:
        self.streak += 1
        self.until = max(self.until, now + self.delay(self.streak, tick_s))
        self.calm_since = None

    def holds(self, now: float) -> bool:
        return now < self.until

    def observe(self, now: float, whole_and_healthy: bool, calm_s: float) -> None:
        """The service is (or is not) whole with every replica healthy right now."""
        if not whole_and_healthy:
            self.calm_since = None
            return
        if self.calm_since is None:
            self.calm_since = now
        if self.streak and now - self.calm_since >= calm_s:
            self.streak = 0
