"""A service's replicas spread with real workers: on distinct nodes, evenly over a zone label,
waiting with the spread reason when a hard spread cannot be kept, placed anyway when it is
soft. The replicas are written as a keeper would (instance records naming their service),
by hand, into the state repository the broker runs on."""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

from gavel.broker.ledger.repository import Conflict, Ledger
from gavel.broker.ledger.state import encode
from gavel.shared.messages import InstanceState, Spec
from gavel.shared.reasons import Reason
from gavel.shared.records import InstanceRecord, instance_path
from tests.integration.harness import Cluster, wait_for


def service(name: str, *, spread: str | None = None, soft: bool = False,
            cpu: float = 0.5) -> Spec:
    return Spec(name=name, type="service", command=[sys.executable, "-c",
                                                    "import time; time.sleep(60)"],
                cpu=cpu, memory_mb=32, spread=spread, spread_soft=soft)


def add_replicas(cluster: Cluster, spec: Spec, n: int) -> list[str]:
    """`n` replica records of `spec`'s service, committed beside the running broker."""
    ids = [f"{spec.name}-r{k}" for k in range(n)]
    ledger = Ledger(cluster.state / "state.git")
    files: dict[str, bytes | None] = {
        instance_path(iid): encode(InstanceRecord(instance_id=iid, spec=spec,
                                                  service=spec.name, version=1))
        for iid in ids}
    for _ in range(50):  # the broker may commit in between: plan again on its head
        try:
            ledger.write_files(files, f"add {n} replicas of {spec.name}", ledger.head())
            return ids
        except Conflict:
            ledger.forget_head()
    raise AssertionError("the branch never held still long enough to add the replicas")


def placed(cluster: Cluster, ids: list[str]) -> dict[str, str]:
    st = cluster.ledger().state()
    return {iid: node for iid in ids if (node := st.placement_of(iid)) is not None}


async def start(cluster: Cluster, zones: dict[str, str], cpu: float = 4.0,
                small: dict[str, float] | None = None, **broker: Any) -> None:
    await cluster.start_broker(**broker)
    for node, zone in zones.items():
        await cluster.start_agent(node, labels={"zone": zone},
                                  cpu=(small or {}).get(node, cpu))
    await cluster.wait_nodes(len(zones))


async def test_three_replicas_land_on_three_distinct_nodes(cluster: Cluster) -> None:
    # Equal nodes, equal bids: a job's three instances would all win on the lowest node id.
    await start(cluster, {"n1": "a", "n2": "a", "n3": "a"})
    ids = add_replicas(cluster, service("web"), 3)
    await wait_for(lambda: len(placed(cluster, ids)) == 3, 20, what="3 replicas placed")
    assert sorted(placed(cluster, ids).values()) == ["n1", "n2", "n3"]
    where = placed(cluster, ids)
    await wait_for(lambda: all(
        any(r.instance_id == i and r.state == InstanceState.RUNNING
            for r in cluster.agents[node].instances()) for i, node in where.items()), 20,
        what="each replica running on its node")


async def test_replicas_in_rounds_decided_before_the_last_commit_landed_still_spread(
        cluster: Cluster) -> None:
    # One replica a round, every round out at once and answered from the same node state:
    # each round must count the awards of the rounds before it whose commit is not in yet
    # (a commit gap keeps them out for a while).
    await start(cluster, {"n1": "a", "n2": "a", "n3": "a"}, batch_max=1, max_auctions=8,
                commit_gap_s=0.5)
    ids = add_replicas(cluster, service("web"), 3)
    await wait_for(lambda: len(placed(cluster, ids)) == 3, 20, what="3 replicas placed")
    assert sorted(placed(cluster, ids).values()) == ["n1", "n2", "n3"]


async def test_replicas_spread_evenly_over_a_zone_label(cluster: Cluster) -> None:
    await start(cluster, {"a1": "a", "a2": "a", "b1": "b", "b2": "b"})
    ids = add_replicas(cluster, service("api", spread="zone"), 4)
    await wait_for(lambda: len(placed(cluster, ids)) == 4, 20, what="4 replicas placed")
    where = placed(cluster, ids)
    assert sorted(where.values()) == ["a1", "a2", "b1", "b2"]  # distinct nodes, too
    assert Counter(node[0] for node in where.values()) == {"a": 2, "b": 2}


async def test_a_hard_spread_that_cannot_be_kept_waits_with_the_reason(
        cluster: Cluster) -> None:
    # Zone b's one node is too small for a replica: zone a may hold one more than b, never two.
    await start(cluster, {"a1": "a", "a2": "a", "b1": "b"}, small={"b1": 0.25})
    ids = add_replicas(cluster, service("db", spread="zone"), 2)

    def waiting() -> InstanceRecord | None:
        st = cluster.ledger().state()
        recs = [st.instances[i] for i in ids if st.placement_of(i) is None]
        return recs[0] if len(recs) == 1 and recs[0].state is InstanceState.UNSCHEDULABLE \
            else None

    await wait_for(lambda: waiting() is not None and len(placed(cluster, ids)) == 1, 20,
                   what="one replica placed in zone a, the other waiting")
    assert [node[0] for node in placed(cluster, ids).values()] == ["a"]
    rec = waiting()
    assert rec is not None
    assert rec.reason == Reason.SPREAD
    assert f"{Reason.SPREAD} (zone: a 1, b 0)" in rec.detail
    assert "1 no room for 0.5 cpu" in rec.detail
    st = await cluster.status(rec.instance_id)
    assert st.state == InstanceState.UNSCHEDULABLE and st.reason == Reason.SPREAD


async def test_a_soft_spread_places_on_the_best_available(cluster: Cluster) -> None:
    await start(cluster, {"a1": "a", "a2": "a", "b1": "b"}, small={"b1": 0.25})
    ids = add_replicas(cluster, service("cache", spread="zone", soft=True), 2)
    await wait_for(lambda: len(placed(cluster, ids)) == 2, 20, what="both replicas placed")
    assert sorted(placed(cluster, ids).values()) == ["a1", "a2"]
