"""The keeper's decisions, in memory (`broker.keeper`): a service kept at its count, surplus
stopped in order, a rolling deploy that never drops below `count - max_parallel` healthy,
a deploy that fails and reverts, the back-off of ends in a row, and - through deploys,
reverts and rollbacks in any order - never more than `count + max_parallel` replicas."""

from __future__ import annotations

from dataclasses import dataclass, replace

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from gavel.broker.deploys import _back as rollback_target  # `gavel rollback NAME` goes there
from gavel.broker.keeper import BACKOFF_MAX_TICKS, Backoff, Replica, decide, stop_order
from gavel.shared.reasons import Reason
from gavel.shared.records import Deployment, ServiceRecord, ServiceVersion
from gavel.shared.spec import Spec, Update

STAMP = "2026-12-01T10:00:00.000Z"


def spec(**update: object) -> Spec:
    return Spec(name="web", type="service", command=["serve"], count=4,
                update=Update(**update))  # type: ignore[arg-type]


def service(version: int = 1, count: int = 4, healthy: int = 0,
            deployment: Deployment | None = None, stopped: bool = False,
            **update: object) -> ServiceRecord:
    versions = [ServiceVersion(version=v, spec=spec(**update)) for v in range(1, version + 1)]
    return ServiceRecord(name="web", versions=versions, version=version, count=count,
                         healthy_version=healthy, deployment=deployment, stopped=stopped)


def deploying(to: int, frm: int, reason: str = "") -> Deployment:
    return Deployment(to_version=to, from_version=frm, started_at=STAMP, reason=reason)


def up(iid: str, version: int, healthy_for: float = 60.0, age: float = 60.0) -> Replica:
    return Replica(instance_id=iid, version=version, healthy_for=healthy_for, age=age)


def test_missing_replicas_start_at_once_when_no_old_one_needs_protecting() -> None:
    d = decide(service(count=3), [])
    assert (d.start, d.missing, d.stop) == (3, 3, [])
    d = decide(service(count=3), [up("a", 1)])
    assert (d.start, d.missing) == (2, 2)


def test_the_back_off_holds_a_replacement_but_still_counts_it_missing() -> None:
    d = decide(service(count=2, healthy=1), [up("a", 1)], hold=True)
    assert (d.start, d.missing) == (0, 1) and not d


def test_a_whole_settled_service_needs_nothing() -> None:
    d = decide(service(count=2, healthy=1), [up("a", 1), up("b", 1)])
    assert not d and d.record is None


def test_a_stopped_service_stops_every_replica() -> None:
    d = decide(service(stopped=True), [up("a", 1), up("b", 1)])
    assert d.stop == [("a", Reason.SERVICE_STOPPED), ("b", Reason.SERVICE_STOPPED)]
    assert d.start == 0


def test_surplus_stops_waiting_then_unhealthy_then_least_settled() -> None:
    replicas = [up("a", 1, healthy_for=100), up("b", 1, healthy_for=5),
                Replica(instance_id="c", version=1, healthy_for=None),
                Replica(instance_id="d", version=1, waiting=True), up("e", 1, healthy_for=50)]
    assert [r.instance_id for r in stop_order(replicas)] == ["d", "c", "b", "e", "a"]
    d = decide(service(count=2, healthy=1), replicas)
    assert d.stop == [(i, Reason.SCALED_DOWN) for i in ("d", "c", "b")]


def test_a_rolling_deploy_places_first_and_stops_an_old_one_only_for_a_settled_new_one(
        ) -> None:
    svc = service(version=2, healthy=1, deployment=deploying(2, 1), min_healthy_s=10.0)
    old = [up(f"o{k}", 1) for k in range(4)]
    d = decide(svc, old)
    assert (d.start, d.stop) == (1, [])  # max_parallel 1: one new, nothing stopped yet
    d = decide(svc, [*old, up("n0", 2, healthy_for=None, age=1)])
    assert (d.start, d.stop) == (0, [])  # the new one is not healthy: wait
    d = decide(svc, [*old, up("n0", 2, healthy_for=3, age=5)])
    assert (d.start, d.stop) == (0, [])  # healthy, not yet for min_healthy_s
    sick = Replica(instance_id="o3", version=1, healthy_for=None)
    d = decide(svc, [*old[:3], sick, up("n0", 2, healthy_for=10)])
    assert d.stop == [("o3", Reason.SUPERSEDED)]  # the unhealthy old one goes first
    assert d.start == 1  # and the next new one starts


def test_a_scale_down_during_a_deploy_stops_surplus_old_replicas_as_scaled_down() -> None:
    svc = service(version=2, count=2, healthy=1, deployment=deploying(2, 1))
    d = decide(svc, [*[up(f"o{k}", 1) for k in range(3)], up("n0", 2)])
    assert sorted(d.stop) == [("o0", Reason.SCALED_DOWN), ("o1", Reason.SUPERSEDED)]


def test_success_makes_the_version_healthy_and_ends_the_deployment() -> None:
    svc = service(version=2, count=2, healthy=1, deployment=deploying(2, 1))
    d = decide(svc, [up("n0", 2), up("n1", 2)], stamp=STAMP)
    assert d.record is not None and d.ended is not None
    assert (d.record.healthy_version, d.ended.state, d.ended.ended_at) == (2, "succeeded", STAMP)
    assert d.record.deployment == d.ended
    rolled = service(version=1, count=1, healthy=1,
                     deployment=deploying(1, 2, reason=Reason.ROLLED_BACK))
    d = decide(rolled, [up("o0", 1)])
    assert d.ended is not None and d.ended.state == "rolled-back"


def test_a_replica_not_healthy_by_the_deadline_fails_the_deploy_and_reverts() -> None:
    svc = service(version=2, healthy=1, deployment=deploying(2, 1), healthy_deadline_s=30.0)
    old = [up(f"o{k}", 1) for k in range(4)]
    assert not decide(svc, [*old, up("n0", 2, healthy_for=None, age=29)]).record
    d = decide(svc, [*old, up("n0", 2, healthy_for=None, age=30)], stamp=STAMP)
    assert d.ended is not None and (d.ended.state, d.ended.reason, d.ended.detail) == \
        ("failed", Reason.DEPLOY_UNHEALTHY, "n0")
    assert d.record is not None and d.record.version == 1  # back to the healthy version
    dep = d.record.deployment
    assert dep is not None and (dep.to_version, dep.from_version, dep.state, dep.reason) == \
        (1, 2, "running", Reason.ROLLED_BACK)
    assert (d.start, d.stop) == (0, [])  # the rollback's own steps come next pass
    after = decide(d.record, [*old, up("n0", 2, healthy_for=None, age=31)])
    assert after.stop == [("n0", Reason.SUPERSEDED)]  # v1 is whole: v2's replica goes


def test_a_failed_new_replica_fails_the_deploy_and_without_auto_revert_it_stays() -> None:
    svc = service(version=2, healthy=1, deployment=deploying(2, 1), auto_revert=False)
    d = decide(svc, [up(f"o{k}", 1) for k in range(4)], failed=["n0"], stamp=STAMP)
    assert d.record is not None and d.record.version == 2
    assert d.record.deployment is not None and d.record.deployment.state == "failed"
    later = decide(d.record, [up(f"o{k}", 1) for k in range(4)])
    assert (later.start, later.stop, later.record) == (1, [], None)  # no more verdicts


def test_a_rollback_that_fails_does_not_revert_again_nor_does_a_first_deploy() -> None:
    rolled = service(version=1, healthy=2, deployment=deploying(1, 2, Reason.ROLLED_BACK))
    d = decide(rolled, [], failed=["x"])
    assert d.record is not None and d.record.version == 1
    assert d.record.deployment is not None and d.record.deployment.state == "failed"
    first = service(version=1, deployment=deploying(1, 0))
    d = decide(first, [], failed=["x"])
    assert d.record is not None and d.record.deployment is not None
    assert (d.record.version, d.record.deployment.state) == (1, "failed")


def test_back_off_doubles_per_end_in_a_row_up_to_a_cap_and_resets_when_calm() -> None:
    tick = 0.5
    assert [Backoff.delay(k, tick) for k in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert Backoff.delay(40, tick) == BACKOFF_MAX_TICKS * tick
    b = Backoff()
    assert not b.holds(0.0)
    b.ended(10.0, tick)
    assert b.holds(10.4) and not b.holds(10.5)
    b.ended(11.0, tick)
    assert b.streak == 2 and b.holds(11.9) and not b.holds(12.0)
    b.observe(12.0, True, calm_s=5.0)
    b.observe(16.9, True, calm_s=5.0)
    assert b.streak == 2
    b.observe(17.0, True, calm_s=5.0)
    assert b.streak == 0
    b.observe(18.0, False, calm_s=5.0)
    assert b.calm_since is None


@dataclass
class Sim:
    """A rolling deploy played out by the keeper, each new replica healthy some time after
    it starts: the healthy count at every step, and whether it finished."""

    svc: ServiceRecord
    replicas: list[Replica]
    became: dict[str, float]
    now: float = 0.0


@given(count=st.integers(1, 8), parallel=st.integers(1, 4),
       delays=st.lists(st.integers(0, 5), min_size=40, max_size=40))
def test_a_rolling_deploy_never_holds_fewer_than_count_minus_max_parallel_healthy(
        count: int, parallel: int, delays: list[int]) -> None:
    svc = service(version=2, count=count, healthy=1, deployment=deploying(2, 1),
                  max_parallel=parallel, min_healthy_s=2.0, healthy_deadline_s=1e9)
    sim = Sim(svc=svc, replicas=[up(f"o{k}", 1) for k in range(count)], became={})
    started = 0
    for step in range(200):
        d = decide(sim.svc, sim.replicas, stamp=STAMP)
        if d.record is not None:
            sim.svc = d.record
        gone = {i for i, _ in d.stop}
        sim.replicas = [r for r in sim.replicas if r.instance_id not in gone]
        for _ in range(d.start):
            iid = f"n{started}"
            sim.became[iid] = sim.now + delays[started % len(delays)]
            started += 1
            sim.replicas.append(Replica(instance_id=iid, version=2, age=0.0))
        healthy = sum(r.healthy_for is not None for r in sim.replicas)
        assert healthy >= count - parallel, (step, sim.replicas)  # what a deploy promises
        assert healthy >= count, (step, sim.replicas)  # and what rule 2 gives: no dip at all
        assert len(sim.replicas) <= count + parallel
        dep = sim.svc.deployment
        if dep is not None and dep.state == "succeeded":
            break
        sim.now += 1.0
        sim.replicas = [r if r.version == 1 else replace(
            r, age=r.age + 1.0, healthy_for=None if sim.now < sim.became[r.instance_id]
            else sim.now - sim.became[r.instance_id]) for r in sim.replicas]
    dep = sim.svc.deployment
    assert dep is not None and dep.state == "succeeded"
    assert started == count and sorted(r.version for r in sim.replicas) == [2] * count
    assert sim.svc.healthy_version == 2


def test_a_rollback_never_reverts_in_turn() -> None:
    """Rule 4: a rollback's deployment that fails stays failed on the version it went to; a
    deploy's, in the same place, reverts (so this test sees the rule, not a missing version:
    both records hold versions 1 and 2, and 2 was healthy)."""
    def on_one(reason: str) -> ServiceRecord:
        return msgspec.structs.replace(service(version=2, healthy=2), version=1,
                                       deployment=deploying(1, 2, reason))
    d = decide(on_one(Reason.ROLLED_BACK), [], failed=["x"], stamp=STAMP)
    assert d.record is not None and d.record.deployment is not None
    assert (d.record.version, d.record.deployment.state) == (1, "failed")
    d = decide(on_one(""), [], failed=["x"], stamp=STAMP)
    assert d.record is not None and d.record.deployment is not None
    assert (d.record.version, d.record.deployment.reason) == (2, Reason.ROLLED_BACK)


def test_the_healthy_version_keeps_when_it_became_healthy() -> None:
    svc = service(version=2, count=1, healthy=1, deployment=deploying(2, 1))
    d = decide(svc, [up("n0", 2)], stamp=STAMP)
    assert d.record is not None
    assert [(v.version, v.healthy_at) for v in d.record.versions] == [(1, ""), (2, STAMP)]


def _stamp(step: int) -> str:
    return f"2026-12-01T{10 + step // 3600:02d}:{step // 60 % 60:02d}:{step % 60:02d}.000Z"


@given(count=st.integers(1, 5), parallel=st.integers(1, 3),
       acts=st.lists(st.sampled_from(["wait", "deploy", "deploy-broken", "rollback"]),
                     min_size=60, max_size=60),
       delays=st.lists(st.integers(0, 4), min_size=20, max_size=20))
def test_deploys_reverts_and_rollbacks_never_exceed_count_plus_max_parallel(
        count: int, parallel: int, acts: list[str], delays: list[int]) -> None:
    """Issue 30 item 3: whatever the operator deploys and rolls back, and whichever versions
    never become healthy (a failed deploy reverts on its own), the keeper never holds more
    than `count + max_parallel` replicas, and a rollback never goes to a version that was
    never healthy (the broken one an automatic revert left)."""
    update = {"max_parallel": parallel, "min_healthy_s": 1.0, "healthy_deadline_s": 6.0}
    svc = service(version=1, count=count, healthy=1, **update)
    svc = msgspec.structs.replace(svc, versions=[
        msgspec.structs.replace(v, healthy_at=_stamp(0)) for v in svc.versions])
    broken: set[int] = set()
    replicas = [up(f"o{k}", 1) for k in range(count)]
    became: dict[str, float] = {}  # replica -> when it is healthy (absent: never)
    started = 0
    for step, act in enumerate(acts * 4):  # then quiet steps, so the last change settles
        now = float(step)
        act = act if step < len(acts) else "wait"
        if act.startswith("deploy"):
            v = max(x.version for x in svc.versions) + 1
            broken |= {v} if act == "deploy-broken" else set()
            svc = msgspec.structs.replace(
                svc, versions=[*svc.versions, ServiceVersion(version=v, spec=spec(**update))],
                version=v, deployment=deploying(v, svc.version))
        elif act == "rollback" and (to := rollback_target(svc)) and to != svc.version:
            assert to == svc.healthy_version or any(
                x.version == to and x.healthy_at for x in svc.versions), (to, svc)
            svc = msgspec.structs.replace(svc, version=to, deployment=deploying(
                to, svc.version, Reason.ROLLED_BACK))
        d = decide(svc, replicas, stamp=_stamp(step))
        if d.record is not None:
            svc = d.record
        gone = {i for i, _ in d.stop}
        replicas = [r for r in replicas if r.instance_id not in gone]
        for _ in range(d.start):
            iid = f"n{started}"
            if svc.version not in broken:
                became[iid] = now + delays[started % len(delays)]
            started += 1
            replicas.append(Replica(instance_id=iid, version=svc.version))
        assert len(replicas) <= count + parallel, (step, act, replicas)
        replicas = [_aged(r, became, now + 1) for r in replicas]
    assert svc.version not in broken  # every broken version was reverted or rolled back


def _aged(r: Replica, became: dict[str, float], now: float) -> Replica:
    """A replica one step on: healthy from when it became so; the first ones stay healthy."""
    if r.instance_id.startswith("o"):
        return r
    at = became.get(r.instance_id)
    return replace(r, age=r.age + 1.0, healthy_for=None if at is None or now < at else now - at)
