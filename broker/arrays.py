"""Arrays: the broker part that releases a batch array's held tasks as its running ones end
(`gavel.shared.arrays` decides how many; this part commits it).

Rules:
1. An array's intent is its task records in git, held or not: what to release is decided
   again on each plan's own view, so a pass run twice releases nothing twice, and a broker
   started again carries on from the branch.
2. One pass's commit in flight per array; a pass that would change nothing submits nothing.
3. Each step is narrated: its commit lines start ``array <id>:``, and the array's own events
   carry its id as their instance (`gavel events ID`): ``released`` for tasks let go, and
   ``array-ended`` with the outcome once no task is held or running.
4. An array with no failed task is judged from `State.array_kinds` and released from
   `State.array_held`, in time independent of its size: a tick that changes nothing, and a
   release, never walk its every task (a big array's walk would hold the event loop on every
   tick). A failure, or the end, takes the full pass (`gavel.shared.arrays`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from typing import Any

from gavel.broker.context import Context
from gavel.broker.effects import Effect, Emit, Wake
from gavel.broker.ledger.committer import Planned
from gavel.broker.ledger.plan import View, finish, release, submit
from gavel.broker.ledger.state import State
from gavel.broker.onepass import OnePass
from gavel.broker.promises import Promises
from gavel.shared import arrays as core
from gavel.shared.api import ArrayStatus, CancelReply, InstanceStatus, StatusReply, StatusRequest
from gavel.shared.arrays import Tally, run_of, tally, to_release
from gavel.shared.messages import EventType, InstanceState
from gavel.shared.reasons import Reason
from gavel.shared.records import InstanceRecord
from gavel.shared.spec import Spec

__all__ = ["Arrays", "array_status", "cancel_array", "plan_array", "task_record"]


class Arrays:
    def __init__(self, ctx: Context, landing: Collection[str] = ()) -> None:
        self.ctx = ctx
        #: Arrays whose submission is still landing (`broker.submissions` rule 2): their
        #: tasks in git are not all of them yet, so nothing is judged of them.
        self.landing = landing
        #: Rule 2 (`broker.onepass`).
        self.passes = OnePass(ctx.committer)
        #: Arrays seen ended by this broker (their end was told once).
        self._ended: set[str] = set()

    def watch(self) -> None:
        """One pass over every array with work: release or cancel held tasks (rule 2)."""
        ctx = self.ctx
        if ctx.ledger.pinned:
            return
        state = ctx.ledger.state()
        for array in list(state.arrays):
            if self.passes.busy(array) or array in self._ended or array in self.landing \
                    or _idle(state, array):
                continue
            tasks = state.tasks_of(array)
            if not tasks:
                continue
            t = tally(tasks[0].spec, tasks, array)
            if t.ended:
                self._ended.add(array)
                ctx.events.emit(array, EventType.ARRAY_ENDED,
                                reason="" if t.ok else str(Reason.ARRAY_TASKS_FAILED),
                                detail=t.outcome())
                continue
            if not _work(t):
                continue
            self.passes.submit(array, functools.partial(plan_array, array=array))


def plan_array(view: View, array: str) -> Planned | None:
    """Run failed tasks again within the budget, release held tasks into free slots, or,
    past the budget, cancel the held ones (`gavel.shared.arrays` rules 1-2): a pure plan of
    the view, whose events (and the next pass, for released tasks) follow its commit."""
    applies, planned = _fast(view, array)
    if applies:
        return planned
    tasks = _tasks(view, array)
    if not tasks:
        return None
    spec = tasks[0].spec
    t = tally(spec, tasks, array)
    out = Planned(lines=[])
    if t.spent:
        held = [r.instance_id for r in tasks if r.held and not r.state.terminal]
        for iid in held:
            if finish(view, iid, "", InstanceState.CANCELLED,
                      str(Reason.ARRAY_FAILED)) is not None:
                out.effects.append(Emit(iid, EventType.CANCELLED, reason=Reason.ARRAY_FAILED))
        if out.effects:
            out.lines.append(f"array {array}: {len(out.effects)} held tasks cancelled: "
                             f"{Reason.ARRAY_FAILED} ({t.outcome()})")
        return out if out.effects else None
    again = [iid for iid in t.retries if submit(view, InstanceRecord(
        instance_id=iid, spec=spec, array=array, held=True,
        reason=str(Reason.ARRAY_HELD)))]  # no key: the submission made base-1 .. base-N
    if again:
        out.lines.append(f"array {array}: run again {', '.join(again)} (within "
                         f"max_failures {t.max_failures}: {t.failures} failed)")
        tasks = _tasks(view, array)
        t = tally(spec, tasks, array)
    held = [r.instance_id for r in tasks if r.held and not r.state.terminal]
    let_go = [iid for iid in to_release(held, core.release(t)) if release(view, iid)]
    if let_go:
        out.lines.append(f"array {array}: release {', '.join(let_go)} ({t.outcome()})")
        out.effects += _released(array, let_go)
    return out if out.lines else None


def _fast(view: View, array: str) -> tuple[bool, Planned | None]:
    """Rule 4: an array without a failure releases from its counts and its held index,
    lowest recorded first, never walking every task; (False, None) when it has failed
    tasks (the full pass decides)."""
    state = view.state
    kinds = state.array_kinds.get(array, {})
    if kinds.get("failed", 0) or kinds.get("lost", 0):
        return False, None
    spec = _spec(state, array)
    held, live = kinds.get("held", 0), kinds.get("live", 0)
    if spec is None or held == 0:
        return True, None
    room = min(held, (spec.parallelism or spec.count) - live)
    let_go: list[str] = []
    for iid in state.array_held.get(array, ()):
        if len(let_go) >= room:
            break
        if release(view, iid) is not None:
            let_go.append(iid)
    if not let_go:
        return True, None
    return True, Planned(lines=[f"array {array}: release {', '.join(let_go)} ({live} running, "
                                f"{held} pending)"], effects=_released(array, let_go))


def _released(array: str, ids: list[str]) -> list[Effect]:
    """The array's ``released`` event, and the next pass: the released tasks wait for it."""
    return [Emit(array, EventType.RELEASED, detail=", ".join(ids)), Wake()]


def _spec(state: State, array: str) -> Spec | None:
    for iid in state.arrays.get(array, ()):
        rec = state.instances.get(iid)
        if rec is not None:
            return rec.spec
    return None


def _idle(state: State, array: str) -> bool:
    """Nothing to do for an array without a failure, known from its counts alone (rule 4):
    every slot busy, or nothing held, and something still running."""
    kinds = state.array_kinds.get(array, {})
    if kinds.get("failed", 0) or kinds.get("lost", 0):
        return False
    held, live = kinds.get("held", 0), kinds.get("live", 0)
    if held == 0 and live == 0:
        return False  # ended: the full pass tells it once
    spec = _spec(state, array)
    slots = (spec.parallelism or spec.count) if spec is not None else 0
    return held == 0 or live >= slots


def _work(t: Tally) -> bool:
    return (t.spent and t.held > 0) or bool(t.retries) or core.release(t) > 0


def _tasks(view: View, array: str) -> list[InstanceRecord]:
    """The array's task records as `view` has them: the state's, as changed here, and those
    made here (a run again)."""
    out = []
    known = view.state.arrays.get(array, {})
    for iid in known:
        rec = view.instance(iid)
        if rec is not None and rec.array == array:
            out.append(rec)
    for iid, made in view.change.instances.items():
        if made is not None and made.array == array and iid not in known:
            out.append(made)
    return out


# -- the API's part: a submission's records, an array's status, its cancel ---------------
def task_record(iid: str, spec: Spec, key: str, array: str, k: int) -> InstanceRecord:
    """The record of a submission's `k`-th instance: a batch array's task past its
    parallelism is held (`gavel.shared.arrays` rule 1)."""
    if not array:
        return InstanceRecord(instance_id=iid, spec=spec, key=key)
    held = spec.parallelism is not None and k > spec.parallelism
    return InstanceRecord(instance_id=iid, spec=spec, key=key, array=array, held=held,
                          reason=str(Reason.ARRAY_HELD) if held else "")


def array_status(state: State, req: StatusRequest,
                 show: Callable[[InstanceRecord], InstanceStatus],
                 leader: dict[str, Any]) -> StatusReply | None:
    """A batch array: its tally, and its tasks in index order unless `summary` (None: no
    task of it is known)."""
    tasks = sorted(state.tasks_of(req.instance_id), key=lambda r: run_of(r.instance_id))
    if not tasks:
        return None
    t = tally(tasks[0].spec, tasks, req.instance_id)
    array = ArrayStatus(array_id=req.instance_id, count=t.count, parallelism=t.parallelism,
                        max_failures=t.max_failures, succeeded=t.succeeded, failed=t.failed,
                        cancelled=t.cancelled, running=t.running,
                        pending=t.held + len(t.retries), first_failure=t.first_failure,
                        ended=t.ended, ok=t.ok, outcome=t.outcome())
    shown = [] if req.summary else [show(r) for r in tasks]
    return StatusReply(instances=shown, array=array, **leader)


def cancel_array(state: State, promises: Promises, array: str) -> CancelReply:
    """`gavel cancel ID` of a batch array: every task not ended is cancelled (held ones at
    once, running ones through their nodes); the array then ends, not succeeded."""
    live = [r.instance_id for r in state.tasks_of(array)
            if not r.state.terminal and not r.cancelling]
    for iid in live:
        promises.cancel(iid)
    return CancelReply(instance_id=array, state="cancelling" if live else "ended")
