"""Periodic: the broker part that makes a periodic job's runs at their times
(`gavel.shared.periodic` decides; this part commits it, ticked on the broker's wall clock).

Rules:
1. A periodic job's intent is ``periodic/<name>.json`` (`PeriodicRecord`): `gavel submit` of
   a spec with a `schedule` makes it (or, submitted again with another spec, starts it
   afresh from now), `gavel cancel NAME` stops it and cancels its runs not yet ended.
2. Each run is an ordinary job instance: its record is written by the commit that moves
   the schedule's position (`last_run`), and it is auctioned like any instance. Each plan
   decides again on its own view (compare-and-swap on the position), so a pass run twice,
   or a broker started again, makes no run twice (`gavel.shared.periodic` rule 1).
3. One commit in flight per job; a pass with nothing due submits nothing, and one that finds
   nothing due once planned writes nothing (`plan_pass`: the job is free again in commit
   order).
4. Each step is narrated: commit lines start ``periodic <name>:``; the job's events carry
   its name: ``periodic-run`` (detail: the run and its fire time) and ``periodic-skipped``
   (reason: why); `gavel_periodic_runs_total{outcome="run|skipped|missed"}` counts them.
5. The plans are pure functions of their view, `now` (whole POSIX seconds) and the request:
   they return the change and its effects as values (`broker.effects`).
6. A run is admitted as any submit is (`gavel.shared.admission`): one that would take the
   live instances past the broker's `--max-instances` is not made; its fire time is skipped
   with `Reason.OVER_CLUSTER_CAP` (the event says the submit's own sentence) and the
   schedule moves on, so a full cluster is not handed a backlog of runs once room appears.
7. A cancelled job's record (its history) stays `timing.retention_s` after its cancel, as
   an ended instance's does, so `gavel status NAME` still answers; then, once no run of it
   is live, it leaves the tree (git history keeps it) and the name is free. A record
   stopped without a stamp (by hand, by an older gavel) counts from its latest fire time or
   submission; ``retention_s = 0`` keeps every record.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec

from gavel.broker.admission import live_instances
from gavel.broker.context import Context
from gavel.broker.effects import Answer, Emit, Refuse
from gavel.broker.ledger.committer import Item, Planned
from gavel.broker.ledger.plan import View, submit
from gavel.broker.ledger.state import State
from gavel.broker.promises import Promises
from gavel.shared import cron
from gavel.shared.admission import Caps, refusal
from gavel.shared.api import (
    CancelReply,
    InstanceStatus,
    PeriodicStatus,
    StatusReply,
    SubmitReply,
)
from gavel.shared.messages import ApiError, EventType, Message
from gavel.shared.periodic import HISTORY, Due, decide, next_fire, run_id
from gavel.shared.reasons import Reason
from gavel.shared.records import InstanceRecord, PeriodicRecord, PeriodicRun
from gavel.shared.spec import Spec

__all__ = ["Forgot", "Periodic", "Ran", "Unran", "forgettable", "plan_cancel",
           "plan_forget", "plan_pass", "plan_run", "plan_submit", "status_of", "summary"]


@dataclass(frozen=True)
class Forgot:
    """A pass over cancelled job `name` landed (rule 7): its record left the tree, or the
    plan found it no longer due and changed nothing."""

    name: str


@dataclass(frozen=True)
class Unran:
    """A pass for job `name` was given up, or found nothing due: the next watch looks at it
    again."""

    name: str


@dataclass(frozen=True)
class Ran:
    """A pass landed for job `name`: its fire time made a run, or was skipped, and `missed`
    earlier ones were collapsed into it (rule 4)."""

    name: str
    made: bool
    missed: int = 0


def position(job: PeriodicRecord) -> int:
    """Where the schedule stands: its last fire time acted on, or when it was (re)submitted,
    whichever is later (`gavel.shared.periodic` rule 1)."""
    return max(cron.unstamp(job.last_run) or 0, cron.unstamp(job.since) or 0)


def live_run(view: View | State, job: PeriodicRecord) -> bool:
    """An earlier run of the job has not ended (overlap, `gavel.shared.periodic` rule 4); a
    run whose record retention forgot has ended."""
    for entry in job.history:
        if entry.instance_id:
            rec = view.instance(entry.instance_id) if isinstance(view, View) \
                else view.instances.get(entry.instance_id)
            if rec is not None and not rec.state.terminal:
                return True
    return False


def due(view: View | State, job: PeriodicRecord, now: int) -> Due | None:
    spec = job.spec
    assert spec.schedule is not None  # reading refuses a periodic record without one
    return decide(spec.schedule, spec.time_zone, spec.overlap, position(job), now,
                  live=live_run(view, job), stopped=job.stopped)


def run_spec(spec: Spec) -> Spec:
    """A run's spec: the job's, without its schedule - a run is an ordinary job."""
    return msgspec.structs.replace(spec, schedule=None, time_zone=None, overlap=None)


def _outcomes(view: View, history: list[PeriodicRun]) -> list[PeriodicRun]:
    """The history with each ended run's outcome noted (its record may be forgotten later)."""
    out = []
    for entry in history:
        rec = view.instance(entry.instance_id) if entry.instance_id else None
        if rec is not None and rec.state.terminal and entry.outcome != str(rec.state):
            entry = msgspec.structs.replace(entry, outcome=str(rec.state))
        out.append(entry)
    return out


def _trim(view: View, history: list[PeriodicRun]) -> list[PeriodicRun]:
    """The latest `HISTORY` entries, and every older run not yet ended: overlap is judged
    from the history, so a long run must not fall out of it behind its own skips."""
    out = list(history)
    k = 0
    while len(out) > HISTORY and k < len(out):
        rec = view.instance(out[k].instance_id) if out[k].instance_id else None
        if rec is not None and not rec.state.terminal:
            k += 1
        else:
            del out[k]
    return out


def plan_run(view: View, name: str, now: int, caps: Caps | None = None) -> Planned | None:
    """The job's due fire time at `now`, on `view`: a run made (its record and the new
    position in one change) or a skip recorded - also for a run `caps` refuses (rule 6);
    None when nothing is due (rule 2)."""
    job = view.periodic(name)
    if job is None:
        return None
    got = due(view, job, now)
    if got is None:
        return None
    spec = job.spec
    when = cron.local(got.at, spec.time_zone)
    over = "" if caps is None or got.skipped is not None else \
        refusal(caps, live=live_instances(view), adding=1)
    if over:
        got = dataclasses.replace(got, skipped=Reason.OVER_CLUSTER_CAP)
    entry = PeriodicRun(at=cron.stamp(got.at), skipped=str(got.skipped or ""),
                        missed=got.missed)
    effects: list[object] = []
    if got.missed:
        effects.append(Emit(name, EventType.PERIODIC_SKIPPED, reason=Reason.PERIODIC_MISSED,
                            detail=f"{got.missed} fire times before {when}"))
    if got.skipped is None:
        iid = run_id(name, got.at)
        if not submit(view, InstanceRecord(instance_id=iid, spec=run_spec(spec))):
            return None  # made already: the position is behind its own run (never written)
        entry = msgspec.structs.replace(entry, instance_id=iid)
        line = f"periodic {name}: run {iid} for {when}"
        effects.append(Emit(name, EventType.PERIODIC_RUN, detail=f"{iid} for {when}"))
    else:
        line = f"periodic {name}: skip {when}: {got.skipped}"
        effects.append(Emit(name, EventType.PERIODIC_SKIPPED, reason=got.skipped,
                            detail=f"{when}: {over}" if over else when))
    if got.missed:
        line += f" ({got.missed} earlier fire times missed)"
    history = _trim(view, _outcomes(view, [*job.history, entry]))
    view.put_periodic(msgspec.structs.replace(job, last_run=cron.stamp(got.at),
                                              history=history))
    effects.append(Ran(name, made=got.skipped is None, missed=got.missed))
    return Planned(lines=[line], effects=effects)


def plan_pass(view: View, name: str, now: int, caps: Caps | None = None) -> Planned:
    """Rule 3: a pass over the job `name` - `plan_run`'s, or, with nothing due, only the
    effect that lets the job be passed over again (`Unran`): planning frees nothing."""
    return plan_run(view, name, now, caps) or Planned.only(Unran(name))


def plan_submit(view: View, spec: Spec, now: int, waiter: asyncio.Future[Message]
                ) -> Planned | None:
    """`gavel submit` of a periodic job (rule 1): a new record, or the job started afresh
    from `now` with `spec`; the same spec of a job not stopped changes nothing."""
    name = spec.name
    old = view.periodic(name)
    if view.service(name) is not None:  # `gavel status NAME` must name one thing
        return Planned.only(Answer(waiter, ApiError(
            error=f"{Reason.NAME_TAKEN}: {name} is a service or a system job")))
    answer = SubmitReply(instance_id=name)
    if old is not None and old.spec == spec and not old.stopped:
        return Planned.only(Answer(waiter, answer))
    job = PeriodicRecord(name=name, spec=spec, since=cron.stamp(now)) if old is None else \
        msgspec.structs.replace(old, spec=spec, since=cron.stamp(now), stopped=False,
                                stopped_at="")
    view.put_periodic(job)
    assert spec.schedule is not None
    verb = "submit" if old is None else "submit again"
    return Planned(lines=[f"periodic {name}: {verb}, schedule {spec.schedule!r} "
                          f"({spec.time_zone or 'UTC'})"], effects=[Answer(waiter, answer)])


def plan_cancel(view: View, name: str, waiter: asyncio.Future[Message], now: int
                ) -> Planned | None:
    """`gavel cancel NAME` of a periodic job: stopped at `now`, so no run is made (rule 1);
    its record is kept for a while after (rule 7)."""
    job = view.periodic(name)
    if job is None:
        return Planned.only(Answer(waiter, ApiError(
            error=f"{Reason.UNKNOWN_INSTANCE}: {name}")))
    effects: list[object] = [Answer(waiter, CancelReply(instance_id=name, state="cancelled"))]
    if job.stopped:
        return Planned.only(*effects)
    view.put_periodic(msgspec.structs.replace(job, stopped=True, stopped_at=cron.stamp(now)))
    effects.insert(0, Emit(name, EventType.CANCELLED, reason=Reason.PERIODIC_STOPPED))
    return Planned(lines=[f"periodic {name}: cancelled"], effects=effects)


def forgettable(view: View | State, job: PeriodicRecord, keep_s: float, now: int) -> bool:
    """Rule 7: a cancelled job whose record has been kept long enough, and no run live."""
    if not job.stopped or keep_s <= 0:
        return False
    since = cron.unstamp(job.stopped_at) or position(job)
    return now >= since + keep_s and not live_run(view, job)


def plan_forget(view: View, name: str, keep_s: float, now: int) -> Planned:
    """Rule 7: the cancelled job's record out of the tree, if it is still due to go."""
    job = view.periodic(name)
    if job is None or not forgettable(view, job, keep_s, now):
        return Planned.only(Forgot(name))
    view.drop_periodic(name)
    when = f", cancelled {job.stopped_at}" if job.stopped_at else ""
    return Planned(lines=[f"periodic {name}: forget its record{when} ({len(job.history)} "
                          "fire times in its history)"], effects=[Forgot(name)])


def summary(state: State, job: PeriodicRecord, now: int
            ) -> tuple[PeriodicStatus, list[InstanceRecord]]:
    """A periodic job as status shows it - its schedule, its next fire time, its history
    (each run's outcome as its record says now, or as noted when it ended) - and its runs
    the state still holds."""
    spec = job.spec
    assert spec.schedule is not None
    runs = []
    history = []
    for entry in job.history:
        rec = state.instances.get(entry.instance_id) if entry.instance_id else None
        if rec is not None:
            runs.append(rec)
            entry = msgspec.structs.replace(entry, outcome=str(state.effective(
                entry.instance_id) or rec.state))
        history.append(entry)
    nxt = None if job.stopped else next_fire(spec.schedule, spec.time_zone, position(job), now)
    return PeriodicStatus(name=job.name, schedule=spec.schedule,
                          time_zone=spec.time_zone or "UTC", overlap=spec.overlap or "skip",
                          stopped=job.stopped, last_run=job.last_run,
                          next_run=cron.stamp(nxt) if nxt is not None else "",
                          history=history), runs


def status_of(state: State, job: PeriodicRecord, now: int, leader: dict[str, Any],
              show: Callable[[InstanceRecord], InstanceStatus]) -> StatusReply:
    """`gavel status NAME` of a periodic job: its `summary` and its runs' statuses."""
    status, runs = summary(state, job, now)
    return StatusReply(instances=[show(r) for r in runs], periodic=status, **leader)


class Periodic:
    """The shell: ticks each job's decision on the broker's wall clock and commits what is
    due (rules 2-3); serves the API's submit and cancel of a periodic job (rule 1)."""

    def __init__(self, ctx: Context, promises: Promises, wall: Callable[[], datetime],
                 caps: Caps | None = None) -> None:
        self.ctx = ctx
        self.caps = caps  # rule 6
        self.promises = promises
        self.wall = wall
        self._busy: set[str] = set()
        #: Per job: the record it was last judged on and its next fire time then (None:
        #: never, it is stopped): until then a tick asks no cron of it.
        self._next: dict[str, tuple[PeriodicRecord, int | None]] = {}
        self.runs = ctx.metrics.periodic_runs
        ctx.committer.effects.on(Ran, self._ran)
        ctx.committer.effects.on(Forgot, self._forgot)
        ctx.committer.effects.on(Unran, lambda e, _sha: self._busy.discard(e.name))

    def now(self) -> int:
        return int(self.wall().timestamp())

    def watch(self) -> None:
        """One pass over every periodic job with a fire time due (rule 3)."""
        ctx = self.ctx
        if ctx.ledger.pinned:
            return
        state = ctx.ledger.state()
        now = self.now()
        keep_s = ctx.timing.retention_s
        for name, job in state.periodic.items():
            if job.stopped:  # rule 7
                if name not in self._busy and forgettable(state, job, keep_s, now):
                    self._busy.add(name)
                    ctx.committer.submit(Item(
                        plan=functools.partial(plan_forget, name=name, keep_s=keep_s, now=now),
                        retry=False, gave_up=[Unran(name)]))
                continue
            known = self._next.get(name)
            if name in self._busy or (known is not None and known[0] is job and (
                    known[1] is None or now < known[1])):
                continue
            if due(state, job, now) is None:
                schedule = job.spec.schedule or ""
                self._next[name] = (job, None if job.stopped else next_fire(
                    schedule, job.spec.time_zone, position(job), now))
                continue
            self._busy.add(name)
            ctx.committer.submit(Item(
                plan=functools.partial(plan_pass, name=name, now=now, caps=self.caps),
                retry=False, gave_up=[Unran(name)]))

    def _forgot(self, forgot: Forgot, _sha: str) -> None:
        self._busy.discard(forgot.name)
        self._next.pop(forgot.name, None)

    def _ran(self, ran: Ran, _sha: str) -> None:
        self._busy.discard(ran.name)
        self.runs.labels("run" if ran.made else "skipped").inc()
        if ran.missed:
            self.runs.labels("missed").inc(ran.missed)
        if ran.made:
            self.ctx.wake()

    async def submit(self, spec: Spec) -> Message:
        return await self._commit(functools.partial(plan_submit, spec=spec, now=self.now()))

    async def cancel(self, name: str) -> Message:
        """Rule 1: the schedule stops, and its runs not yet ended are cancelled."""
        got = await self._commit(functools.partial(plan_cancel, name=name, now=self.now()))
        state = self.ctx.ledger.state()
        job = state.periodic.get(name)
        for entry in job.history if job is not None else ():
            rec = state.instances.get(entry.instance_id) if entry.instance_id else None
            if rec is not None and not rec.state.terminal and not rec.cancelling:
                self.promises.cancel(entry.instance_id)
        return got

    async def _commit(self, plan: Callable[..., Planned | None]) -> Message:
        waiter: asyncio.Future[Message] = asyncio.get_running_loop().create_future()

        self.ctx.committer.submit(Item(plan=functools.partial(plan, waiter=waiter),
                                       retry=False, gave_up=[Refuse(waiter)]))
        return await waiter

