"""The pure plans of services and system jobs: a pass's decision applied to the view it
reads, returning the change and the effects that follow it (`broker.effects`).

Rules:
1. A plan reads nothing but its arguments - the view and what its part knew as it submitted
   the pass (`KeepInputs`, `SystemInputs`: what it remembers of each replica, the
   back-off's verdict, the nodes and the health they said, the clock, the wall clock, the
   epoch, the seed the new ids are drawn from) - and decides again on its own view, so two
   plans in one commit, or a pass and an operator's change, start nothing twice
   (`broker.services` rule 1), and the same inputs on the same view plan the same change.
2. Everything a pass tells or notes waits for its commit, as values: the service's events
   (`Emit`, named as the service), a stopped replica's cancel and grace or its end
   (`stop_replica`), and the part's own notes - the replicas started (`Started`,
   `SystemStarted`), the ends replaced (`EndsTaken`), a deployment's outcome counted
   (`DeployEnded`) - which the parts handle once the commit is durable.
3. A stopped replica on a node is told to stop and its cancel grace armed, in that order of
   arming then telling (`promiseplans.plan_cancel`'s); one on no node ends at once.
4. A service's plan reads every replica in steps (`plan_keep_in_steps`, `broker.steps`): the
   committer gives the loop a turn between them, and the result is `plan_keep`'s, which runs
   the same steps in one go.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec

from gavel.broker.admission import live_instances
from gavel.broker.effects import Arm, Effect, Emit, Release, Timer
from gavel.broker.keeper import Decision, Replica, decide
from gavel.broker.ledger.committer import Planned
from gavel.broker.ledger.plan import View, stop, submit
from gavel.broker.ledger.state import State, parse_stamp
from gavel.broker.promiseplans import stop_message
from gavel.broker.steps import Steps, at_once, chunks
from gavel.shared.admission import Caps, room
from gavel.shared.messages import EventType, InstanceState
from gavel.shared.reasons import Reason
from gavel.shared.records import InstanceRecord, ServiceRecord
from gavel.shared.systems import Decision as SystemDecision
from gavel.shared.systems import Node, Placed
from gavel.shared.systems import decide as decide_system

__all__ = ["Clocks", "DeployEnded", "Ended", "EndsTaken", "KeepInputs", "Started",
           "SystemInputs", "SystemStarted", "decision", "decision_in_steps", "is_system",
           "plan_keep", "plan_keep_in_steps", "plan_system", "replicas", "replicas_in_steps",
           "stop_replica", "system_decision"]

_T = TypeVar("_T")

#: Ends a deploying version's replica may come to on its own (keeper rule 4).
_OWN_ENDS = frozenset({InstanceState.FAILED, InstanceState.SUCCEEDED})


def is_system(svc: ServiceRecord) -> bool:
    """A system job's record: `broker.systems` keeps it, not the count keeper."""
    spec = svc.spec_of(svc.version)
    return spec is not None and spec.system


# -- the parts' own effects ----------------------------------------------------------------
@dataclass(frozen=True)
class Started:
    """Replicas of the service `name` started at `at` (their deadline clocks run from
    then)."""

    name: str
    made: tuple[str, ...]
    at: float


@dataclass(frozen=True)
class SystemStarted:
    """Instances of the system job `name` started, each bound to its node."""

    name: str
    on: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class EndsTaken:
    """The first `taken` ends of `name` waiting for a replacement were replaced; `settled`:
    nothing is missing any more, so the rest need none."""

    name: str
    taken: int
    settled: bool


@dataclass(frozen=True)
class DeployEnded:
    """A deployment ended so (`succeeded`, `failed`, `rolled-back`, `cancelled`)."""

    outcome: str


#: A replica that ended on its own and waits for its replacement: id, state, why.
Ended = tuple[str, str, str]


@dataclass(frozen=True)
class Clocks:
    """What a part remembers of its replicas, read by a plan and never changed by it."""

    first_seen: Mapping[str, float] = field(default_factory=dict)
    healthy_since: Mapping[str, float] = field(default_factory=dict)
    #: New copies a re-auction is moving replicas to, and the replica each replaces
    #: (`broker.reauction` rule 5): counted once they stand for it, not before.
    moving: Mapping[str, str] = field(default_factory=dict)

    def of(self, ids: Sequence[str]) -> Clocks:
        """A copy holding the clocks of the replicas `ids`: what a plan over them reads."""
        return Clocks(_copy(self.first_seen, ids), _copy(self.healthy_since, ids),
                      _copy(self.moving, ids))


def _copy(held: Mapping[str, _T], ids: Sequence[str]) -> dict[str, _T]:
    """`held`'s entries for `ids`: the whole map copied at once when they are a good part
    of it (a service of most of the replicas: a copy in C is many times faster than one
    entry at a time), else entry by entry."""
    if len(held) <= 8 * len(ids):
        return dict(held)
    return {i: held[i] for i in ids if i in held}


@dataclass(frozen=True)
class KeepInputs:
    """What a service's pass reads besides its view (rule 1)."""

    #: The broker's clock and the wall clock as git stamps it (`ledger.state.stamp`).
    now: float
    stamp: str
    #: The leadership's epoch, for the stop messages.
    epoch: int
    #: The new replicas' ids are drawn from `random.Random(seed)`.
    seed: int
    #: Starts at most (`broker.services` rule 6).
    start_chunk: int
    #: The back-off holds the replacements; the ends that wait for one, oldest first.
    hold: bool = False
    ended: tuple[Ended, ...] = ()
    clocks: Clocks = field(default_factory=Clocks)


@dataclass(frozen=True)
class SystemInputs:
    """What a system job's pass reads besides its view (rule 1)."""

    #: Every node the broker has heard, as the decision sees it (`broker.systems` rule 3).
    nodes: Mapping[str, Node]
    stamp: str
    epoch: int
    seed: int
    #: Nodes backed off, and the job's instances known healthy (`broker.systems` rule 5).
    hold: AbstractSet[str] = frozenset()
    settled: AbstractSet[str] = frozenset()
    #: The operator's caps: no instance is started past the cluster's.
    caps: Caps | None = None


# -- shared steps --------------------------------------------------------------------------
def stop_replica(view: View, name: str, iid: str, reason: Reason,
                 epoch: int) -> tuple[InstanceRecord, str, list[Effect]] | None:
    """Rule 3: stop `iid` of `name` in `view`; its record, the node it was on ("" none) and
    what follows (ending with the service's own ``stopping`` event), or None if it ended
    already."""
    got = stop(view, iid, reason)
    if got is None:
        return None
    rec, node = got
    told: list[Effect] = [Arm(Timer.CANCEL_GRACE, iid, node),
                          stop_message(iid, node, view.placement(iid), epoch)] if node else \
        [Emit(iid, EventType.CANCELLED, reason=reason), Release(iid)]
    return rec, node, [*told, Emit(name, EventType.STOPPING, node_id=node, reason=reason,
                                   detail=iid)]


def new_id(view: View, name: str, rng: random.Random) -> str:
    while True:
        iid = f"{name}-{rng.getrandbits(24):06x}"
        if view.instance(iid) is None:
            return iid


# -- services ------------------------------------------------------------------------------
def replicas(view: View | State, recs: list[InstanceRecord], clocks: Clocks,
             now: float) -> list[Replica]:
    """The keeper's view of the live replicas not being stopped."""
    return at_once(replicas_in_steps(view, recs, clocks, now))


def replicas_in_steps(view: View | State, recs: list[InstanceRecord], clocks: Clocks,
                      now: float) -> Steps[list[Replica]]:
    """`replicas`, in steps (rule 4)."""
    out = []
    placed_on = view.placed_on if isinstance(view, View) else view.placement_of
    for part in chunks(recs):
        for r in part:
            if r.state.terminal or r.cancelling or \
                    _replacing(view, clocks.moving.get(r.instance_id)):
                continue
            iid = r.instance_id
            waiting = placed_on(iid) is None
            since = None if waiting else clocks.healthy_since.get(iid)
            out.append(Replica(instance_id=iid, version=r.version, waiting=waiting,
                               healthy_for=None if since is None else now - since,
                               age=now - clocks.first_seen.get(iid, now)))
        yield
    return out


def _replacing(view: View | State, old: str | None) -> bool:
    """A new copy of a move stands for the replica `old` it replaces only once that one is
    stopping or gone in `view` (`broker.reauction` rule 5)."""
    if old is None:
        return False
    rec = view.instance(old) if isinstance(view, View) else view.instances.get(old)
    return rec is not None and not rec.state.terminal and not rec.cancelling


def failed_new(svc: ServiceRecord, recs: list[InstanceRecord]) -> list[str]:
    """Replicas of the deploying version that ended on their own since it began."""
    dep = svc.deployment
    if dep is None or dep.state != "running":
        return []
    began = parse_stamp(dep.started_at)
    out = []
    for r in recs:
        if r.version != dep.to_version or r.state not in _OWN_ENDS:
            continue
        at = parse_stamp(r.ended_at)  # none yet: it ended in the commit being planned
        if at is None or began is None or at >= began:
            out.append(r.instance_id)
    return out


def decision(view: View | State, svc: ServiceRecord, recs: list[InstanceRecord],
             clocks: Clocks, *, hold: bool, now: float, stamp: str) -> Decision:
    return at_once(decision_in_steps(view, svc, recs, clocks, hold=hold, now=now, stamp=stamp))


def decision_in_steps(view: View | State, svc: ServiceRecord, recs: list[InstanceRecord],
                      clocks: Clocks, *, hold: bool, now: float, stamp: str
                      ) -> Steps[Decision]:
    """`decision`, in steps (rule 4)."""
    mine = yield from replicas_in_steps(view, recs, clocks, now)
    return decide(svc, mine, failed=failed_new(svc, recs), hold=hold, stamp=stamp)


def plan_keep(view: View, name: str, inputs: KeepInputs) -> Planned | None:
    """The keeper's decision for the service `name` on `view`, applied to it: at most
    `start_chunk` starts, each replacing the next of `ended` while there are some."""
    return at_once(plan_keep_in_steps(view, name, inputs))


def plan_keep_in_steps(view: View, name: str, inputs: KeepInputs) -> Steps[Planned | None]:
    """`plan_keep`, in steps (rule 4): its reading of every replica yields; what it writes,
    it writes in one go."""
    svc = view.service(name)
    if svc is None or is_system(svc):
        return None
    recs = yield from view.replicas_in_steps(name)
    d = yield from decision_in_steps(view, svc, recs, inputs.clocks, hold=inputs.hold,
                                     now=inputs.now, stamp=inputs.stamp)
    if not d:
        return None
    return _keep(view, name, svc, d, inputs)


def _keep(view: View, name: str, svc: ServiceRecord, d: Decision,
          inputs: KeepInputs) -> Planned:
    """The keeper's decision `d` for the service `name` (`svc` on `view`), applied to it."""
    now, ended, epoch = inputs.now, inputs.ended, inputs.epoch
    rng = random.Random(inputs.seed)
    out = Planned(lines=[])
    verdict = Planned(lines=[])
    if d.record is not None:
        view.put_service(d.record)
        _narrate(verdict, svc, d)
    target = d.record or svc
    spec = target.spec_of(target.version)
    made: list[str] = []
    starts = min(d.start, inputs.start_chunk) if spec is not None else 0  # services rule 6
    for _ in range(starts):
        assert spec is not None
        iid = new_id(view, name, rng)
        submit(view, InstanceRecord(instance_id=iid, spec=spec, service=name,
                                    version=target.version))
        if len(made) < len(ended):
            old, state, why = ended[len(made)]
            out.lines.append(f"service {name}: replace {old} ({state}: {why}) with {iid}")
            out.effects.append(Emit(name, EventType.REPLACED, reason=why,
                                    detail=f"{old} ({state}) by {iid}"))
        else:
            out.lines.append(f"service {name}: start {iid} (version {target.version})")
        made.append(iid)
    settled = d.missing is not None and d.missing - starts <= 0
    if ended and (made or settled):
        out.effects.append(EndsTaken(name, min(len(made), len(ended)), settled))
    for iid, reason in d.stop:
        got = stop_replica(view, name, iid, reason, epoch)
        if got is None:
            continue
        rec, node, effects = got
        out.lines.append(f"service {name}: stop {iid} (version {rec.version}"
                         + (f" on {node}" if node else "") + f"): {reason}")
        out.effects += effects
    out.effects.append(Started(name, tuple(made), now))
    out.lines += verdict.lines  # the steps, then what they came to
    out.effects += verdict.effects
    return out


def _narrate(out: Planned, before: ServiceRecord, d: Decision) -> None:
    """Lines, events and the outcome's count for a change of the service record itself."""
    after = d.record
    assert after is not None
    name, ended = after.name, d.ended
    if ended is not None and ended.state == "failed":
        line = (f"service {name}: deploy of version {ended.to_version} failed: "
                f"{Reason.DEPLOY_UNHEALTHY} ({ended.detail})")
        out.effects.append(Emit(name, EventType.DEPLOY_FAILED, reason=Reason.DEPLOY_UNHEALTHY,
                                detail=f"version {ended.to_version}: {ended.detail}"))
        if after.version != before.version:
            line += f"; rolling back to version {after.version}"
            out.effects.append(Emit(name, EventType.DEPLOYING, reason=Reason.ROLLED_BACK,
                                    detail=f"version {after.version} (from {before.version})"))
        out.lines.append(line)
    elif ended is not None:
        what = "rolled back to" if ended.state == "rolled-back" else "deployed"
        out.lines.append(f"service {name}: {what} version {ended.to_version}: "
                         f"{after.count} replicas healthy")
        out.effects.append(Emit(name, EventType.DEPLOYED,
                                reason=Reason.ROLLED_BACK if ended.state == "rolled-back"
                                else "", detail=f"version {ended.to_version}"))
    elif after.healthy_version != before.healthy_version:
        out.lines.append(f"service {name}: version {after.healthy_version} is healthy "
                         f"({after.count} replicas)")
    if ended is not None:
        out.effects.append(DeployEnded(ended.state))


# -- system jobs ---------------------------------------------------------------------------
def system_decision(view: View | State, svc: ServiceRecord, recs: list[InstanceRecord],
                    nodes: Mapping[str, Node], hold: AbstractSet[str],
                    settled: AbstractSet[str] = frozenset(),
                    caps: Caps | None = None) -> SystemDecision:
    """`shared.systems.decide` for the job: its version rolls `update.max_parallel` nodes
    at a time, gated on `settled` (its instances known healthy); it starts no instance past
    the cluster cap of `caps` over the live instances `view` leaves (`shared.systems`
    rule 7)."""
    spec = svc.spec_of(svc.version)
    if spec is None:
        return SystemDecision()
    live = [Placed(r.instance_id, r.only_node, r.version) for r in recs
            if not r.state.terminal and not r.cancelling]
    return decide_system(spec.labels, svc.version, dict(nodes), live, stopped=svc.stopped,
                         hold=hold, max_parallel=spec.update.max_parallel, settled=settled,
                         room=None if caps is None else room(caps, live=live_instances(view)))


def plan_system(view: View, name: str, inputs: SystemInputs) -> Planned | None:
    """The decision for the system job `name` on `view` (its nodes as the broker hears them,
    those backed off, its instances known healthy, the operator's caps, whose cluster cap
    it starts nothing past), applied to it."""
    svc = view.service(name)
    if svc is None or not is_system(svc):
        return None
    spec = svc.spec_of(svc.version)
    assert spec is not None
    d = system_decision(view, svc, view.replicas(name), inputs.nodes, inputs.hold,
                        inputs.settled, inputs.caps)
    rng, stamp, epoch = random.Random(inputs.seed), inputs.stamp, inputs.epoch
    out = Planned(lines=[])
    made: list[str] = []
    for node in d.start:
        iid = new_id(view, name, rng)
        submit(view, InstanceRecord(instance_id=iid, spec=spec, service=name,
                                    version=svc.version, only_node=node))
        made.append(iid)
        out.lines.append(f"system {name}: start {iid} on {node} (version {svc.version})")
        out.effects.append(Emit(name, EventType.REPLACED, node_id=node,
                                detail=f"{iid} for {node}"))
    if made:
        out.effects.append(SystemStarted(name, tuple(zip(made, d.start, strict=True))))
    for iid, reason in d.stop:
        got = stop_replica(view, name, iid, reason, epoch)
        if got is None:
            continue
        _rec, node, effects = got
        out.lines.append(f"system {name}: stop {iid}" + (f" on {node}" if node else "")
                         + f": {reason}")
        out.effects += effects
    dep = svc.deployment
    older = any(r.version != svc.version and not r.state.terminal
                for r in view.replicas(name))  # still rolling (`shared.systems` rule 6)
    if not d and not older and dep is not None and dep.state == "running":  # systems rule 5
        done = msgspec.structs.replace(dep, state="succeeded", ended_at=stamp)
        view.put_service(msgspec.structs.replace(svc, deployment=done,
                                                 healthy_version=svc.version))
        out.lines.append(f"system {name}: deployed version {svc.version}")
    return out if out.lines else None
