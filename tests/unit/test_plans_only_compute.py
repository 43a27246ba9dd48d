"""Plans only compute: what a broker part hands the committer reads its view and returns the
change and the effects that follow, and changes nothing else while planning - no request is
answered, no note of the part's is dropped, until the committer carries the effects out in
commit order (`broker.ledger.committer` rule 4, `broker.effects`). Each plan here is called
as a pure function on a `View` of an in-memory `State`: no writer, no NATS."""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from pathlib import Path

import msgspec

from gavel.broker.deploys import Outcome, plan_verb
from gavel.broker.effects import Answer, Wake
from gavel.broker.integrity import Uncorrected, plan_pass
from gavel.broker.ledger.committer import Committer, Item, Planned, and_then, or_only
from gavel.broker.ledger.disputes import Dispute, Keep
from gavel.broker.ledger.plan import View, submit
from gavel.broker.ledger.repository import Ledger
from gavel.broker.ledger.state import Change, State, ready
from gavel.broker.onepass import OnePass, Passed
from gavel.broker.periodic import Unran
from gavel.broker.periodic import plan_pass as periodic_pass
from gavel.broker.promiseplans import plan_action
from gavel.broker.promises import Unacted, Unblocked
from gavel.broker.serviceplans import Clocks, replicas
from gavel.broker.submissions import plan_submission
from gavel.broker.watchdog import Action, Kind
from gavel.shared.api import SubmitReply, SubmitRequest
from gavel.shared.messages import ApiError, InstanceState, Message, Spec
from gavel.shared.reasons import Reason
from gavel.shared.records import InstanceRecord, PeriodicRecord, ServiceRecord, service_path
from tests.unit.commitkit import Failed, heard
from tests.unit.test_fuzz_broker import Rig

SPEC = Spec(name="job", command=["true"])
WEB = Spec(name="web", type="service", command=["true"])


@dataclass(frozen=True)
class Noted:
    what: str


def _waiter() -> asyncio.Future[Message | None]:
    return asyncio.get_running_loop().create_future()


# -- the committer: a plan that writes nothing ----------------------------------------------

async def test_a_refusal_runs_in_commit_order_and_stands_when_the_commit_is_given_up(
        tmp_path: Path) -> None:
    """A `Planned.only` plan's effects wait for the batch it was planned in; given up
    (pinned), the plan that wrote runs its `gave_up`, the one that only decided runs what it
    decided, not its `gave_up`."""
    ledger = Ledger(tmp_path / "state.git", ref="refs/tags/pinned")
    committer = heard(Committer(ledger, writer="thread"))
    seen: list[str] = []
    failed: list[str] = []
    committer.effects.on(Noted, lambda e, _sha: seen.append(e.what))
    planned: list[str] = []

    def writes(view: View) -> Planned:
        submit(view, InstanceRecord(instance_id="i", spec=SPEC))
        return Planned(lines=["submit i"], effects=[Noted("told")])

    def refuses(view: View) -> Planned:
        planned.append(f"planned, told {seen}")
        return Planned.only(Noted("refused"))

    runner = asyncio.create_task(committer.run())
    try:
        committer.submit(Item(plan=writes, retry=False, gave_up=[
            Noted("given up"), Failed(lambda r, _d: failed.append(r))]))
        committer.submit(Item(plan=refuses, retry=False, gave_up=[Noted("refuse given up")]))
        await asyncio.sleep(0)
        await asyncio.wait_for(committer.idle.wait(), 10)
    finally:
        runner.cancel()
        committer.close()
    assert planned == ["planned, told []"]  # nothing is carried out while planning
    assert seen == ["given up", "refused"]
    assert failed == [Reason.PINNED]


def test_or_only_and_and_then_put_what_follows_a_pass_into_its_effects() -> None:
    view = View(State(head="h"), Change())
    assert or_only(view, plan=lambda v: None, effects=(Noted("over"),)) == \
        Planned.only(Noted("over"))
    got = and_then(view, plan=lambda v: Planned(lines=["x"], effects=[Noted("a")]),
                   effects=(Noted("b"),))
    assert got.effects == [Noted("a"), Noted("b")] and got.writes
    assert and_then(view, plan=lambda v: None, effects=(Noted("b"),)) == \
        Planned.only(Noted("b"))


# -- submissions ---------------------------------------------------------------------------

def _commit_of(ids: list[str], key: str = "") -> dict[str, object]:
    req = SubmitRequest(spec=SPEC, count=len(ids), key=key)
    made = [ready(InstanceRecord(instance_id=i, spec=SPEC, key=key)) for i in ids]
    return {"req": req, "ids": ids, "start": 0, "end": len(ids), "made": made, "fresh": True}


async def test_a_submission_whose_id_is_taken_is_refused_by_its_only_effect() -> None:
    st = State(head="h")
    st.put_instance("job-1", InstanceRecord(instance_id="job-1", spec=SPEC))
    view = View(st, Change())
    done = _waiter()
    got = plan_submission(view, **_commit_of(["job-1"]), done=done)  # type: ignore[arg-type]
    assert got == Planned.only(Answer(done, ApiError(error=f"{Reason.DUPLICATE}: job-1")))
    assert not done.done()  # answered by the committer, once the batch is through
    assert not view.change


async def test_a_key_that_landed_another_way_is_answered_what_it_made() -> None:
    st = State(head="h")
    st.put_instance("job-1", InstanceRecord(instance_id="job-1", spec=SPEC, key="k"))
    view = View(st, Change())
    done = _waiter()
    got = plan_submission(view, **_commit_of(["job-1"], key="k"),  # type: ignore[arg-type]
                          done=done)
    assert got == Planned.only(Answer(done, SubmitReply.of(["job-1"])))
    assert not done.done() and not view.change


async def test_a_submission_that_fits_writes_its_records_and_answers_once_durable() -> None:
    view = View(State(head="h"), Change())
    done = _waiter()
    got = plan_submission(view, **_commit_of(["job-1", "job-2"]),  # type: ignore[arg-type]
                          done=done)
    assert got == Planned(lines=["submit 2 instances of job: job-1 .. job-2"],
                          effects=[Answer(done, None), Wake()])
    assert sorted(view.change.instances) == ["job-1", "job-2"]
    assert not done.done()


# -- deploys -------------------------------------------------------------------------------

def _deploy(view: View) -> Outcome:
    view.put_service(ServiceRecord(name="web", versions=[], version=1, count=1))
    return Planned(lines=["service web: deploy"]), ApiError(error="the reply")


async def test_a_verb_on_an_unreadable_service_is_refused_by_its_only_effect() -> None:
    st = State(head="h")
    st.unreadable[service_path("web")] = "not JSON"
    view = View(st, Change())
    done = _waiter()
    got = plan_verb(view, name="web", plan=_deploy, pinned="", done=done)
    assert got == Planned.only(Answer(done, ApiError(
        error=f"{Reason.UNREADABLE_FILE}: {service_path('web')} (not JSON)")))
    assert not done.done() and not view.change


async def test_a_verb_on_a_pinned_deployment_or_with_nothing_to_do_only_answers() -> None:
    done = _waiter()
    view = View(State(head="h"), Change())
    assert plan_verb(view, name="web", plan=_deploy, pinned="refs/tags/v1", done=done) == \
        Planned.only(Answer(done, ApiError(error=f"{Reason.PINNED} (refs/tags/v1)")))
    nothing = plan_verb(view, name="web", plan=lambda v: (None, None), pinned="", done=done)
    assert nothing == Planned.only(Answer(done, None))
    assert not done.done() and not view.change


async def test_a_verb_that_writes_answers_after_its_own_effects() -> None:
    done = _waiter()
    view = View(State(head="h"), Change())
    got = plan_verb(view, name="web", plan=_deploy, pinned="", done=done)
    assert got.effects == [Answer(done, ApiError(error="the reply")), Wake()]
    assert "web" in view.change.services and not done.done()


# -- one pass a name -----------------------------------------------------------------------

def test_a_pass_with_nothing_to_do_holds_its_name_until_its_effect_runs(
        tmp_path: Path) -> None:
    committer = Committer(Ledger(tmp_path / "state.git"), writer="thread")
    passes = OnePass(committer)
    passes.submit("web", lambda view: None)
    [item] = committer._queue
    got = item.plan(View(State(head="h"), Change()))
    assert got is not None and not got.writes
    assert [(type(e), e.name) for e in got.effects] == [(Passed, "web")]  # type: ignore[attr-defined]
    assert passes.busy("web")  # planning frees nothing: a re-planned pass still holds it
    passes.submit("web", lambda view: None)
    assert len(committer._queue) == 1
    for effect in got.effects:
        committer.effects.run(effect, "")
    assert not passes.busy("web")
    committer.close()


def test_a_periodic_pass_with_nothing_due_only_frees_the_job() -> None:
    st = State(head="h")
    tick = Spec(name="tick", command=["true"], schedule="* * * * *")
    st.put_periodic("tick", PeriodicRecord(name="tick", spec=tick, stopped=True))
    view = View(st, Change())
    assert periodic_pass(view, "tick", 1_000_000) == Planned.only(Unran("tick"))
    assert periodic_pass(view, "nope", 1_000_000) == Planned.only(Unran("nope"))
    assert not view.change


# -- integrity -----------------------------------------------------------------------------

def test_disputes_closed_meanwhile_are_noted_by_an_effect_not_while_planning() -> None:
    gone = Dispute(instance_id="i", kept="n1", rule=Keep.HISTORY, held=("n1", "n2"),
                   dropped=("n2",))
    view = View(State(head="h"), Change())
    assert plan_pass(view, [gone]) == Planned.only(Uncorrected((gone,)))
    assert not view.change  # not open in this view: closed meanwhile, nothing corrected


# -- reauction: the keeper counts a new copy from the view its old one stops in ---------

def test_a_moved_copy_counts_from_the_view_in_which_the_replica_it_replaces_stops() -> None:
    st = State(head="h")
    for iid in ("web-1", "web-2"):
        st.put_instance(iid, InstanceRecord(instance_id=iid, spec=WEB, service="web",
                                            version=1, state=InstanceState.RUNNING))
    clocks = Clocks(moving={"web-2": "web-1"})  # web-2 is the move of web-1
    view = View(st, Change())
    recs = view.replicas("web")
    assert [r.instance_id for r in replicas(view, recs, clocks, 0.0)] == ["web-1"]
    # the stop commit's own view: web-1 stops, web-2 stands for it - nothing else changed
    rec = view.instance("web-1")
    assert rec is not None
    view.put_instance(InstanceRecord(instance_id="web-1", spec=WEB, service="web", version=1,
                                     state=InstanceState.RUNNING, cancelling=True))
    assert [r.instance_id for r in replicas(view, view.replicas("web"), clocks, 0.0)] == \
        ["web-2"]


# -- promises: a node's unblocking and a verdict stay noted until their effect -------------

def test_an_unblocking_holds_its_node_until_its_effect_runs(rig: Rig) -> None:
    b = rig.b
    state = b.ledger.state()
    view = View(state)
    nf = view.node("n1")
    assert nf is not None
    view.change.nodes["n1"] = msgspec.structs.replace(nf, blocked_ports=[20500])
    b.ledger.apply(view.change, "block 20500 on n1", state.head)
    b.committer._queue.clear()
    b.promises.ports_freed("n1", [20500])
    [item] = b.committer._queue
    got = item.plan(View(b.ledger.state()))
    assert got is not None and got.lines == ["ports 20500 on n1 are free again: unblocked"]
    assert got.effects == [Unblocked("n1")]
    b.promises.ports_freed("n1", [20500])  # planned, not landed: still in flight
    assert len(b.committer._queue) == 1
    for effect in got.effects:
        b.committer.effects.run(effect, "")
    b.promises.ports_freed("n1", [20500])  # its commit is through: it may be asked again
    assert len(b.committer._queue) == 2


def test_a_verdict_with_nothing_left_to_do_is_let_go_by_its_effect(rig: Rig) -> None:
    b = rig.b
    action = Action(Kind.EXPIRE, "gone", "n1")  # no such instance: nothing to do
    b.promises.acting.add((action.kind, action.instance_id))
    plan = functools.partial(and_then, plan=functools.partial(plan_action, a=action),
                             effects=(Unacted(action),))
    got = plan(View(b.ledger.state()))
    assert got == Planned.only(Unacted(action))
    assert b.promises.acting == {(Kind.EXPIRE, "gone")}  # planning let nothing go
    b.committer.effects.run(Unacted(action), "")
    assert not b.promises.acting
