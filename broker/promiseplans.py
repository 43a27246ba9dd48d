"""The promises' plans, pure: from the `View` they read to the change and its effects.

Rules:
1. Each plan re-checks its own precondition on the view (compare-and-swap on the instance's
   state, `broker.ledger.plan`) and returns None when it no longer holds: a late report
   racing an expiry resolves to exactly one of them.
2. What follows the commit is returned as effects (`broker.effects`), in the order they are
   carried out once the commit is durable: the node told to stop its copy (a `Cancel`
   carrying the attempt the view placed there), then the instance's hold released, then
   the event an operator reads. A requeue that leaves the instance queued emits nothing:
   its next auction speaks for it.
3. The plans read nothing but their arguments: the leadership's epoch is passed in, and
   every clock starts when its effect runs (`Arm`), never when the plan is made.
"""

from __future__ import annotations

from gavel.broker.effects import Arm, Effect, Emit, Publish, Release, Timer
from gavel.broker.ledger.committer import Planned
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
from gavel.broker.watchdog import Action, Kind
from gavel.shared import subjects
from gavel.shared.messages import Cancel, Event, EventType, InstanceState
from gavel.shared.reasons import Reason
from gavel.shared.records import Assignment

__all__ = ["current", "plan_action", "plan_cancel", "plan_drain", "plan_end", "plan_finish",
           "plan_ports", "plan_requeue", "plan_retry", "plan_unblock", "stop_message"]


def current(ev: Event, placement: Assignment | None) -> bool:
    """The report is of the attempt placed now, or names none (`broker.promises` rule 1)."""
    return not ev.attempt or placement is None or placement.attempt == ev.attempt


def stop_message(iid: str, node: str, placed: Assignment | None, epoch: int) -> Publish:
    """Tell `node` to stop its copy of `iid` (the attempt `placed` there)."""
    return Publish(subjects.CANCEL.format(node=node), Cancel(
        instance_id=iid, node_id=node, epoch=epoch,
        attempt=placed.attempt if placed is not None else 0))


def plan_requeue(view: View, iid: str, node: str, reason: Reason, detail: str = "", *,
                 exhausted: InstanceState = InstanceState.FAILED, free: bool = False,
                 stop: bool = False, taken: list[int] | None = None,
                 epoch: int = 0) -> Planned | None:
    """Off `node` and back in the queue (or out of attempts: `exhausted`); `stop` also
    tells the node to stop its copy; `taken`: awarded ports the node found taken outside
    gavel (it handed the instance back for want of others), blocked there."""
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
    effects: list[Effect] = [stop_message(iid, node, given_up, epoch)] if stop else []
    effects.append(Release(iid))
    if new.state is not InstanceState.QUEUED:
        effects.append(Emit(iid, EventType(new.state), node_id=node, reason=new.reason,
                            detail=new.detail))
    return Planned(lines=lines, effects=effects)


def plan_retry(view: View, ev: Event) -> Planned | None:
    """The node reports a failure that could succeed elsewhere (`broker.promises` rule 3):
    off the node and back in the queue, unless placed again since the report was read; one
    its worker stopped as it shut down spends no attempt."""
    if not current(ev, view.placement(ev.instance_id)):
        return None
    return plan_requeue(view, ev.instance_id, ev.node_id, Reason(ev.reason), ev.detail,
                        taken=ev.taken, free=ev.reason == Reason.WORKER_STOPPED)


def plan_finish(view: View, a: Action, to: InstanceState, reason: Reason, *,
                stop: bool = False, epoch: int = 0) -> Planned | None:
    """End the instance the watchdog acts on as `to`; an overruled cancel keeps why it was
    asked as its detail (`broker.promises` rule 5)."""
    rec = view.instance(a.instance_id)
    asked = rec.reason if a.kind is Kind.CANCEL_EXPIRED and rec is not None else ""
    ended = view.placement(a.instance_id)
    if finish(view, a.instance_id, a.node_id, to, reason, asked) is None:
        return None
    effects: list[Effect] = [stop_message(a.instance_id, a.node_id, ended, epoch)] if stop else []
    effects += [Release(a.instance_id), Emit(a.instance_id, EventType(to), node_id=a.node_id,
                                             reason=reason)]
    return Planned(lines=[f"{to} {a.instance_id} on {a.node_id}: {reason}"], effects=effects)


def plan_action(view: View, a: Action, epoch: int = 0) -> Planned | None:
    """The watchdog's verdict on one instance (`broker.watchdog`), as a plan."""
    match a.kind:
        case Kind.REVOKE:
            return plan_requeue(view, a.instance_id, a.node_id, Reason.NOT_ACCEPTED, stop=True,
                                epoch=epoch)
        case Kind.EXPIRE:
            return plan_requeue(view, a.instance_id, a.node_id, Reason.NO_LEASE,
                                exhausted=InstanceState.LOST)
        case Kind.TIMEOUT:
            return plan_finish(view, a, InstanceState.FAILED, Reason.TIMEOUT, stop=True,
                               epoch=epoch)
        case Kind.CANCEL_EXPIRED:
            return plan_finish(view, a, InstanceState.CANCELLED, Reason.CANCEL_UNANSWERED)
    return None


def plan_end(view: View, ev: Event, to: InstanceState) -> Planned | None:
    """The node reports the instance ended as `to`; a confirmed cancel keeps the cancel's
    own reason (`broker.promises` rule 5)."""
    reason = ev.reason or ("" if to is InstanceState.SUCCEEDED else Reason.EXITED_NONZERO)
    rec = view.instance(ev.instance_id)
    if not current(ev, view.placement(ev.instance_id)):
        return None  # placed again since the report was read
    if to is InstanceState.CANCELLED and rec is not None and rec.cancelling and rec.reason:
        reason = rec.reason
    if finish(view, ev.instance_id, ev.node_id, to, reason, ev.detail) is None:
        return None
    code = "" if ev.exit_code is None else f" (exit {ev.exit_code})"
    return Planned(lines=[f"{to} {ev.instance_id} on {ev.node_id}{code}"],
                   effects=[Release(ev.instance_id)])


def plan_cancel(view: View, iid: str, node: str | None, epoch: int = 0) -> Planned | None:
    """An operator's cancel: a queued instance ends at once; a placed one is marked
    cancelling, its node told to stop it and the grace armed once that is durable."""
    if node is None:
        if finish(view, iid, "", InstanceState.CANCELLED, Reason.CANCELLED) is None:
            return None
        return Planned(lines=[f"cancelled {iid}: {Reason.CANCELLED}"],
                       effects=[Emit(iid, EventType.CANCELLED, reason=Reason.CANCELLED)])
    if set_cancelling(view, iid) is None:
        return None
    return Planned(lines=[f"cancel {iid} on {node}"],
                   effects=[Arm(Timer.CANCEL_GRACE, iid, node),
                            stop_message(iid, node, view.placement(iid), epoch)])


def plan_ports(view: View, ev: Event) -> Planned | None:
    """Record the ports a node says it bound for the instance, and those it found taken."""
    new = record_ports(view, ev.instance_id, ev.node_id, ev.ports, ev.taken)
    if new is None:
        return None
    taken = ", ".join(str(p) for p in ev.taken)
    return Planned(lines=[f"ports of {ev.instance_id} on {ev.node_id}: {new.ports}"
                          + (f" ({Reason.PORT_TAKEN}: {taken})" if taken else "")])


def plan_unblock(view: View, node: str, wanted: list[int]) -> Planned | None:
    freed = unblock_ports(view, node, wanted)
    if not freed:
        return None
    listed = ", ".join(str(p) for p in freed)
    return Planned(lines=[f"ports {listed} on {node} are free again: unblocked"])


def plan_drain(view: View, node: str, undo: bool) -> Planned | None:
    """Drain `node`, or undo it, which also takes it out of every exclusion list."""
    if set_draining(view, node, not undo) is None:
        return None
    lines = [f"{'undrain' if undo else 'drain'} {node}"]
    if undo:
        back = unexclude(view, node)
        if back:
            lines.append(f"{node} is back in service: no longer excluded for "
                         f"{len(back)} instance{'s' if len(back) != 1 else ''}")
    return Planned(lines=lines)
