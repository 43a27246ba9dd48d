"""The periodic job's plans as pure functions (`broker.periodic`): a `View` of an in-memory
`State` in, the change and its effects out. A run's record and the schedule's new position
are one change; a plan run again on the changed state makes nothing; a live run makes the
next fire time a skip; a submission or cancel answers once it lands."""

from __future__ import annotations

import asyncio

import msgspec

from gavel.broker.admission import live_instances
from gavel.broker.effects import Answer, Emit
from gavel.broker.ledger.plan import View
from gavel.broker.ledger.state import Change, State
from gavel.broker.periodic import (
    Forgot,
    Ran,
    forgettable,
    plan_cancel,
    plan_forget,
    plan_run,
    plan_submit,
    status_of,
)
from gavel.shared import cron
from gavel.shared.admission import Caps, refusal
from gavel.shared.api import CancelReply, InstanceStatus, SubmitReply
from gavel.shared.messages import ApiError, EventType
from gavel.shared.messages import InstanceState as S
from gavel.shared.periodic import HISTORY
from gavel.shared.reasons import Reason
from gavel.shared.records import (
    InstanceRecord,
    PeriodicRecord,
    PeriodicRun,
    ServiceRecord,
    ServiceVersion,
)
from gavel.shared.spec import Spec

T = 1_796_191_200  # 2026-12-02T06:00:00Z
SPEC = Spec(name="tick", command=["true"], schedule="*/10 * * * * *")


def _state(**job: object) -> State:
    st = State(head="h")
    st.put_periodic("tick", PeriodicRecord(name="tick", spec=SPEC, since=cron.stamp(T),
                                           **job))  # type: ignore[arg-type]
    return st


def _adopt(st: State, view: View) -> State:
    for iid, rec in view.change.instances.items():
        st.put_instance(iid, rec)
    for name, job in view.change.periodic.items():
        st.put_periodic(name, job)
    return st


def test_a_due_fire_time_makes_a_run_and_moves_the_position_in_one_change() -> None:
    st = _state()
    view = View(st, Change())
    planned = plan_run(view, "tick", T + 12)
    assert planned is not None
    rec = view.change.instances["tick-20261202t060010z"]
    assert rec is not None and rec.state is S.QUEUED and rec.spec.schedule is None
    job = view.change.periodic["tick"]
    assert job is not None and job.last_run == "2026-12-02T06:00:10Z"
    assert job.history == [PeriodicRun(at="2026-12-02T06:00:10Z",
                                       instance_id="tick-20261202t060010z")]
    assert planned.lines == ["periodic tick: run tick-20261202t060010z for 2026-12-02 "
                             "06:00:10 UTC"]
    assert planned.effects == [
        Emit("tick", EventType.PERIODIC_RUN,
             detail="tick-20261202t060010z for 2026-12-02 06:00:10 UTC"),
        Ran("tick", made=True)]
    # Planned again on what landed (a second pass, a broker started again): nothing.
    assert plan_run(View(_adopt(st, view), Change()), "tick", T + 12) is None


def test_a_live_run_makes_the_next_fire_time_a_skip_and_its_end_is_noted() -> None:
    st = _state()
    view = View(st, Change())
    plan_run(view, "tick", T + 10)
    st = _adopt(st, view)
    view = View(st, Change())
    planned = plan_run(view, "tick", T + 20)  # the first run has not ended
    assert planned is not None and not [i for i in view.change.instances if i != "tick"]
    job = view.change.periodic["tick"]
    assert job is not None and job.history[-1] == PeriodicRun(
        at="2026-12-02T06:00:20Z", skipped=str(Reason.PERIODIC_OVERLAP))
    assert planned.effects[0] == Emit("tick", EventType.PERIODIC_SKIPPED,
                                      reason=Reason.PERIODIC_OVERLAP,
                                      detail="2026-12-02 06:00:20 UTC")
    st = _adopt(st, view)
    first = st.instances["tick-20261202t060010z"]
    st.put_instance(first.instance_id, msgspec.structs.replace(first, state=S.SUCCEEDED))
    view = View(st, Change())
    assert plan_run(view, "tick", T + 30) is not None
    job = view.change.periodic["tick"]
    assert job is not None and [h.outcome for h in job.history] == ["succeeded", "", ""]
    assert job.history[-1].instance_id == "tick-20261202t060030z"


def test_after_an_outage_the_latest_missed_fire_time_runs_once() -> None:
    view = View(_state(last_run=cron.stamp(T)), Change())
    planned = plan_run(view, "tick", T + 45)
    assert planned is not None
    assert [i for i in view.change.instances] == ["tick-20261202t060040z"]
    job = view.change.periodic["tick"]
    assert job is not None and job.history[-1].missed == 3  # 10, 20, 30
    assert planned.effects[0] == Emit("tick", EventType.PERIODIC_SKIPPED,
                                      reason=Reason.PERIODIC_MISSED,
                                      detail="3 fire times before 2026-12-02 06:00:40 UTC")
    assert planned.effects[-1] == Ran("tick", made=True, missed=3)


def test_a_stopped_or_unknown_job_makes_nothing() -> None:
    assert plan_run(View(_state(stopped=True), Change()), "tick", T + 100) is None
    assert plan_run(View(_state(), Change()), "nope", T + 100) is None


def test_submit_makes_the_record_and_again_starts_afresh_from_now() -> None:
    async def go() -> None:
        waiter: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        view = View(State(head="h"), Change())
        planned = plan_submit(view, SPEC, T, waiter)  # type: ignore[arg-type]
        assert planned is not None
        assert planned.effects == [Answer(waiter, SubmitReply(instance_id="tick"))]
        assert view.change.periodic["tick"] == PeriodicRecord(name="tick", spec=SPEC,
                                                              since=cron.stamp(T))
        # The same spec again: nothing changes (a retried submit).
        view = View(_state(), Change())
        assert plan_submit(view, SPEC, T + 50, waiter) is not None  # type: ignore[arg-type]
        assert not view.change
        # Another spec, or a cancelled job: from now on, its history kept.
        view = View(_state(stopped=True, last_run=cron.stamp(T + 10)), Change())
        plan_submit(view, SPEC, T + 50, waiter)  # type: ignore[arg-type]
        job = view.change.periodic["tick"]
        assert job is not None and not job.stopped and job.since == cron.stamp(T + 50)
        assert plan_run(view, "tick", T + 55) is None  # 06:00:20 .. :50 were before it
    asyncio.run(go())


def test_cancel_stops_the_schedule() -> None:
    async def go() -> None:
        waiter: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        view = View(_state(), Change())
        planned = plan_cancel(view, "tick", waiter, T + 50)  # type: ignore[arg-type]
        assert planned is not None and planned.effects == [
            Emit("tick", EventType.CANCELLED, reason=Reason.PERIODIC_STOPPED),
            Answer(waiter, CancelReply(instance_id="tick", state="cancelled"))]
        job = view.change.periodic["tick"]
        assert job is not None and job.stopped and job.stopped_at == cron.stamp(T + 50)
        assert plan_run(view, "tick", T + 100) is None
    asyncio.run(go())


def test_status_shows_the_schedule_the_next_fire_time_and_each_runs_outcome() -> None:
    st = _state()
    view = View(st, Change())
    plan_run(view, "tick", T + 10)
    st = _adopt(st, view)
    got = status_of(st, st.periodic["tick"], T + 13, {},
                    lambda r: InstanceStatus(instance_id=r.instance_id, name="tick",
                                             state=str(r.state)))
    p = got.periodic
    assert p is not None and p.schedule == "*/10 * * * * *" and p.overlap == "skip"
    assert p.last_run == "2026-12-02T06:00:10Z" and p.next_run == "2026-12-02T06:00:20Z"
    assert [(h.instance_id, h.outcome) for h in p.history] == [
        ("tick-20261202t060010z", "queued")]
    assert [i.instance_id for i in got.instances] == ["tick-20261202t060010z"]
    # Forgotten by retention: the outcome noted in the history stays.
    st.put_instance("tick-20261202t060010z", None)
    job = msgspec.structs.replace(st.periodic["tick"], history=[msgspec.structs.replace(
        st.periodic["tick"].history[0], outcome="failed")])
    got = status_of(st, job, T + 13, {},
                    lambda r: InstanceStatus(instance_id="", name="", state=""))
    assert got.periodic is not None and got.periodic.history[0].outcome == "failed"
    assert got.instances == []


def test_a_record_forgotten_is_a_run_that_ended() -> None:
    st = _state(history=[PeriodicRun(at=cron.stamp(T), instance_id="tick-gone")])
    view = View(st, Change())
    assert plan_run(view, "tick", T + 10) is not None
    assert "tick-20261202t060010z" in view.change.instances


def test_a_name_a_service_has_is_refused() -> None:
    async def go() -> None:
        waiter: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        st = State(head="h")
        web = Spec(name="tick", type="service", command=["true"])
        st.put_service("tick", ServiceRecord(name="tick", version=1, versions=[
            ServiceVersion(version=1, spec=web)]))
        view = View(st, Change())
        planned = plan_submit(view, SPEC, T, waiter)  # type: ignore[arg-type]
        assert planned is not None and not view.change
        (answer,) = planned.effects
        assert isinstance(answer, Answer) and answer.message == ApiError(
            error=f"{Reason.NAME_TAKEN}: tick is a service or a system job")
    asyncio.run(go())


def test_a_long_run_stays_in_the_history_behind_its_skips_and_is_never_overlapped() -> None:
    st = _state()
    view = View(st, Change())
    plan_run(view, "tick", T + 10)  # a run that will not end
    st = _adopt(st, view)
    for k in range(2, HISTORY + 5):  # more skips than the history keeps
        view = View(st, Change())
        planned = plan_run(view, "tick", T + 10 * k)
        assert planned is not None and set(view.change.instances) == set(), k
        st = _adopt(st, view)
    job = st.periodic["tick"]
    assert job.history[0].instance_id == "tick-20261202t060010z"
    assert len(job.history) == HISTORY and all(h.skipped for h in job.history[1:])
    first = st.instances["tick-20261202t060010z"]
    st.put_instance(first.instance_id, msgspec.structs.replace(first, state=S.FAILED))
    view = View(st, Change())
    plan_run(view, "tick", T + 10 * (HISTORY + 5))
    job2 = view.change.periodic["tick"]
    assert job2 is not None and len(job2.history) == HISTORY
    assert job2.history[0].skipped and job2.history[-1].instance_id  # the ended run aged out


def test_a_run_past_the_cluster_cap_is_skipped_with_the_submits_refusal() -> None:
    """`--max-instances` holds for periodic runs as for any submit: at the cap the fire time
    is skipped with the same reason and sentence, and the schedule moves on; below it the
    run is made."""
    st = _state()
    for k in range(2):
        st.put_instance(f"busy-{k}", InstanceRecord(instance_id=f"busy-{k}", spec=SPEC))
    st.put_instance("done", InstanceRecord(instance_id="done", spec=SPEC, state=S.SUCCEEDED))
    view = View(st, Change())
    assert live_instances(view) == 2
    planned = plan_run(view, "tick", T + 12, Caps(per_service=0, instances=2))
    assert planned is not None and not view.change.instances
    job = view.change.periodic["tick"]
    assert job is not None and job.last_run == "2026-12-02T06:00:10Z"
    assert job.history == [PeriodicRun(at="2026-12-02T06:00:10Z",
                                       skipped=str(Reason.OVER_CLUSTER_CAP))]
    said = refusal(Caps(per_service=0, instances=2), live=2, adding=1)
    assert said.startswith(Reason.OVER_CLUSTER_CAP) and "--max-instances" in said
    assert planned.effects == [
        Emit("tick", EventType.PERIODIC_SKIPPED, reason=Reason.OVER_CLUSTER_CAP,
             detail=f"2026-12-02 06:00:10 UTC: {said}"),
        Ran("tick", made=False)]
    view = View(st, Change())
    assert plan_run(view, "tick", T + 12, Caps(per_service=0, instances=3)) is not None
    assert list(view.change.instances) == ["tick-20261202t060010z"]
    assert live_instances(view) == 3
    view.drop_instance("busy-0")
    assert live_instances(view) == 2


def test_a_cancelled_jobs_record_leaves_the_tree_after_the_retention_window() -> None:
    """Kept `retention_s` after its cancel (status still answers), and while a run of it is
    live; then dropped in one change, and a second pass on what landed changes nothing."""
    st = _state()
    view = View(st, Change())
    plan_run(view, "tick", T + 10)  # a run that has not ended
    st = _adopt(st, view)
    job = msgspec.structs.replace(st.periodic["tick"], stopped=True,
                                  stopped_at=cron.stamp(T + 20))
    st.put_periodic("tick", job)
    keep = 100.0
    assert not forgettable(st, job, keep, T + 119)  # inside the window
    assert not forgettable(st, job, keep, T + 500)  # its run is live
    run = st.instances["tick-20261202t060010z"]
    st.put_instance(run.instance_id, msgspec.structs.replace(run, state=S.CANCELLED))
    assert not forgettable(st, job, keep, T + 119) and forgettable(st, job, keep, T + 120)
    assert not forgettable(st, job, 0.0, T + 10_000)  # retention_s = 0 keeps it
    view = View(st, Change())
    planned = plan_forget(view, "tick", keep, T + 120)
    assert view.change.periodic == {"tick": None}
    assert planned.lines == ["periodic tick: forget its record, cancelled "
                             "2026-12-02T06:00:20Z (1 fire times in its history)"]
    assert planned.effects == [Forgot("tick")]
    st = _adopt(st, view)
    assert "tick" not in st.periodic
    view = View(st, Change())
    assert plan_forget(view, "tick", keep, T + 120).lines == [] and not view.change
    # A record stopped without a stamp counts from its latest fire time.
    unstamped = msgspec.structs.replace(job, stopped_at="", last_run=cron.stamp(T + 10))
    assert not forgettable(State(head="h"), unstamped, keep, T + 109)
    assert forgettable(State(head="h"), unstamped, keep, T + 110)
