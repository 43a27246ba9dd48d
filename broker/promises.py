"""Keeping the promises a placement makes: reports from workers, the watchdog's verdicts,
cancel, drain and migration.

Rules:
1. A worker's report counts only for an instance git places on that very node, and only for
   the attempt placed there: anything else is counted and dropped (a fenced or
   impersonating node changes nothing, and neither does the late end of an earlier attempt
   on the same node - a copy the broker gave up on, stopping after the instance was placed
   there again - which would otherwise end the attempt that runs now). A report that names
   no attempt (0) is taken as the current one's.
2. Every change goes through a plan (compare-and-swap on the instance's state) and the
   group committer: a late event racing an expiry resolves to exactly one of them.
3. Only failures that could succeed elsewhere (driver failed to start, its node restarted it
   as often as its restart policy allows) spend an attempt and re-auction; a process that
   ran and failed with no restarts allowed, or timed out, fails. An instance its worker
   stopped as it shut down is re-auctioned without spending one: not the instance's fault.
4. A running instance's health is what its node last said, in an event (``healthy``,
   ``unhealthy`` with the check and its output, ``restarted``) or a heartbeat; a heartbeat
   keeps the check an event named while the health it says is the same. Heartbeats and
   events reach the broker by different ways (the heartbeat stream, the report subject),
   so a heartbeat the node took before an event the broker has heard (it counts fewer
   events than that one's `seq`) says nothing of health.
5. A cancel records why it was asked (the operator, or a service scaling down, stopping or
   replacing a replica): the end its node confirms keeps that reason - in the record and in
   the event everyone reads, where the node can only say it was cancelled - and one the
   broker overrules after the grace keeps it as its detail.
6. A drain with a deadline moves, at the deadline, whatever still runs on the node (one by
   one, as ``--migrate`` does); the deadline lives in the broker's memory, so a broker
   restarted before it passes forgets it (the node stays drained). Undraining a node takes
   it out of every instance's exclusion list: the reason it was excluded is gone.
7. What a node's newest stored heartbeat said when this broker started (the heartbeat
   stream keeps it) is recalled for `status` alone, until the node is heard again: a
   restarted broker shows running and healthy what its nodes last said was, not "placed"
   for a heartbeat's time; it is no heartbeat heard now, so no clock and no decision
   (a service's health, a provisioning deadline) takes it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from gavel.broker.context import Context
from gavel.broker.ledger.committer import Item, Planned
from gavel.broker.ledger.plan import (
    View,
    block_ports,
    finish,
    record_ports,
    requeue,
    set_cancelling,
    set_draining,
    unblock_ports,
    unexclude,
)
from gavel.broker.watchdog import Action, Kind, due
from gavel.shared import subjects
from gavel.shared.lifecycle import PENDING
from gavel.shared.messages import (
    Cancel,
    Event,
    EventType,
    Health,
    InstanceReport,
    InstanceState,
)
from gavel.shared.reasons import Reason
from gavel.shared.records import Assignment
from gavel.transport.inbound import Door, Guard
from gavel.transport.wire import Received

__all__ = ["Promises"]

#: The event types a worker reports about its own instances; any other is rejected.
REPORTED = frozenset({EventType.PROVISIONING, EventType.RUNNING, EventType.EXITED,
                      EventType.FAILED, EventType.CANCELLED, EventType.HEALTHY,
                      EventType.UNHEALTHY, EventType.RESTARTED})


@dataclass(frozen=True)
class HealthNote:
    """A running instance's health as its node last said (an event or a heartbeat)."""

    health: Health
    #: The check that decided, and its output, for ``unhealthy``.
    check: str = ""
    #: The broker's clock when the instance entered this health.
    since: float = 0.0
    restarts: int = 0
    #: Why its last run ended, as the node said when it restarted it (a fixed reason and
    #: its detail; "" before any restart): `status` says it while the instance runs again.
    reason: str = ""
    detail: str = ""

#: Worker-reported failures that could succeed on another node: they consume an attempt.
RETRYABLE = frozenset({Reason.DRIVER_FAILED.value, Reason.NO_ROOM_PORTS.value,
                       Reason.WORKER_STOPPED.value, Reason.RESTARTS_EXHAUSTED.value})


#: The healths a heartbeat may say ("" says nothing: the node runs no checks for it yet).
_HEALTHS = frozenset(h.value for h in Health if h is not Health.UNKNOWN)


class Promises:
    def __init__(self, ctx: Context, capacity_freed: Callable[[], None]) -> None:
        self.ctx = ctx
        #: Waiting work may fit now (the auctioneer retries it at once).
        self.capacity_freed = capacity_freed
        self._guard = Guard("event", Event, ctx.rejects, node=subjects.node_of,
                            door=Door(ctx.rejects, subjects.REPORT_ALL))
        self.acting: set[tuple[Kind, str]] = set()
        self.migrating: dict[str, list[str]] = {}
        #: Draining node -> the broker's clock when what still runs there is moved (rule 6).
        self.drain_deadlines: dict[str, float] = {}
        self.live: dict[str, str] = {}  # instance -> provisioning/running, from reports
        #: Instance -> its health, from reports and heartbeats (memory only: re-heard).
        self.health: dict[str, HealthNote] = {}
        #: Node -> what its newest heartbeat stored before this broker started said of each
        #: instance (rule 7), until the node is heard now.
        self.recalled: dict[str, dict[str, InstanceReport]] = {}
        #: Node -> the highest `Event.seq` heard from it since it last started (rule 4).
        self.reported: dict[str, int] = {}
        self._unblocking: set[str] = set()  # nodes with an unblocking commit in flight

    # -- reports -------------------------------------------------------------------------
    def on_report(self, msg: Received) -> None:
        ctx = self.ctx
        ev = self._guard(msg)
        if ev is None:
            return
        node = ev.node_id
        state = ctx.ledger.state()
        if state.placement_of(ev.instance_id) != node:
            ctx.rejects.count("event for an instance not placed on that node", msg.subject)
            return
        if not _current(ev, state.placement(ev.instance_id)):
            ctx.rejects.count("event for an earlier attempt of the instance", msg.subject)
            return
        if ev.type not in REPORTED:  # checked before it is recorded or published
            ctx.rejects.count("event of an unknown type", msg.subject)
            return
        if ev.type == EventType.CANCELLED:  # rule 5: the stop's own reason
            rec = state.instances.get(ev.instance_id)
            if rec is not None and rec.cancelling and rec.reason and rec.reason != ev.reason:
                ev = msgspec.structs.replace(ev, reason=rec.reason)
        ctx.events.record(ev)
        if ev.seq > self.reported.get(node, 0):
            self.reported[node] = ev.seq
        iid = ev.instance_id
        match ev.type:
            case EventType.PROVISIONING | EventType.RUNNING:
                ctx.timers.accepted(iid)
                self.live[iid] = ev.type
                if ev.type == EventType.RUNNING:
                    self._running(iid, node)
                if ev.ports or ev.taken:
                    self._ports(ev)
            case EventType.HEALTHY | EventType.UNHEALTHY:
                check = f"{ev.check}: {ev.detail}" if ev.check and ev.detail else \
                    ev.check or ev.detail
                self.note_health(iid, Health(ev.type), check, ev.restarts)
            case EventType.RESTARTED:
                self.note_health(iid, Health.CHECKING, "", ev.restarts,
                                 last_exit=(ev.reason, ev.detail))
            case EventType.EXITED:
                self._end(ev, InstanceState.SUCCEEDED if ev.exit_code in (0, None)
                          else InstanceState.FAILED)
            case EventType.CANCELLED:
                self._end(ev, InstanceState.CANCELLED)
            case EventType.FAILED if ev.reason in RETRYABLE:
                self._submit(lambda v: self._requeue(
                    v, iid, node, Reason(ev.reason), ev.detail, taken=ev.taken,
                    free=ev.reason == Reason.WORKER_STOPPED) if _current(
                        ev, v.placement(iid)) else None)
            case EventType.FAILED:
                self._end(ev, InstanceState.FAILED)

    def note_health(self, iid: str, health: Health, check: str = "", restarts: int = 0,
                    last_exit: tuple[str, str] | None = None) -> None:
        """Record what the node says of a running instance's health; `since` moves only
        when the health changes; why the last run ended stays until the next restart says
        (`last_exit`)."""
        was = self.health.get(iid)
        reason, detail = last_exit if last_exit is not None else \
            (was.reason, was.detail) if was is not None else ("", "")
        if was is not None and was.health == health and was.restarts == restarts:
            if was.check != check or (was.reason, was.detail) != (reason, detail):
                self.health[iid] = HealthNote(health, check, was.since, restarts, reason,
                                              detail)
            return
        self.health[iid] = HealthNote(health, check, self.ctx.now(), restarts, reason, detail)

    def heartbeat_lists(self, node_id: str, instances: Sequence[InstanceReport],
                        reported: int = 0) -> None:
        """A heartbeat listing an instance git places there confirms the node holds it, and
        says its health unless it is older than an event heard (rule 4: `reported`, the
        events the node had sent when it took it); what the node held when the broker
        started and does not list starts its provisioning clock now (`Timers.heard`)."""
        self.recalled.pop(node_id, None)  # rule 7: heard now
        state = self.ctx.ledger.state()
        current = reported >= self.reported.get(node_id, 0)
        for report in instances:
            iid, st = report.instance_id, report.state
            if state.placement_of(iid) == node_id:
                self.ctx.timers.accepted(iid)
                if st == InstanceState.RUNNING:
                    if iid not in self.ctx.timers.running:  # every heartbeat lists it again
                        self._running(iid, node_id)
                    self.live.setdefault(iid, st)
                if current and report.health in _HEALTHS:
                    health = Health(report.health)
                    was = self.health.get(iid)
                    check = was.check if was is not None and was.health == health else ""
                    self.note_health(iid, health, check, report.restarts)
        if self.ctx.timers.resumed_on:
            self.ctx.timers.heard(node_id, {r.instance_id for r in instances}, self.ctx.now())

    def recall(self, node_id: str, instances: Sequence[InstanceReport]) -> None:
        """Rule 7: a node's newest heartbeat stored before this broker started, for what
        `status` shows until the node is heard; it moves no clock and decides nothing."""
        state = self.ctx.ledger.state()
        self.recalled[node_id] = {r.instance_id: r for r in instances
                                  if state.placement_of(r.instance_id) == node_id}

    def node_restarted(self, node_id: str) -> None:
        """The node's agent started again: it counts its events from 1 anew (rule 4)."""
        self.reported.pop(node_id, None)

    def _running(self, iid: str, node: str) -> None:
        rec = self.ctx.ledger.state().instances.get(iid)
        self.ctx.timers.started_running(iid, node, self.ctx.now(), self.ctx.timing,
                                      rec.spec.timeout_s if rec else None)

    def _submit(self, plan: object) -> None:
        self.ctx.committer.submit(Item(plan=plan))  # type: ignore[arg-type]

    def ports_freed(self, node_id: str, ports: list[int]) -> None:
        """The node found ports its node.json blocks free again: unblock them (one commit in
        flight per node; only ports git still blocks count, so a forged list changes
        nothing the node could not have said)."""
        nf = self.ctx.ledger.state().nodes.get(node_id)
        wanted = sorted(set(nf.blocked_ports) & set(ports)) if nf is not None else []
        if not wanted or node_id in self._unblocking:
            return
        self._unblocking.add(node_id)

        def plan(view: View) -> Planned | None:
            self._unblocking.discard(node_id)
            freed = unblock_ports(view, node_id, wanted)
            if not freed:
                return None
            listed = ", ".join(str(p) for p in freed)
            return Planned(lines=[f"ports {listed} on {node_id} are free again: unblocked"])
        self._submit(plan)

    def _ports(self, ev: Event) -> None:
        def plan(view: View) -> Planned | None:
            new = record_ports(view, ev.instance_id, ev.node_id, ev.ports, ev.taken)
            if new is None:
                return None
            taken = ", ".join(str(p) for p in ev.taken)
            return Planned(lines=[f"ports of {ev.instance_id} on {ev.node_id}: {new.ports}"
                                  + (f" ({Reason.PORT_TAKEN}: {taken})" if taken else "")])
        self._submit(plan)

    def _end(self, ev: Event, to: InstanceState) -> None:
        reported = ev.reason or ("" if to is InstanceState.SUCCEEDED else
                                 Reason.EXITED_NONZERO)

        def plan(view: View) -> Planned | None:
            reason = reported
            rec = view.instance(ev.instance_id)
            if not _current(ev, view.placement(ev.instance_id)):
                return None  # placed again since the report was read (rule 1)
            if to is InstanceState.CANCELLED and rec is not None and rec.cancelling \
                    and rec.reason:
                reason = rec.reason  # rule 5: the cancel's own reason
            if finish(view, ev.instance_id, ev.node_id, to, reason, ev.detail) is None:
                return None
            code = "" if ev.exit_code is None else f" (exit {ev.exit_code})"
            return Planned(lines=[f"{to} {ev.instance_id} on {ev.node_id}{code}"],
                           after=[lambda _sha: self.ended(ev.instance_id)])
        self._submit(plan)

    def _requeue(self, view: View, iid: str, node: str, reason: Reason, detail: str = "",
                 exhausted: InstanceState = InstanceState.FAILED,
                 free: bool = False, stop: bool = False,
                 taken: list[int] | None = None) -> Planned | None:
        """Off `node` and back in the queue (or out of attempts); `stop` also tells the node
        to stop its copy once the commit has landed; `taken`: awarded ports the node found
        taken outside gavel (it handed the instance back for want of others), blocked there."""
        given_up = view.placement(iid)
        awarded = given_up if taken else None
        new = requeue(view, iid, node, reason, detail, exhausted, free)
        if new is None:
            return None
        line = (f"requeue {iid} off {node}: {reason}" if new.state is InstanceState.QUEUED
                else f"{new.state} {iid} on {node}: {reason}; {new.detail}")
        lines = [line]
        blocked = block_ports(view, node, awarded, taken) if awarded and taken else []
        if blocked:
            lines.append(f"block ports {', '.join(map(str, blocked))} on {node}: "
                         f"{Reason.PORT_TAKEN}")

        def after(_sha: str) -> None:
            if stop:
                self.ctx.outbox.publish(subjects.CANCEL.format(node=node), Cancel(
                    instance_id=iid, node_id=node, epoch=self.ctx.leader.epoch,
                    attempt=given_up.attempt if given_up is not None else 0))
            self.ended(iid)
            if new.state is not InstanceState.QUEUED:
                self.ctx.events.emit(iid, EventType(new.state), node_id=node,
                                     reason=new.reason, detail=new.detail)
        return Planned(lines=lines, after=[after])

    def ended(self, iid: str) -> None:
        self.ctx.timers.forget(iid)
        self.live.pop(iid, None)
        self.health.pop(iid, None)
        self.capacity_freed()

    # -- the watchdog --------------------------------------------------------------------
    def watch(self, now: float) -> None:
        ctx = self.ctx
        if ctx.ledger.pinned:
            return
        for action in due(ctx.ledger.state(), ctx.liveness, ctx.timers, ctx.timing, now):
            key = (action.kind, action.instance_id)
            if key in self.acting:
                continue
            self.acting.add(key)
            ctx.committer.submit(Item(plan=functools.partial(self._act, a=action),
                                    failed=functools.partial(self._act_failed, key),
                                    retry=False))
        self._drain_deadlines(now)
        self._migrate_next()

    def _drain_deadlines(self, now: float) -> None:
        """Rule 6: at its drain's deadline, what still runs on a draining node is moved."""
        for node, at in list(self.drain_deadlines.items()):
            if now < at:
                continue
            del self.drain_deadlines[node]
            nf = self.ctx.ledger.state().nodes.get(node)
            if nf is not None and nf.draining and nf.instances and node not in self.migrating:
                self.ctx.log.info("drain deadline of %s: moving its %d instances", node,
                                  len(nf.instances))
                self.migrating[node] = sorted(nf.instances)

    def _act_failed(self, key: tuple[Kind, str], _reason: Reason, _detail: str) -> None:
        self.acting.discard(key)

    def _act(self, view: View, a: Action) -> Planned | None:
        self.acting.discard((a.kind, a.instance_id))
        match a.kind:
            case Kind.REVOKE:
                return self._requeue(view, a.instance_id, a.node_id, Reason.NOT_ACCEPTED,
                                     stop=True)
            case Kind.EXPIRE:
                return self._requeue(view, a.instance_id, a.node_id, Reason.NO_LEASE,
                                     exhausted=InstanceState.LOST)
            case Kind.TIMEOUT:
                return self._finish(view, a, InstanceState.FAILED, Reason.TIMEOUT, stop=True)
            case Kind.CANCEL_EXPIRED:
                return self._finish(view, a, InstanceState.CANCELLED, Reason.CANCEL_UNANSWERED)
        return None

    def _finish(self, view: View, a: Action, to: InstanceState,
                reason: Reason, stop: bool = False) -> Planned | None:
        rec = view.instance(a.instance_id)
        asked = rec.reason if a.kind is Kind.CANCEL_EXPIRED and rec is not None else ""
        ended = view.placement(a.instance_id)
        if finish(view, a.instance_id, a.node_id, to, reason, asked) is None:
            return None  # (rule 5: an overruled cancel keeps why it was asked as its detail)

        def after(_sha: str) -> None:
            if stop:
                self.ctx.outbox.publish(subjects.CANCEL.format(node=a.node_id), Cancel(
                    instance_id=a.instance_id, node_id=a.node_id, epoch=self.ctx.leader.epoch,
                    attempt=ended.attempt if ended is not None else 0))
            self.ended(a.instance_id)
            self.ctx.events.emit(a.instance_id, EventType(to), node_id=a.node_id, reason=reason)
        return Planned(lines=[f"{to} {a.instance_id} on {a.node_id}: {reason}"],
                       after=[after])

    # -- operator verbs ------------------------------------------------------------------
    def cancel(self, iid: str) -> str:
        """Returns the state the instance is in after the request (or raises KeyError)."""
        ctx = self.ctx
        state = ctx.ledger.state()
        rec = state.instances[iid]
        if rec.state in PENDING and state.placement_of(iid) is None:
            def plan(view: View) -> Planned | None:
                if finish(view, iid, "", InstanceState.CANCELLED, Reason.CANCELLED) is None:
                    return None
                return Planned(lines=[f"cancelled {iid}: {Reason.CANCELLED}"],
                               after=[lambda _s: ctx.events.emit(iid, EventType.CANCELLED,
                                                                 reason=Reason.CANCELLED)])
            self._submit(plan)
            return InstanceState.CANCELLED
        node = state.placement_of(iid)
        if node is not None:

            def plan_live(view: View) -> Planned | None:
                if set_cancelling(view, iid) is None:
                    return None
                return Planned(lines=[f"cancel {iid} on {node}"],
                               after=[lambda _s: self.send_cancel(iid, node)])
            self._submit(plan_live)
            return "cancelling"
        return str(rec.state)

    def send_cancel(self, iid: str, node: str) -> None:
        """Tell `node` to stop `iid` (its cancel has been committed) and start the grace."""
        self.ctx.timers.cancelling(iid, node, self.ctx.now())
        placed = self.ctx.ledger.state().placement(iid)
        self.ctx.outbox.publish(subjects.CANCEL.format(node=node), Cancel(
            instance_id=iid, node_id=node, epoch=self.ctx.leader.epoch,
            attempt=placed.attempt if placed is not None else 0))

    def drain(self, node: str, undo: bool, migrate: bool, deadline_s: float = 0.0) -> int:
        """Drain `node` (or `undo` it, which also clears it from every exclusion list); with
        `migrate` move its instances now, with `deadline_s` those still there then."""
        def plan(view: View) -> Planned | None:
            if set_draining(view, node, not undo) is None:
                return None
            lines = [f"{'undrain' if undo else 'drain'} {node}"]
            if undo:
                back = unexclude(view, node)
                if back:
                    lines.append(f"{node} is back in service: no longer excluded for "
                                 f"{len(back)} instance{'s' if len(back) != 1 else ''}")
            return Planned(lines=lines)
        self._submit(plan)
        if undo:
            self.migrating.pop(node, None)
            self.drain_deadlines.pop(node, None)
            return 0
        if deadline_s > 0 and not migrate:
            self.drain_deadlines[node] = self.ctx.now() + deadline_s
            return 0
        self.drain_deadlines.pop(node, None)
        if migrate:
            nf = self.ctx.ledger.state().nodes.get(node)
            self.migrating[node] = sorted(nf.instances) if nf else []
            return len(self.migrating[node])
        return 0

    def _migrate_next(self) -> None:
        """Move a draining node's instances one by one: the next leaves only when the one
        before it has been placed elsewhere."""
        state = self.ctx.ledger.state()
        for node, queue in list(self.migrating.items()):
            moving = [i for i in queue if i in state.pending]
            if moving:
                continue
            while queue and state.placement_of(queue[0]) != node:
                queue.pop(0)
            if not queue:
                del self.migrating[node]
                continue
            iid = queue[0]
            key = (Kind.REVOKE, iid)
            if key in self.acting:
                continue
            self.acting.add(key)

            def plan(v: View, i: str = iid, n: str = node,
                     k: tuple[Kind, str] = key) -> Planned | None:
                self.acting.discard(k)
                return self._requeue(v, i, n, Reason.MIGRATED, free=True, stop=True)
            self._submit(plan)


def _current(ev: Event, placement: Assignment | None) -> bool:
    """The report is of the attempt placed now, or names none (rule 1)."""
    return not ev.attempt or placement is None or placement.attempt == ev.attempt
