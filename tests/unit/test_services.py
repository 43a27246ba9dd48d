"""The services part in memory (`broker.services`): a real broker - real ledger in a temp git
repository, real committer, promises and API - on a stand-in wire with a fake clock. Health
is what the tests report as the node would (`gavel.report.<node>` events through the real
handler): a deploy is gated on it, fails and reverts without it; ends are replaced after
their back-off, naming the replica; stops keep their reasons; every pass is idempotent, and
a broker started again on the same repository carries on without a double replica."""

from __future__ import annotations

import functools
import itertools
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gavel.broker.ledger.plan import View, place
from gavel.broker.ledger.repository import Ledger
from gavel.broker.service import Broker, Config
from gavel.broker.serviceplans import plan_keep
from gavel.shared import subjects
from gavel.shared.api import (
    DeployReply,
    DeployRequest,
    RollbackRequest,
    ScaleRequest,
    ServiceReply,
    ServiceRequest,
    ServicesReply,
    ServicesRequest,
    StatusReply,
    StatusRequest,
    StopServiceRequest,
)
from gavel.shared.auction import Awarded
from gavel.shared.award import NodeBid
from gavel.shared.messages import ApiError, Cancel, Event, InstanceReport, Request
from gavel.shared.messages import InstanceState as S
from gavel.shared.reasons import Reason
from gavel.shared.records import InstanceRecord, service_path
from gavel.shared.spec import Check, Spec, Update
from gavel.shared.timing import Timing
from tests.unit.fuzzkit import Msg
from tests.unit.test_fuzz_broker import Rig, heartbeat

_enc = msgspec.msgpack.Encoder()
_CALLS = itertools.count()
UPDATE = Update(min_healthy_s=1.0, healthy_deadline_s=5.0)


def web(count: int = 3, checks: bool = False, version: str = "1", **kw: Any) -> Spec:
    return Spec(name="web", type="service", command=["serve"], count=count, cpu=0.1,
                memory_mb=16, env={"V": version}, update=kw.pop("update", UPDATE),
                checks=[Check(type="exec", command=["true"])] if checks else [], **kw)


def call(rig: Rig, verb: str, req: msgspec.Struct, reply: type[Any]) -> Any:
    inbox = f"_INBOX.api.{next(_CALLS)}"
    msg = Msg(subjects.API.format(verb=verb), _enc.encode(req), reply=inbox)
    rig.run(rig.api._serve(verb, msg))
    settle(rig)
    (answer,) = rig.answers(inbox)
    return msgspec.msgpack.decode(answer, type=reply | ApiError)


def settle(rig: Rig) -> None:
    for _ in range(3):
        rig.run(rig.b.committer.idle.wait())


def sweep(rig: Rig) -> str | None:
    """One pass of the keeper at the rig's clock; the head after its commit, if any."""
    rig.run(rig.b.services.watch(rig.now))
    settle(rig)
    return rig.b.ledger.head()


def live(rig: Rig, version: int | None = None) -> list[InstanceRecord]:
    state = rig.b.ledger.state()
    return sorted((r for r in state.replicas_of("web") if not r.state.terminal
                   and (version is None or r.version == version)),
                  key=lambda r: r.instance_id)


def report(rig: Rig, iid: str, kind: str, node: str = "n1", **kw: Any) -> None:
    rig.b.promises.on_report(Msg(subjects.REPORT.format(node=node), _enc.encode(
        Event(instance_id=iid, type=kind, node_id=node, attempt=1, **kw))))
    settle(rig)


def place_waiting(rig: Rig, node: str = "n1", healthy: bool = False) -> list[str]:
    """Place every waiting replica on `node` (as an auction's commit would) and report it
    running - and healthy, with `healthy` - as its node would."""
    state = rig.b.ledger.state()
    waiting = [r for r in live(rig) if state.placement_of(r.instance_id) is None]
    view = View(state)
    for r in waiting:
        won = Awarded(request=Request.of(r.instance_id, r.spec), winner=NodeBid(
            node_id=node, load=0.1, strategy="least-loaded"), tie_broken=False, bids=[],
            declines=[], silent=[])
        assert place(view, won, "auction-s", [20000, 20999]) is not None
    if waiting:
        rig.b.ledger.apply(view.change, "place replicas", state.head)
    for r in waiting:
        report(rig, r.instance_id, "running", node)
        if healthy:
            report(rig, r.instance_id, "healthy", node)
    return [r.instance_id for r in waiting]


def messages(rig: Rig) -> list[str]:
    return [c.message for c in rig.b.ledger.history()]


def service_events(rig: Rig) -> list[Event]:
    return [e for e in rig.b.events if e.instance_id == "web"]


def deployed(rig: Rig, spec: Spec) -> DeployReply:
    got = call(rig, "deploy", DeployRequest(spec=spec), DeployReply)
    assert isinstance(got, DeployReply), got
    return got


def test_deploy_writes_the_service_and_its_replicas_and_a_pass_twice_changes_nothing(
        rig: Rig, tmp_path: Path) -> None:
    reply = deployed(rig, web(count=3))
    assert (reply.name, reply.version, reply.changed) == ("web", 1, True)
    state = rig.b.ledger.state()
    svc = state.services["web"]
    assert (svc.version, svc.count, svc.deployment and svc.deployment.state) == \
        (1, 3, "running")
    assert [(r.service, r.version, r.state) for r in live(rig)] == [("web", 1, S.QUEUED)] * 3
    assert all(r.instance_id.startswith("web-") for r in live(rig))
    head = rig.b.ledger.head()
    assert sweep(rig) == head and sweep(rig) == head  # idempotent: nothing to do
    assert deployed(rig, web(count=3)).changed is False and rig.b.ledger.head() == head
    fresh = Ledger(rig.b.ledger.path).state()  # what git holds, read afresh
    assert fresh.services["web"] == svc and sorted(fresh.replicas["web"]) == \
        sorted(r.instance_id for r in live(rig))
    again = Broker(Config(nats_url="nats://127.0.0.1:1", state_dir=tmp_path, writer="thread",
                          timing=Timing().scaled(10), clock=lambda: rig.now))
    rig.run(again.services.watch(rig.now))  # a broker started again: the count is met in git
    assert again.committer.idle.is_set(), "it submitted a change"
    again.committer.close()


def restart(rig: Rig, tmp_path: Path) -> Broker:
    """A new broker on the same repository (the old one is dropped as if killed), on the
    rig's wire and clock, its node heard again by its first heartbeat."""
    again = Broker(Config(nats_url="nats://127.0.0.1:1", state_dir=tmp_path, writer="thread",
                          timing=Timing().scaled(10), clock=lambda: rig.now))
    again.nc = again.outbox.nc = rig.wire
    rig.tasks += [rig.loop.create_task(again.committer.run()),
                  rig.loop.create_task(again.outbox.run())]
    rig.b, rig.api = again, again.api
    return again


def test_a_broker_started_again_mid_deploy_carries_on_without_a_double_replica(
        rig: Rig, tmp_path: Path) -> None:
    deployed(rig, web(count=2))
    place_waiting(rig)
    sweep(rig)
    rig.now += 1
    sweep(rig)
    deployed(rig, web(count=2, version="2"))
    (first,) = place_waiting(rig)
    sweep(rig)
    rig.now += 1
    sweep(rig)  # one old replica superseded, the second new one started
    assert len(live(rig, 2)) == 2 and sum(r.cancelling for r in live(rig)) == 1
    again = restart(rig, tmp_path)
    state = again.ledger.state()
    running = [(i, "running") for i in state.where]
    again._on_heartbeat(Msg(subjects.HEARTBEAT.format(node="n1"), _enc.encode(heartbeat(
        "n1", instances=[InstanceReport(instance_id=i, state=st) for i, st in running]))))
    head = sweep(rig)
    assert rig.b.ledger.head() == head and len(live(rig, 2)) == 2, "no double replica"
    for r in live(rig):
        if r.cancelling:  # the old broker's cancel: the node confirms it to the new one
            report(rig, r.instance_id, "cancelled", reason=Reason.CANCELLED)
    place_waiting(rig)
    for _ in range(6):
        rig.now += 1
        sweep(rig)
        for r in live(rig):
            if r.cancelling:
                report(rig, r.instance_id, "cancelled", reason=Reason.CANCELLED)
    svc = rig.b.ledger.state().services["web"]
    assert svc.deployment is not None and svc.deployment.state == "succeeded"
    made = [r for r in rig.b.ledger.state().replicas_of("web") if r.version == 2]
    assert len(made) == 2 and first in {r.instance_id for r in made}
    olds = [r for r in rig.b.ledger.state().replicas_of("web") if r.version == 1]
    assert [(r.state, r.reason) for r in olds] == [(S.CANCELLED, Reason.SUPERSEDED)] * 2


def test_a_rolling_deploy_waits_for_reported_health_at_every_step(rig: Rig) -> None:
    deployed(rig, web(count=2, checks=True))
    place_waiting(rig)
    rig.now += 2
    assert sweep(rig) == rig.b.ledger.head()
    svc = rig.b.ledger.state().services["web"]
    assert svc.healthy_version == 0, "running is not healthy for a spec with checks"
    for r in live(rig):
        report(rig, r.instance_id, "healthy")
    sweep(rig)  # healthy from now
    rig.now += 1
    sweep(rig)
    svc = rig.b.ledger.state().services["web"]
    assert (svc.healthy_version, svc.deployment and svc.deployment.state) == (1, "succeeded")

    old = [r.instance_id for r in live(rig)]
    assert deployed(rig, web(count=2, checks=True, version="2")).version == 2
    (first,) = [r.instance_id for r in live(rig, 2)]  # max_parallel 1: one new replica
    place_waiting(rig)
    rig.now += 3
    sweep(rig)
    assert [r.instance_id for r in live(rig, 1)] == old and not any(
        r.cancelling for r in live(rig)), "no old replica stops for an unhealthy new one"
    report(rig, first, "healthy")
    sweep(rig)
    rig.now += 0.5
    sweep(rig)
    assert not any(r.cancelling for r in live(rig)), "healthy, but not for min_healthy_s"
    rig.now += 0.5
    sent = len(rig.wire.sent)
    sweep(rig)
    stopping = [r for r in live(rig) if r.cancelling]
    assert len(stopping) == 1 and stopping[0].version == 1
    assert stopping[0].reason == Reason.SUPERSEDED
    assert len(live(rig, 2)) == 2, "the next new replica starts as the old one stops"
    cancels = [msgspec.msgpack.decode(p, type=Cancel) for s, p in rig.wire.sent[sent:]
               if s == subjects.CANCEL.format(node="n1")]
    assert [c.instance_id for c in cancels] == [stopping[0].instance_id]
    report(rig, stopping[0].instance_id, "cancelled", reason=Reason.CANCELLED)
    rec = rig.b.ledger.state().instances[stopping[0].instance_id]
    assert (rec.state, rec.reason) == (S.CANCELLED, Reason.SUPERSEDED)  # the stop's reason
    assert [e.reason for e in rig.b.events if e.instance_id == rec.instance_id
            and e.type == "cancelled"] == [Reason.SUPERSEDED]  # in its event too

    for iid in place_waiting(rig, healthy=True):
        assert iid != first
    sweep(rig)
    rig.now += 1
    sweep(rig)
    (last,) = [r for r in live(rig) if r.cancelling]
    report(rig, last.instance_id, "cancelled", reason=Reason.CANCELLED)
    rig.now += 1
    sweep(rig)
    svc = rig.b.ledger.state().services["web"]
    assert svc.deployment is not None and svc.deployment.state == "succeeded"
    assert (svc.version, svc.healthy_version) == (2, 2)
    assert [r.version for r in live(rig)] == [2, 2]
    log = "\n".join(messages(rig))
    assert log.count("service web: stop ") == 2 and "service web: deployed version 2" in log
    assert rig.b.metrics.deploys.labels(outcome="succeeded")._value.get() == 2


def test_a_deploy_not_healthy_in_time_fails_and_rolls_back(rig: Rig) -> None:
    deployed(rig, web(count=1))
    place_waiting(rig)  # no checks: running is healthy
    sweep(rig)
    rig.now += 1
    sweep(rig)
    assert rig.b.ledger.state().services["web"].healthy_version == 1
    deployed(rig, web(count=1, version="2"))
    (bad,) = place_waiting(rig)
    report(rig, bad, "unhealthy", check="exec true: exit 1")
    rig.now += 4.9
    sweep(rig)
    assert rig.b.ledger.state().services["web"].version == 2
    rig.now += 0.2  # past healthy_deadline_s since it appeared
    sweep(rig)
    svc = rig.b.ledger.state().services["web"]
    dep = svc.deployment
    assert svc.version == 1 and dep is not None
    assert (dep.to_version, dep.from_version, dep.state, dep.reason) == \
        (1, 2, "running", Reason.ROLLED_BACK)
    assert f"{Reason.DEPLOY_UNHEALTHY} ({bad})" in dep.detail
    assert any(f"service web: deploy of version 2 failed: {Reason.DEPLOY_UNHEALTHY} ({bad}); "
               "rolling back to version 1" in m for m in messages(rig))
    kinds = [(e.type, e.reason) for e in service_events(rig)]
    assert ("deploy-failed", Reason.DEPLOY_UNHEALTHY) in kinds
    assert ("deploying", Reason.ROLLED_BACK) in kinds
    sweep(rig)
    (going,) = [r for r in live(rig) if r.cancelling]
    assert (going.instance_id, going.reason) == (bad, Reason.SUPERSEDED)
    rig.now += 0.1
    sweep(rig)
    dep = rig.b.ledger.state().services["web"].deployment
    assert dep is not None and dep.state == "rolled-back"
    m = rig.b.metrics.deploys
    assert (m.labels(outcome="failed")._value.get(),
            m.labels(outcome="rolled-back")._value.get()) == (1, 1)


def test_an_ended_replica_is_replaced_after_its_back_off_naming_it(rig: Rig) -> None:
    deployed(rig, web(count=2))
    place_waiting(rig)
    sweep(rig)
    rig.now += 1
    sweep(rig)
    dep = rig.b.ledger.state().services["web"].deployment
    assert dep is not None and dep.state == "succeeded"
    victim = live(rig)[0].instance_id
    report(rig, victim, "exited", exit_code=1)
    assert rig.b.ledger.state().instances[victim].state is S.FAILED
    head = sweep(rig)  # the end is noticed; the back-off holds the replacement a tick
    assert len(live(rig)) == 1 and rig.b.ledger.head() == head
    rig.now += rig.b.timing.tick_s
    sweep(rig)
    assert len(live(rig)) == 2
    line = next(m for m in messages(rig) if "replace" in m)
    assert f"service web: replace {victim} (failed: {Reason.EXITED_NONZERO}) with " in line
    ev = [e for e in service_events(rig) if e.type == "replaced"]
    assert len(ev) == 1 and ev[0].reason == Reason.EXITED_NONZERO
    assert ev[0].detail.startswith(f"{victim} (failed) by web-")
    # A second end in a row waits twice as long.
    (again,) = place_waiting(rig)
    report(rig, again, "exited", exit_code=2)
    sweep(rig)
    rig.now += rig.b.timing.tick_s
    sweep(rig)
    assert len(live(rig)) == 1, "the second end in a row is held for two ticks"
    rig.now += rig.b.timing.tick_s
    sweep(rig)
    assert len(live(rig)) == 2


def test_scale_down_and_stop_cancel_with_their_reasons_and_replace_nothing(rig: Rig) -> None:
    deployed(rig, web(count=3))
    place_waiting(rig)
    got = call(rig, "scale", ScaleRequest(name="web", count=1), ServiceReply)
    assert isinstance(got, ServiceReply) and got.service.count == 1
    stopping = [r for r in live(rig) if r.cancelling]
    assert len(stopping) == 2 and {r.reason for r in stopping} == {Reason.SCALED_DOWN}
    report(rig, stopping[0].instance_id, "cancelled", reason=Reason.CANCELLED)
    rec = rig.b.ledger.state().instances[stopping[0].instance_id]
    assert (rec.state, rec.reason) == (S.CANCELLED, Reason.SCALED_DOWN)
    rig.now += rig.b.timing.cancel_grace_s  # the other's node never confirms
    rig.b.promises.watch(rig.now)
    settle(rig)
    rec = rig.b.ledger.state().instances[stopping[1].instance_id]
    assert (rec.state, rec.reason, rec.detail) == \
        (S.CANCELLED, Reason.CANCEL_UNANSWERED, Reason.SCALED_DOWN)
    sweep(rig)
    assert len(live(rig)) == 1 and not any(e.type == "replaced" for e in service_events(rig))
    ends = [e for e in rig.b.events if e.instance_id == stopping[0].instance_id
            and e.type == "cancelled"]  # what `gavel events` says, not the node's "cancelled"
    assert [e.reason for e in ends] == [Reason.SCALED_DOWN]

    got = call(rig, "stop", StopServiceRequest(name="web"), ServiceReply)
    assert isinstance(got, ServiceReply) and got.service.stopped
    (last,) = live(rig)
    assert last.cancelling and last.reason == Reason.SERVICE_STOPPED
    report(rig, last.instance_id, "cancelled", reason=Reason.CANCELLED)
    assert [e.reason for e in rig.b.events if e.instance_id == last.instance_id
            and e.type == "cancelled"] == [Reason.SERVICE_STOPPED]
    sweep(rig)
    assert live(rig) == [] and rig.b.ledger.state().services["web"].stopped
    reply = deployed(rig, web(count=2))  # the same spec starts it again
    assert (reply.version, reply.changed) == (1, True) and len(live(rig)) == 2


def test_a_waiting_replica_is_cancelled_at_once_when_the_service_stops(rig: Rig) -> None:
    deployed(rig, web(count=2))
    call(rig, "stop", StopServiceRequest(name="web"), ServiceReply)
    ends = [rig.b.ledger.state().instances[i] for i in rig.b.ledger.state().replicas["web"]]
    assert [(r.state, r.reason) for r in ends] == [(S.CANCELLED, Reason.SERVICE_STOPPED)] * 2


def test_rollback_and_its_refusals(rig: Rig) -> None:
    deployed(rig, web(count=1))
    got = call(rig, "rollback", RollbackRequest(name="web"), ServiceReply)
    assert isinstance(got, ApiError) and got.error == \
        "web has no version to go back to yet: name one (--to VERSION)"
    deployed(rig, web(count=1, version="2"))
    got = call(rig, "rollback", RollbackRequest(name="web", to_version=7), ServiceReply)
    assert isinstance(got, ApiError) and got.error == "web has no version 7"
    got = call(rig, "rollback", RollbackRequest(name="web", to_version=1), ServiceReply)
    assert isinstance(got, ServiceReply) and got.service.version == 1
    dep = got.service.deployment
    assert dep is not None and (dep.from_version, dep.reason) == (2, Reason.ROLLED_BACK)
    assert [r.version for r in live(rig, 2)] == [2]  # waiting: stopped once v1 stands
    for verb, req in (("scale", ScaleRequest(name="db", count=1)),
                      ("stop", StopServiceRequest(name="db")),
                      ("rollback", RollbackRequest(name="db")),
                      ("service", ServiceRequest(name="db"))):
        got = call(rig, verb, req, ServiceReply)
        assert isinstance(got, ApiError) and got.error == f"{Reason.UNKNOWN_SERVICE}: db"


def test_a_job_is_not_deployed_and_the_services_verb_lists_services(rig: Rig) -> None:
    got = call(rig, "deploy", DeployRequest(spec=Spec(name="batch", command=["true"])),
               DeployReply)
    assert isinstance(got, ApiError) and got.error.startswith(Reason.NOT_A_SERVICE)
    deployed(rig, web(count=1))
    listed = call(rig, "services", ServicesRequest(), ServicesReply)
    assert [s.name for s in listed.services] == ["web"]


def test_a_retried_deploy_with_the_same_key_is_answered_once(rig: Rig) -> None:
    first = call(rig, "deploy", DeployRequest(spec=web(count=1), key="k1"), DeployReply)
    head = rig.b.ledger.head()
    again = call(rig, "deploy", DeployRequest(spec=web(count=1), key="k1"), DeployReply)
    assert first == again and again.changed and rig.b.ledger.head() == head


def test_a_hand_made_service_file_that_does_not_decode_is_left_alone(rig: Rig) -> None:
    state = rig.b.ledger.state()
    garbage = b'{"name": "web", "versions": "nope"}\n'
    other = msgspec.json.encode({"name": "db", "version": 1, "versions": [
        {"version": 1, "spec": {"name": "db", "type": "service", "command": ["x"]}}]})
    Ledger(rig.b.ledger.path).write_files(  # another writer: the broker reads it afresh
        {service_path("web"): garbage, service_path("api"): other}, "by hand", state.head)
    rig.b.ledger.forget_head()  # its last look at the ref may be fresh enough to trust
    state = rig.b.ledger.state()
    assert set(state.unreadable) >= {service_path("web"), service_path("api")}
    assert "it names service 'db'" in state.unreadable[service_path("api")]
    assert state.services == {}
    head = sweep(rig)
    got = call(rig, "deploy", DeployRequest(spec=web(count=1)), DeployReply)
    assert isinstance(got, ApiError) and got.error.startswith(
        f"{Reason.UNREADABLE_FILE}: {service_path('web')}")
    got = call(rig, "scale", ScaleRequest(name="web", count=2), ServiceReply)
    assert isinstance(got, ApiError) and got.error.startswith(Reason.UNREADABLE_FILE)
    assert rig.b.ledger.head() == head
    blob = rig.b.ledger.repo.revparse_single(f"{head}:{service_path('web')}")
    assert blob.data == garbage  # type: ignore[attr-defined]


def test_status_shows_replicas_with_version_and_health_and_metrics_count_them(
        rig: Rig) -> None:
    deployed(rig, web(count=2))
    place_waiting(rig)
    got = call(rig, "service", ServiceRequest(name="web"), ServiceReply)
    assert isinstance(got, ServiceReply)
    st = got.service
    assert [(r.service, r.version, r.state, r.node_id, r.health) for r in st.replicas] == \
        [("web", 1, "running", "n1", "healthy")] * 2
    assert [(v.version, v.replicas, v.healthy) for v in st.versions] == [(1, 2, 2)]
    reg = rig.b.metrics.registry
    assert reg.get_sample_value("gavel_services", {"state": "deploying"}) == 1
    assert reg.get_sample_value("gavel_service_replicas", {"health": "healthy"}) == 2
    call(rig, "stop", StopServiceRequest(name="web"), ServiceReply)
    assert reg.get_sample_value("gavel_services", {"state": "stopped"}) == 1
    assert reg.get_sample_value("gavel_deploys_total", {"outcome": "cancelled"}) == 1


@pytest.mark.parametrize("count", [0, 2])
def test_scaling_to_a_count_the_service_has_changes_nothing(rig: Rig, count: int) -> None:
    deployed(rig, web(count=count))
    head = rig.b.ledger.head()
    got = call(rig, "scale", ScaleRequest(name="web", count=count), ServiceReply)
    assert isinstance(got, ServiceReply) and rig.b.ledger.head() == head


def test_a_new_replica_that_exits_fails_its_deploy_at_once(rig: Rig) -> None:
    deployed(rig, web(count=1))
    place_waiting(rig)
    sweep(rig)
    rig.now += 1
    sweep(rig)
    deployed(rig, web(count=1, version="2"))
    (bad,) = place_waiting(rig)
    report(rig, bad, "exited", exit_code=3)
    sweep(rig)  # well inside healthy_deadline_s: the end itself fails the deploy
    svc = rig.b.ledger.state().services["web"]
    assert svc.version == 1 and svc.deployment is not None
    assert (svc.deployment.reason, svc.deployment.from_version) == (Reason.ROLLED_BACK, 2)
    assert f"({bad})" in svc.deployment.detail


def test_two_passes_in_one_commit_start_a_replacement_once(rig: Rig) -> None:
    from gavel.broker.ledger.committer import Item

    deployed(rig, web(count=2))
    place_waiting(rig)
    sweep(rig)
    rig.now += 1
    sweep(rig)
    report(rig, live(rig)[0].instance_id, "exited", exit_code=1)
    sweep(rig)
    rig.now += 1  # past the back-off
    recs = rig.b.ledger.state().replicas_of("web")
    for _ in range(2):  # queued together: one group commit plans both on one view
        rig.b.committer.submit(Item(plan=functools.partial(
            plan_keep, name="web", inputs=rig.b.services.inputs("web", recs, rig.now))))
    settle(rig)
    assert len(live(rig)) == 2


def test_rollback_goes_back_to_the_version_the_last_deploy_came_from(rig: Rig) -> None:
    for version in ("1", "2"):
        deployed(rig, web(count=1, version=version))
        place_waiting(rig)
        sweep(rig)
        rig.now += 1
        sweep(rig)
        for r in live(rig):
            if r.cancelling:
                report(rig, r.instance_id, "cancelled", reason=Reason.CANCELLED)
    svc = rig.b.ledger.state().services["web"]
    assert (svc.version, svc.healthy_version) == (2, 2)
    got = call(rig, "rollback", RollbackRequest(name="web"), ServiceReply)
    assert isinstance(got, ServiceReply) and got.service.version == 1
    dep = got.service.deployment
    assert dep is not None and (dep.to_version, dep.from_version) == (1, 2)


def test_rollback_after_an_automatic_revert_goes_back_not_forward_to_the_broken_one(
        rig: Rig) -> None:
    """v3 failed and was reverted to v2: `rollback` goes to v1, the version healthy before
    v2 - never to v3, which the revert left because it was broken - and the service ends
    with its count of replicas, never more than count + max_parallel on the way."""
    def step(seconds: float = 0.0) -> None:
        rig.now += seconds
        sweep(rig)
        for r in live(rig):
            if r.cancelling:
                report(rig, r.instance_id, "cancelled", reason=Reason.CANCELLED)
        running = [r for r in live(rig) if not r.cancelling]
        assert len(running) <= 3 + 1, running  # count + max_parallel

    for version in ("1", "2"):
        deployed(rig, web(count=3, version=version))
        for _ in range(8):
            place_waiting(rig)
            step(1)
    deployed(rig, web(count=3, version="3"))
    (bad,) = place_waiting(rig)
    report(rig, bad, "unhealthy", check="exec true: exit 1")
    step(5.1)  # past healthy_deadline_s: v3 fails, the service reverts to v2
    for _ in range(3):
        step(0.1)
    svc = rig.b.ledger.state().services["web"]
    assert svc.deployment is not None and svc.deployment.state == "rolled-back"
    assert (svc.version, svc.healthy_version) == (2, 2)
    got = call(rig, "rollback", RollbackRequest(name="web"), ServiceReply)
    assert isinstance(got, ServiceReply) and got.service.version == 1
    for _ in range(8):
        place_waiting(rig)
        step(1)
    svc = rig.b.ledger.state().services["web"]
    assert svc.deployment is not None and svc.deployment.state == "rolled-back"
    assert [r.version for r in live(rig)] == [1, 1, 1]


def test_status_says_why_the_last_run_ended_while_it_restarts_in_place(rig: Rig) -> None:
    """A replica its node restarted after the kernel killed it for memory shows running with
    that reason and its detail, not an empty reason beside `restarts`; the next restart's
    reason replaces it, and a health change keeps it."""
    deployed(rig, web(count=1))
    (iid,) = place_waiting(rig)

    def shown() -> tuple[str, str, str, int]:
        got = call(rig, "status", StatusRequest(instance_id=iid), StatusReply)
        (st,) = got.instances
        return st.state, st.reason, st.detail, st.restarts

    assert shown() == ("running", "", "", 0)
    report(rig, iid, "restarted", reason=Reason.MEMORY_EXCEEDED, restarts=1,
           detail="killed by the kernel at its 16 MB limit; restart 1 of 2 within 1800s, in 15s")
    assert shown() == ("running", Reason.MEMORY_EXCEEDED, "killed by the kernel at its 16 MB "
                       "limit; restart 1 of 2 within 1800s, in 15s", 1)
    report(rig, iid, "healthy", restarts=1)
    assert shown()[1:] == (Reason.MEMORY_EXCEEDED, "killed by the kernel at its 16 MB limit; "
                           "restart 1 of 2 within 1800s, in 15s", 1)
    report(rig, iid, "restarted", reason=Reason.EXITED_NONZERO, restarts=2,
           detail="exit status 3; restart 2 of 2 within 1800s, in 30s")
    assert shown()[1:3] == (Reason.EXITED_NONZERO, "exit status 3; restart 2 of 2 within "
                            "1800s, in 30s")
