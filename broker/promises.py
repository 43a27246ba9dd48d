"""Keeping the promises a placement makes: reports from workers, the watchdog's verdicts,
cancel, drain and migration.

Rules:
1. A worker's report counts only for an instance git places on that very node, and only for
   the attempt placed there: anything else is counted and dropped (a fenced or
   impersonating node changes nothing, and neither does the late end of an earlier attempt
   on the same node - a copy the broker gave up on, stopping after the instance was placed
   there again - which would otherwise end the attempt that runs now). A report that names
   no attempt (0) is taken as the current one's.
2. Every change goes through a plan (`broker.promiseplans`: pure, compare-and-swap on the
   instance's state, its effects as values, the epoch given as the plan is submitted) and
   the group committer: a late event racing an expiry resolves to exactly one of them.
   What this part notes of a plan in flight (a verdict being acted on, a node's
   unblocking) is let go by the plan's effect (`Unacted`, `Unblocked`), run in commit
   order, never while planning.
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
   stream keeps it) is recalled for what the API shows, until the node is heard again: a
   restarted broker shows running and healthy what its nodes last said was, not "placed"
   for a heartbeat's time, and a gateway keeps reaching them where they said (their
   advertised address and instance directory); it is no heartbeat heard now, so no clock
   and no decision (a service's health, a provisioning deadline) takes it.
8. An end is heard once, from its event or from the heartbeats after it (`Heartbeat.ended`
   carries a node's recent ends again): a heartbeat's end whose event never came (lost as
   the node's NATS server went away) is taken as that event, checked as rule 1 checks
   any; one whose event was heard is nothing new.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from gavel.broker.context import Context
from gavel.broker.effects import Release
from gavel.broker.ledger.committer import Item, Planned, and_then
from gavel.broker.ledger.plan import View
from gavel.broker.ledger.state import State
from gavel.broker.promiseplans import (
    current,
    plan_action,
    plan_cancel,
    plan_drain,
    plan_end,
    plan_ports,
    plan_requeue,
    plan_retry,
    plan_unblock,
)
from gavel.broker.watchdog import Action, Kind, due
from gavel.shared import subjects
from gavel.shared.lifecycle import PENDING
from gavel.shared.messages import (
    NODE_ENDS,
    Cancel,
    Event,
    EventType,
    Health,
    InstanceReport,
    InstanceState,
)
from gavel.shared.reasons import Reason
from gavel.transport.inbound import Door, Guard
from gavel.transport.wire import Received

__all__ = ["Promises", "Unacted", "Unblocked"]

#: The event types a worker reports about its own instances; any other is rejected.
REPORTED = frozenset({EventType.PROVISIONING, EventType.RUNNING, EventType.EXITED,
                      EventType.FAILED, EventType.CANCELLED, EventType.HEALTHY,
                      EventType.UNHEALTHY, EventType.RESTARTED, EventType.EXEC})


@dataclass(frozen=True)
class Unacted:
    """The watchdog's verdict landed, found nothing to do or was given up: it may be acted
    on again."""

    action: Action


@dataclass(frozen=True)
class Unblocked:
    """The node's unblocking commit landed, found nothing to do or was given up."""

    node_id: str


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
        #: Node -> where that heartbeat said it is reached: its advertised address and its
        #: instances' directory (rule 7), until the node is heard now.
        self.recalled_at: dict[str, tuple[str, str]] = {}
        #: Node -> the highest `Event.seq` heard from it since it last started (rule 4).
        self.reported: dict[str, int] = {}
        self._unblocking: set[str] = set()  # nodes with an unblocking commit in flight
        #: Instance -> the attempt whose end was heard, until it has ended here (rule 8).
        self._ends_heard: dict[str, int] = {}
        ctx.committer.effects.on(Release, lambda e, _sha: self.ended(e.instance_id))
        ctx.committer.effects.on(Unacted, self._unacted)
        ctx.committer.effects.on(Unblocked, lambda e, _sha: self._unblocking.discard(e.node_id))

    # -- reports -------------------------------------------------------------------------
    def on_report(self, msg: Received) -> None:
        ev = self._guard(msg)
        if ev is not None:
            self._hear(ev, msg.subject)

    def heartbeat_ended(self, ended: Sequence[Event], subject: str) -> None:
        """Rule 8: the ends a heartbeat carries whose events were not heard."""
        state = self.ctx.ledger.state()
        for ev in ended:  # one git no longer places there has ended: nothing to hear
            if state.placement_of(ev.instance_id) == ev.node_id and \
                    current(ev, state.placement(ev.instance_id)) and \
                    self._ends_heard.get(ev.instance_id) != ev.attempt:
                self.ctx.log.info("heard the end of %s attempt %d from %s's heartbeat (its "
                                  "event never came)", ev.instance_id, ev.attempt, ev.node_id)
                self._hear(ev, subject)

    def _hear(self, ev: Event, subject: str) -> None:
        ctx = self.ctx
        node = ev.node_id
        state = ctx.ledger.state()
        if state.placement_of(ev.instance_id) != node:
            ctx.rejects.count("event for an instance not placed on that node", subject)
            return
        if not current(ev, state.placement(ev.instance_id)):
            ctx.rejects.count("event for an earlier attempt of the instance", subject)
            return
        if ev.type not in REPORTED:  # checked before it is recorded or published
            ctx.rejects.count("event of an unknown type", subject)
            return
        if ev.type == EventType.CANCELLED:  # rule 5: the stop's own reason
            rec = state.instances.get(ev.instance_id)
            if rec is not None and rec.cancelling and rec.reason and rec.reason != ev.reason:
                ev = msgspec.structs.replace(ev, reason=rec.reason)
        if ev.type in NODE_ENDS:  # rule 8: heard once
            if self._ends_heard.get(ev.instance_id) == ev.attempt:
                return
            self._ends_heard[ev.instance_id] = ev.attempt
        ctx.events.record(ev)
        if ev.seq > self.reported.get(node, 0):
            self.reported[node] = ev.seq
        iid = ev.instance_id
        match ev.type:
            case EventType.PROVISIONING | EventType.RUNNING:
                ctx.timers.accepted(iid)
                self.live[iid] = ev.type
                if ev.type == EventType.RUNNING:
                    self._running(iid, node, state)
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
                self._submit(functools.partial(plan_retry, ev=ev))
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
        self.recalled_at.pop(node_id, None)
        state = self.ctx.ledger.state()
        current = reported >= self.reported.get(node_id, 0)
        for report in instances:
            iid, st = report.instance_id, report.state
            if state.placement_of(iid) == node_id:
                self.ctx.timers.accepted(iid)
                if st == InstanceState.RUNNING:
                    if iid not in self.ctx.timers.running:  # every heartbeat lists it again
                        self._running(iid, node_id, state)
                    self.live.setdefault(iid, st)
                if current and report.health in _HEALTHS:
                    health = Health(report.health)
                    was = self.health.get(iid)
                    check = was.check if was is not None and was.health == health else ""
                    self.note_health(iid, health, check, report.restarts)
        if self.ctx.timers.resumed_on:
            self.ctx.timers.heard(node_id, {r.instance_id for r in instances}, self.ctx.now())

    def recall(self, node_id: str, instances: Sequence[InstanceReport],
               reached: tuple[str, str] = ("", "")) -> None:
        """Rule 7: a node's newest heartbeat stored before this broker started (its
        instances, and `reached`: its advertised address and instance directory), for what
        the API shows until the node is heard; it moves no clock and decides nothing."""
        state = self.ctx.ledger.state()
        self.recalled[node_id] = {r.instance_id: r for r in instances
                                  if state.placement_of(r.instance_id) == node_id}
        self.recalled_at[node_id] = reached

    def node_restarted(self, node_id: str) -> None:
        """The node's agent started again: it counts its events from 1 anew (rule 4)."""
        self.reported.pop(node_id, None)

    def _running(self, iid: str, node: str, state: State) -> None:
        """The running clock of `iid` on `node`, its timeout from `state` (the caller's read:
        the ledger's state is read once a report, not again for this)."""
        rec = state.instances.get(iid)
        self.ctx.timers.started_running(iid, node, self.ctx.now(), self.ctx.timing,
                                      rec.spec.timeout_s if rec else None)

    def _submit(self, plan: Callable[[View], Planned | None]) -> None:
        self.ctx.committer.submit(Item(plan=plan))

    def ports_freed(self, node_id: str, ports: list[int]) -> None:
        """The node found ports its node.json blocks free again: unblock them (one commit in
        flight per node; only ports git still blocks count, so a forged list changes
        nothing the node could not have said)."""
        nf = self.ctx.ledger.state().nodes.get(node_id)
        wanted = sorted(set(nf.blocked_ports) & set(ports)) if nf is not None else []
        if not wanted or node_id in self._unblocking:
            return
        self._unblocking.add(node_id)
        self.ctx.committer.submit(Item(
            plan=functools.partial(and_then, plan=functools.partial(
                plan_unblock, node=node_id, wanted=wanted), effects=(Unblocked(node_id),)),
            gave_up=[Unblocked(node_id)]))

    def _ports(self, ev: Event) -> None:
        self._submit(functools.partial(plan_ports, ev=ev))

    def _end(self, ev: Event, to: InstanceState) -> None:
        self._submit(functools.partial(plan_end, ev=ev, to=to))

    def ended(self, iid: str) -> None:
        self._ends_heard.pop(iid, None)
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
            ctx.committer.submit(Item(plan=functools.partial(
                and_then, plan=functools.partial(plan_action, a=action, epoch=ctx.leader.epoch),
                effects=(Unacted(action),)), gave_up=[Unacted(action)], retry=False))
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

    def _unacted(self, e: Unacted, _sha: str) -> None:
        self.acting.discard((e.action.kind, e.action.instance_id))

    # -- operator verbs ------------------------------------------------------------------
    def cancel(self, iid: str) -> str:
        """Returns the state the instance is in after the request (or raises KeyError)."""
        state = self.ctx.ledger.state()
        rec = state.instances[iid]
        node = state.placement_of(iid)
        if rec.state in PENDING and node is None:
            self._submit(functools.partial(plan_cancel, iid=iid, node=None))
            return InstanceState.CANCELLED
        if node is not None:
            self._submit(functools.partial(plan_cancel, iid=iid, node=node,
                                           epoch=self.ctx.leader.epoch))
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
        self._submit(functools.partial(plan_drain, node=node, undo=undo))
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
            done = Unacted(Action(Kind.REVOKE, iid, node))
            plan = functools.partial(plan_requeue, iid=iid, node=node, reason=Reason.MIGRATED,
                                     free=True, stop=True, epoch=self.ctx.leader.epoch)
            self.ctx.committer.submit(Item(
                plan=functools.partial(and_then, plan=plan, effects=(done,)), gave_up=[done]))

