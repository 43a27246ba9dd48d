"""The plans of services, system jobs and batch arrays as pure functions: a `View` of an
in-memory `State` in, the change and its effects out - no committer, no writer, no NATS, no
clock."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import msgspec

from gavel.broker.arrays import plan_array
from gavel.broker.deploys import plan_deploy, plan_scale, plan_stop
from gavel.broker.effects import Arm, Emit, Publish, Release, Timer, Wake
from gavel.broker.ledger.committer import Planned
from gavel.broker.ledger.plan import View
from gavel.broker.ledger.state import Change, State
from gavel.broker.serviceplans import (
    EndsTaken,
    KeepInputs,
    Started,
    SystemInputs,
    SystemStarted,
    plan_keep,
    plan_system,
    system_decision,
)
from gavel.shared import subjects
from gavel.shared.admission import Caps
from gavel.shared.api import DeployReply
from gavel.shared.messages import Cancel, EventType, InstanceState, Spec
from gavel.shared.reasons import Reason
from gavel.shared.records import (
    Assignment,
    Deployment,
    InstanceRecord,
    NodeFile,
    ServiceRecord,
    ServiceVersion,
)
from gavel.shared.systems import Node

EPOCH = 3
NOW = 100.0
STAMP = "2026-01-01T00:00:00.000Z"


def _service(count: int, replicas: dict[str, str], system: bool = False) -> View:
    """Service ``web`` of `count`, with live replicas by id -> node ("" for none yet)."""
    spec = Spec(name="web", command=["true"], count=1 if system else count,
                type="system" if system else "service")
    st = State(head="h")
    st.put_service("web", ServiceRecord(
        name="web", versions=[ServiceVersion(version=1, spec=spec)], version=1, count=count))
    nodes: dict[str, dict[str, Assignment]] = {}
    for iid, node in replicas.items():
        st.put_instance(iid, InstanceRecord(instance_id=iid, spec=spec, service="web",
                                            version=1, only_node=node if system else ""))
        if node:
            nodes.setdefault(node, {})[iid] = Assignment(instance_id=iid, auction_id="a",
                                                         attempt=1)
    for node, held in nodes.items():
        st.put_node(node, NodeFile(node_id=node, instances=held))
    return View(st, Change())


def _keep(view: View, ended: tuple[tuple[str, str, str], ...] = (),
          seed: int = 1) -> Planned | None:
    return plan_keep(view, "web", KeepInputs(now=NOW, stamp=STAMP, epoch=EPOCH, seed=seed,
                                             start_chunk=100, ended=ended))


def _system(nodes: dict[str, Node], seed: int, **given: Any) -> SystemInputs:
    return SystemInputs(nodes=nodes, stamp=STAMP, epoch=EPOCH, seed=seed, **given)


def _ids(seed: int, n: int) -> tuple[str, ...]:
    rng = random.Random(seed)
    return tuple(f"web-{rng.getrandbits(24):06x}" for _ in range(n))


def test_missing_replicas_start_and_their_clocks_are_noted_once_landed() -> None:
    view = _service(2, {})
    planned = _keep(view)
    assert planned is not None
    made = _ids(1, 2)
    assert sorted(k for k, v in view.change.instances.items() if v is not None) == sorted(made)
    assert planned.lines == [f"service web: start {iid} (version 1)" for iid in made]
    assert planned.effects == [Started("web", made, NOW)]


def test_a_replacement_names_the_replica_that_ended_and_takes_it_off_the_list() -> None:
    view = _service(2, {"web-old": "n1"})
    planned = _keep(view, ended=(("web-gone", "failed", "exited 1"),))
    assert planned is not None
    new = _ids(1, 1)[0]
    assert planned.lines[0] == f"service web: replace web-gone (failed: exited 1) with {new}"
    assert planned.effects == [
        Emit("web", EventType.REPLACED, reason="exited 1", detail=f"web-gone (failed) by {new}"),
        EndsTaken("web", 1, True), Started("web", (new,), NOW)]


def test_a_surplus_replica_on_a_node_is_cancelled_there_with_its_grace_armed() -> None:
    view = _service(1, {"web-a": "n1", "web-b": "n1"})
    planned = _keep(view)
    assert planned is not None
    # The keeper's stop order: the unhealthy first, then the least settled; ties on the id.
    stopped = [iid for iid in ("web-a", "web-b")
               if (rec := view.change.instances.get(iid)) is not None and rec.cancelling]
    assert len(stopped) == 1
    iid = stopped[0]
    assert planned.effects == [
        Arm(Timer.CANCEL_GRACE, iid, "n1"),
        Publish(subjects.CANCEL.format(node="n1"),
                Cancel(instance_id=iid, node_id="n1", epoch=EPOCH, attempt=1)),
        Emit("web", EventType.STOPPING, node_id="n1", reason=Reason.SCALED_DOWN, detail=iid),
        Started("web", (), NOW)]


def test_a_surplus_replica_on_no_node_ends_at_once() -> None:
    view = _service(0, {"web-a": ""})
    planned = _keep(view)
    assert planned is not None
    assert planned.effects == [
        Emit("web-a", EventType.CANCELLED, reason=Reason.SCALED_DOWN), Release("web-a"),
        Emit("web", EventType.STOPPING, node_id="", reason=Reason.SCALED_DOWN,
             detail="web-a"),
        Started("web", (), NOW)]


def test_a_whole_service_plans_nothing() -> None:
    assert _keep(_service(1, {"web-a": "n1"})) is None


def test_two_plans_on_one_view_start_a_replacement_once() -> None:
    view = _service(1, {})
    first = _keep(view, ended=(("web-gone", "failed", "x"),))
    second = _keep(view, ended=(("web-gone", "failed", "x"),), seed=2)
    assert first is not None and len(first.lines) == 1
    assert second is None


def test_a_system_job_starts_one_instance_on_each_node_and_none_twice() -> None:
    view = _service(1, {"web-a": "n1"}, system=True)
    nodes = {"n1": Node(labels={}), "n2": Node(labels={}), "n3": Node(labels=None)}
    planned = plan_system(view, "web", _system(nodes, seed=1))
    assert planned is not None
    new = _ids(1, 1)[0]
    assert planned.lines == [f"system web: start {new} on n2 (version 1)"]
    assert planned.effects == [Emit("web", EventType.REPLACED, node_id="n2",
                                    detail=f"{new} for n2"),
                               SystemStarted("web", ((new, "n2"),))]
    again = plan_system(view, "web", _system(nodes, seed=2))
    assert again is None


def test_a_system_jobs_deploy_succeeds_only_once_no_older_version_is_left() -> None:
    """While the roll waits on a new instance's health, the plan changes nothing and the
    deployment stays running; once the last old one is gone and no node lacks one, it
    succeeds."""
    view = _service(1, {"web-a": "n1", "web-b": "n2"}, system=True)
    svc = view.state.services["web"]
    v2 = msgspec.structs.replace(svc.versions[0].spec, env={"V": "2"})
    svc = msgspec.structs.replace(svc, version=2, versions=[
        *svc.versions, ServiceVersion(version=2, spec=v2)],
        deployment=Deployment(to_version=2, from_version=1))
    view.state.put_service("web", svc)
    new = InstanceRecord(instance_id="web-c", spec=v2, service="web", version=2,
                         only_node="n1")
    view.state.put_instance("web-c", new)
    old_a = view.state.instances["web-a"]
    view.state.put_instance("web-a", msgspec.structs.replace(old_a,
                                                             state=InstanceState.CANCELLED))
    nodes = {"n1": Node(labels={}), "n2": Node(labels={})}

    def plan(settled: set[str]) -> Planned | None:
        return plan_system(View(view.state, Change()), "web",
                           _system(nodes, seed=1, settled=settled))
    assert plan(set()) is None  # web-c not healthy yet: web-b keeps version 1
    rolled = plan({"web-c"})
    assert rolled is not None and rolled.lines[-1].startswith("system web: stop web-b")
    assert not any("deployed" in line for line in rolled.lines)
    view.state.put_instance("web-b", msgspec.structs.replace(
        view.state.instances["web-b"], state=InstanceState.CANCELLED))
    view.state.put_instance("web-d", msgspec.structs.replace(new, instance_id="web-d",
                                                             only_node="n2"))
    done = plan({"web-c", "web-d"})
    assert done is not None and done.lines == ["system web: deployed version 2"]


def test_a_system_job_starts_no_instance_past_the_cluster_cap_on_its_view() -> None:
    """`shared.systems` rule 7 in the plan: the live instances the view leaves (the state's
    and what this change already made) count, so a second plan on one view finds the room
    the first took; another job's instance that ends makes room for the capped node."""
    view = _service(1, {"web-a": "n1"}, system=True)
    other = InstanceRecord(instance_id="job-x", spec=Spec(name="job", command=["true"]))
    view.state.put_instance("job-x", other)
    nodes = {n: Node(labels={}) for n in ("n1", "n2", "n3")}
    caps = Caps(per_service=10, instances=3)

    def plan(v: View, seed: int = 1) -> Planned | None:
        return plan_system(v, "web", _system(nodes, seed=seed, caps=caps))
    planned = plan(view)
    assert planned is not None
    assert [line.split(" on ")[1] for line in planned.lines] == ["n2 (version 1)"]
    assert plan(view, seed=2) is None  # n3 waits: the change above took the last room
    state = view.state
    for iid, rec in view.change.instances.items():
        state.put_instance(iid, rec)
    full = View(state, Change())
    assert plan(full) is None
    svc, recs = state.services["web"], state.replicas_of("web")
    assert system_decision(full, svc, recs, nodes, set(), caps=caps).capped == ["n3"]
    state.put_instance("job-x", msgspec.structs.replace(other, state=InstanceState.FAILED))
    again = plan(View(state, Change()))
    assert again is not None and any(" on n3 " in line for line in again.lines)


# -- batch arrays --------------------------------------------------------------------------
def _array(done: InstanceState) -> View:
    """Array ``job`` of two tasks, one at a time: ``job-1`` has come to `done`, ``job-2``
    is held."""
    spec = Spec(name="job", command=["true"], count=2, parallelism=1)
    st = State(head="h")
    st.put_instance("job-1", InstanceRecord(instance_id="job-1", spec=spec, array="job",
                                            state=done))
    st.put_instance("job-2", InstanceRecord(instance_id="job-2", spec=spec, array="job",
                                            held=True, reason=str(Reason.ARRAY_HELD)))
    return View(st, Change())


def test_an_array_releases_a_held_task_into_a_free_slot_and_asks_for_the_next_pass() -> None:
    view = _array(InstanceState.SUCCEEDED)
    planned = plan_array(view, "job")
    assert planned is not None
    released = view.change.instances["job-2"]
    assert released is not None and not released.held
    assert planned.effects == [Emit("job", EventType.RELEASED, detail="job-2"), Wake()]


def test_an_array_past_its_failures_cancels_its_held_tasks() -> None:
    view = _array(InstanceState.FAILED)
    planned = plan_array(view, "job")
    assert planned is not None
    cancelled = view.change.instances["job-2"]
    assert cancelled is not None and cancelled.state is InstanceState.CANCELLED
    assert planned.effects == [Emit("job-2", EventType.CANCELLED, reason=Reason.ARRAY_FAILED)]


# -- the deploy verbs ----------------------------------------------------------------------
def test_the_deploy_verbs_stamp_and_name_what_they_make_from_their_inputs() -> None:
    """A verb's plan is a function of the request and `KeepInputs`: its wall clock stamps
    the version and the deployment, its seed names the first replicas."""
    spec = Spec(name="web", type="service", command=["true"], count=2)
    view = View(State(head="h"), Change())
    keep = KeepInputs(now=NOW, stamp=STAMP, epoch=EPOCH, seed=4, start_chunk=100)
    planned, reply = plan_deploy(view, spec=spec, check_index=None, keep=keep)
    assert planned is not None and reply == DeployReply(name="web", version=1)
    svc = view.change.services["web"]
    assert svc is not None and svc.deployment is not None
    assert (svc.versions[0].at, svc.deployment.started_at) == (STAMP, STAMP)
    assert planned.lines[1:] == [f"service web: start {iid} (version 1)" for iid in _ids(4, 2)]
    later = dataclasses.replace(keep, stamp="2031-01-01T00:00:00.000Z", seed=5)
    running = View(view.state, Change())
    running.state.put_service("web", svc)
    planned, _ = plan_scale(running, name="web", count=3, keep=later)
    assert planned is not None
    starts = [line for line in planned.lines if " start " in line]
    assert starts == [f"service web: start {iid} (version 1)" for iid in _ids(5, 3)]
    planned, _ = plan_stop(running, name="web", keep=later)
    stopped = running.change.services["web"]
    assert planned is not None and stopped is not None and stopped.deployment is not None
    assert (stopped.deployment.state, stopped.deployment.ended_at) == \
        ("cancelled", later.stamp)
