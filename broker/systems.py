"""Systems: the broker part that keeps a system job's instance on every node that could run
it (`gavel.shared.systems` decides; this part commits it).

Rules:
1. A system job's intent is a service record (``services/<name>.json``, its spec's type
   ``system``): `gavel submit` and `gavel deploy` make or change it, `gavel stop` stops it,
   `gavel status NAME` shows it with its instances. Its instances are replica records
   (`InstanceRecord.service`) bound to their node (`InstanceRecord.only_node`).
2. Every pass decides again on its plan's own view, so a pass run twice, or a broker started
   again, starts no second instance on a node.
3. A node is judged (`gavel.shared.systems` rules 1 and 3) by its heartbeats (health,
   labels, the drain it reports) and by the drain git holds.
4. Each step is narrated: commit lines start ``system <name>:``, and the job's events carry
   its name: ``replaced`` for a new instance on a node (detail: which node), ``stopping``
   with the reason.
5. The job's deployment (a `gavel deploy` of a new version) rolls `update.max_parallel`
   nodes at a time (`gavel.shared.systems` rule 6): a node's instance of the new version is
   settled once healthy as its node last said (`Promises.health`; with no checks, once it
   runs). It succeeds once every node of the job runs an instance of the version and no
   other is left.
6. An instance that ended on its own backs its node off (`broker.keeper.Backoff`, in memory:
   a broker started again lets the first replacement go at once); once an instance runs
   there for `CALM_TICKS` ticks, the node's run of ends is forgotten.
7. The broker's `--max-instances` holds for the job's instances (`gavel.shared.systems`
   rule 7): a node whose instance would pass it gets none yet, `gavel status NAME` names it
   with the submit's refusal (`ServiceStatus.capped`), and a later pass makes it once an
   instance ends or a broker started with a higher cap leads.
8. A pass's plan (`serviceplans.plan_system`) reads what the pass decided on
   (`SystemInputs`: the nodes as heard, the back-off, the instances settled, the wall
   clock, the epoch, a seed for the new ids), never this part while planning.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from datetime import datetime

from gavel.broker.admission import live_instances
from gavel.broker.context import Context
from gavel.broker.keeper import CALM_TICKS, Backoff
from gavel.broker.ledger.state import State, stamp
from gavel.broker.onepass import OnePass
from gavel.broker.promises import Promises
from gavel.broker.serviceplans import (
    SystemInputs,
    SystemStarted,
    is_system,
    plan_system,
    system_decision,
)
from gavel.shared.admission import Caps, refusal
from gavel.shared.health import Health
from gavel.shared.messages import Health as InstanceHealth
from gavel.shared.messages import InstanceState
from gavel.shared.reasons import Reason
from gavel.shared.records import InstanceRecord, ServiceRecord
from gavel.shared.systems import Decision as SystemDecision
from gavel.shared.systems import Node, eligible

__all__ = ["Systems", "fleet", "is_system", "job_nodes"]

#: The reasons the job itself stops an instance for: such an end backs nothing off.
_OURS = frozenset({Reason.SYSTEM_NODE_LEFT.value, Reason.SUPERSEDED.value,
                   Reason.SERVICE_STOPPED.value, Reason.SCALED_DOWN.value})


class Systems:
    def __init__(self, ctx: Context, promises: Promises, wall: Callable[[], datetime],
                 rng: random.Random | None = None, caps: Caps | None = None) -> None:
        self.ctx = ctx
        #: The operator's caps: no instance is started past the cluster's (rule 7).
        self.caps = caps
        #: Job -> its nodes the cluster cap keeps waiting, and why, as the last pass saw.
        self._capped: dict[str, dict[str, str]] = {}
        self.promises = promises
        self.wall = wall
        #: Draws the random part of instance ids (OS-seeded, as a service's replicas').
        self.rng = rng or random.Random()
        #: One pass in flight per job (`broker.onepass`).
        self.passes = OnePass(ctx.committer)
        #: (job, node) -> the back-off of its instances' own ends (rule 6), and the
        #: instances each job had live at the last pass, by node.
        self._backoff: dict[tuple[str, str], Backoff] = {}
        self._live: dict[str, dict[str, str]] = {}
        ctx.committer.effects.on(SystemStarted, self._started)

    def nodes(self, state: State) -> dict[str, Node]:
        """Every node the broker has heard, as the decision sees it (rule 3)."""
        return fleet(self.ctx, state)

    def _hold(self, name: str) -> set[str]:
        now = self.ctx.now()
        return {node for (job, node), b in self._backoff.items() if job == name and b.holds(now)}

    def _observe(self, name: str, recs: list[InstanceRecord]) -> None:
        """Rule 6: an instance that ended on its own since the last pass backs its node off;
        one running calms it."""
        now, tick = self.ctx.now(), self.ctx.timing.tick_s
        by_id = {r.instance_id: r for r in recs}
        live = self._live.setdefault(name, {})
        for iid, node in list(live.items()):
            rec = by_id.get(iid)
            if rec is None or not rec.state.terminal:
                continue  # not yet in this pass's state (just started), or still live
            del live[iid]
            if rec.reason not in _OURS:
                self._backoff.setdefault((name, node), Backoff()).ended(now, tick)
        live.update((r.instance_id, r.only_node) for r in recs if not r.state.terminal)
        running = {r.only_node for r in recs if r.state is InstanceState.RUNNING}
        for (job, node), b in self._backoff.items():
            if job == name:
                b.observe(now, node in running, CALM_TICKS * tick)

    def watch(self) -> None:
        """One pass over every system job (rule 2)."""
        ctx = self.ctx
        if ctx.ledger.pinned:
            return
        state = ctx.ledger.state()
        for name in [n for n in self._capped if n not in state.services]:
            del self._capped[name]
        for name, svc in state.services.items():
            if not is_system(svc):
                continue
            recs = state.replicas_of(name)
            self._observe(name, recs)
            if self.passes.busy(name):
                continue
            nodes, hold, settled = self.nodes(state), self._hold(name), self.settled(recs)
            d = system_decision(state, svc, recs, nodes, hold, settled, self.caps)
            self._note_capped(name, state, d)
            if not d and not _deploying(svc):
                continue
            self.passes.submit(name, functools.partial(plan_system, name=name, inputs=SystemInputs(
                nodes=nodes, stamp=stamp(self.wall()), epoch=ctx.leader.epoch,
                seed=self.rng.getrandbits(64), hold=hold, settled=settled, caps=self.caps)))

    def _note_capped(self, name: str, state: State, d: SystemDecision) -> None:
        """Rule 7: the nodes the cap keeps waiting, each with the refusal a submit of them
        would get once the nodes given theirs have them."""
        why = "" if not d.capped or self.caps is None else refusal(
            self.caps, live=live_instances(state) + len(d.start), adding=len(d.capped))
        self._capped[name] = dict.fromkeys(d.capped, why or str(Reason.OVER_CLUSTER_CAP))

    def capped(self, name: str) -> dict[str, str]:
        """The nodes of the system job `name` that wait at the cluster cap, and why."""
        return dict(self._capped.get(name, {}))

    def settled(self, recs: list[InstanceRecord]) -> set[str]:
        """Rule 5: the live instances known healthy - as their nodes last said, or, with no
        checks, running."""
        out = set()
        for r in recs:
            if r.state.terminal:
                continue
            note = self.promises.health.get(r.instance_id)
            if (note.health == InstanceHealth.HEALTHY if note is not None else not r.spec.checks
                    and self.promises.live.get(r.instance_id) == InstanceState.RUNNING):
                out.add(r.instance_id)
        return out

    def _started(self, e: SystemStarted, _sha: str) -> None:
        """Instances started: an end of theirs, even before the next pass, is noticed
        (rule 6); the next pass places them."""
        self._live.setdefault(e.name, {}).update(e.on)
        self.ctx.wake()


def fleet(ctx: Context, state: State) -> dict[str, Node]:
    """Every node the broker has heard, as a system job's decision sees it (rule 3)."""
    liveness = ctx.liveness
    now = ctx.now()
    out = {}
    for nid in sorted(set(liveness.known()) | set(liveness.presumed)):
        hb = liveness.heartbeats.get(nid)
        health = liveness.health(nid, now)
        out[nid] = Node(labels=hb.labels if hb else None, healthy=health == Health.HEALTHY,
                        offline=health == Health.OFFLINE,
                        draining=bool(hb and hb.draining) or nid in state.draining)
    return out


def job_nodes(ctx: Context, state: State, svc: ServiceRecord) -> list[str]:
    """The nodes the system job `svc` is to run on now: healthy and the job's (what `gavel
    submit --wait` waits for an instance running on)."""
    spec = svc.spec_of(svc.version)
    if spec is None or svc.stopped:
        return []
    return [n for n, node in fleet(ctx, state).items()
            if node.healthy and eligible(spec.labels, node)]


def _deploying(svc: ServiceRecord) -> bool:
    return svc.deployment is not None and svc.deployment.state == "running"
