"""Systems: the broker part that keeps a system job's instance on every node that could run
it (`gavel.shared.systems` decides; this part commits it).

Rules:
1. A system job's intent is a service record (``services/<name>.json``, its spec's type
   ``system``): `gavel submit` and `gavel deploy` make or change it, `gavel stop` stops it,
   `gavel status NAME` shows it with its instances. Its instances are replica records
   (`InstanceRecord.service`) bound to their node (`InstanceRecord.only_node`).
2. Every pass decides again on its plan's own view, so a pass run twice, or a broker started
   again, starts no second instance on a node.
3. A node is judged by its heartbeats (health, labels, the drain it reports) and by the drain
   git holds. A node the broker has not heard since it started is not the job's until it is.
4. Each step is narrated: commit lines start ``system <name>:``, and the job's events carry
   its name: ``replaced`` for a new instance on a node (detail: which node), ``stopping``
   with the reason.
5. The job's deployment (a `gavel deploy` of a new version) succeeds once every node of the
   job runs an instance of the version and no other is left.
6. An instance that ended on its own backs its node off (`broker.keeper.Backoff`, in memory:
   a broker started again lets the first replacement go at once); once an instance runs
   there for `CALM_TICKS` ticks, the node's run of ends is forgotten.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from datetime import datetime

import msgspec

from gavel.broker.context import Context
from gavel.broker.keeper import CALM_TICKS, Backoff
from gavel.broker.ledger.committer import Item, Planned
from gavel.broker.ledger.plan import View, stop, submit
from gavel.broker.ledger.state import State, stamp
from gavel.broker.promises import Promises
from gavel.shared.health import Health
from gavel.shared.messages import EventType, InstanceState
from gavel.shared.reasons import Reason
from gavel.shared.records import InstanceRecord, ServiceRecord
from gavel.shared.systems import Decision, Node, Placed, decide, eligible

__all__ = ["Systems", "fleet", "is_system", "job_nodes"]

#: The reasons the job itself stops an instance for: such an end backs nothing off.
_OURS = frozenset({Reason.SYSTEM_NODE_LEFT.value, Reason.SUPERSEDED.value,
                   Reason.SERVICE_STOPPED.value, Reason.SCALED_DOWN.value})


def is_system(svc: ServiceRecord) -> bool:
    """A system job's record: this module keeps it, not the count keeper (`broker.services`)."""
    spec = svc.spec_of(svc.version)
    return spec is not None and spec.system


class Systems:
    def __init__(self, ctx: Context, promises: Promises, wall: Callable[[], datetime],
                 rng: random.Random | None = None) -> None:
        self.ctx = ctx
        self.promises = promises
        self.wall = wall
        #: Draws the random part of instance ids (OS-seeded, as a service's replicas').
        self.rng = rng or random.Random()
        self._busy: set[str] = set()
        #: (job, node) -> the back-off of its instances' own ends (rule 6), and the
        #: instances each job had live at the last pass, by node.
        self._backoff: dict[tuple[str, str], Backoff] = {}
        self._live: dict[str, dict[str, str]] = {}

    def nodes(self, state: State) -> dict[str, Node]:
        """Every node the broker has heard, as the decision sees it (rule 3)."""
        return fleet(self.ctx, state)

    def _decide(self, view: View | State, svc: ServiceRecord,
                recs: list[InstanceRecord]) -> Decision:
        spec = svc.spec_of(svc.version)
        if spec is None:
            return Decision()
        state = view.state if isinstance(view, View) else view
        live = [Placed(r.instance_id, r.only_node, r.version) for r in recs
                if not r.state.terminal and not r.cancelling]
        now = self.ctx.now()
        hold = {node for (name, node), b in self._backoff.items()
                if name == svc.name and b.holds(now)}
        return decide(spec.labels, svc.version, self.nodes(state), live, stopped=svc.stopped,
                      hold=hold)

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
        for name, svc in state.services.items():
            if not is_system(svc):
                continue
            self._observe(name, state.replicas_of(name))
            if name in self._busy:
                continue
            if not self._decide(state, svc, state.replicas_of(name)) and not _deploying(svc):
                continue
            self._busy.add(name)
            ctx.committer.submit(Item(plan=functools.partial(self._pass, name=name),
                                      failed=functools.partial(self._failed, name),
                                      retry=False))

    def _failed(self, name: str, _reason: Reason, _detail: str) -> None:
        self._busy.discard(name)

    def _pass(self, view: View, name: str) -> Planned | None:
        planned = self.keep(view, name)
        if planned is None:
            self._busy.discard(name)
            return None
        planned.after.append(lambda _sha: self._busy.discard(name))
        return planned

    def keep(self, view: View, name: str) -> Planned | None:
        """The decision for the system job `name` on `view`, applied to it."""
        svc = view.service(name)
        if svc is None or not is_system(svc):
            return None
        spec = svc.spec_of(svc.version)
        assert spec is not None
        d = self._decide(view, svc, view.replicas(name))
        out = Planned(lines=[])
        for node in d.start:
            iid = self._new_id(view, name)
            submit(view, InstanceRecord(instance_id=iid, spec=spec, service=name,
                                        version=svc.version, only_node=node))
            out.lines.append(f"system {name}: start {iid} on {node} (version {svc.version})")
            out.after.append(functools.partial(self._emit, name, EventType.REPLACED,
                                               detail=f"{iid} for {node}", node_id=node))
            out.after.append(functools.partial(self._started, name, iid, node))
        for iid, reason in d.stop:
            got = stop(view, iid, reason)
            if got is None:
                continue
            _rec, node = got
            out.lines.append(f"system {name}: stop {iid}"
                             + (f" on {node}" if node else "") + f": {reason}")
            out.after.append(functools.partial(self._stopped, name, iid, node, reason))
        dep = svc.deployment
        if not d and dep is not None and dep.state == "running":  # rule 5
            ended = msgspec.structs.replace(dep, state="succeeded", ended_at=stamp(self.wall()))
            view.put_service(msgspec.structs.replace(svc, deployment=ended,
                                                     healthy_version=svc.version))
            out.lines.append(f"system {name}: deployed version {svc.version}")
        if d.start:
            out.after.append(lambda _sha: self.ctx.wake())
        return out if out.lines else None

    def _started(self, name: str, iid: str, node: str, _sha: str) -> None:
        """An instance started: its end, even one before the next pass, is noticed (rule 6)."""
        self._live.setdefault(name, {})[iid] = node

    def _new_id(self, view: View, name: str) -> str:
        while True:
            iid = f"{name}-{self.rng.getrandbits(24):06x}"
            if view.instance(iid) is None:
                return iid

    def _stopped(self, name: str, iid: str, node: str, reason: Reason, _sha: str) -> None:
        if node:
            self.promises.send_cancel(iid, node)
        else:
            self.ctx.events.emit(iid, EventType.CANCELLED, reason=reason)
            self.promises.ended(iid)
        self._emit(name, EventType.STOPPING, reason=reason, detail=iid, node_id=node)

    def _emit(self, name: str, kind: EventType, _sha: str = "", reason: str = "",
              detail: str = "", node_id: str = "") -> None:
        self.ctx.events.emit(name, kind, node_id=node_id, reason=reason, detail=detail)


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
