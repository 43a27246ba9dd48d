"""`gavel plan` and soft affinities against a real cluster (nats-server, git, workers): a plan
asks the nodes, writes nothing to git and reserves nothing, and a real submit right after
lands where the plan said; an affinity moves the award and `why` shows by how much; a deploy
with a stale version index is refused with one sentence and writes nothing."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from gavel.client import Client
from gavel.shared.affinity import Affinity
from gavel.shared.api import (
    ScaleRequest,
    ServiceReply,
    SubmitReply,
    SubmitRequest,
    WhyReply,
    WhyRequest,
)
from gavel.shared.messages import Capacity, Spec
from gavel.shared.planning import PlanReply, PlanRequest
from gavel.shared.reasons import Reason
from gavel.transport.client import BrokerRefused
from tests.integration.harness import Cluster, wait_for

pytestmark = pytest.mark.integration

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
GAVEL = [sys.executable, "-m", "gavel"]
ZONES = {"n1": "east", "n2": "west", "n3": "east"}


def commits(cluster: Cluster) -> int:
    out = subprocess.run(["git", "-C", str(cluster.state / "state.git"), "rev-list",
                          "--count", "--all"], capture_output=True, text=True,
                         check=True)
    return int(out.stdout)


async def gavel(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(*GAVEL, *args, stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def start(cluster: Cluster, cpu: dict[str, float] | None = None) -> None:
    await cluster.start_broker()
    for node, zone in ZONES.items():
        await cluster.start_agent(node, labels={"zone": zone}, cpu=(cpu or {}).get(node, 4.0))
    await cluster.wait_nodes(len(ZONES))


def quiet_head(cluster: Cluster) -> str:
    return cluster.ledger().head() or ""


async def test_a_plan_commits_and_reserves_nothing_and_a_submit_lands_where_it_said(
        cluster: Cluster) -> None:
    # n2 has room for the job exactly once: had the plan reserved it anywhere (broker or
    # worker), the real submit after it would find n2 full. The nodes' loads follow the
    # host's sampled stats; weight 100 (a whole node) makes n2 win whatever they are.
    await start(cluster, cpu={"n2": 1.0})
    spec = Spec(name="job", command=SLEEP, cpu=1.0, memory_mb=16, affinities=[
        Affinity(label="zone", value="west", weight=100),
        Affinity(label="rack", value="r1", weight=10)])
    before, head = commits(cluster), quiet_head(cluster)
    plan = await cluster.call("plan", PlanRequest(spec=spec), PlanReply)
    [placed] = plan.placements
    assert placed.winner == "n2" and placed.load is not None
    [won] = [b for b in placed.bids if b.node_id == "n2"]
    assert won.affinity == pytest.approx(-1.0)
    assert {b.node_id for b in placed.bids} == set(ZONES)
    assert any(w.startswith(Reason.AFFINITY_UNMATCHED) and "rack" in w for w in plan.warnings)
    # nothing written, nothing reserved, nothing in flight
    assert commits(cluster) == before and quiet_head(cluster) == head
    broker = cluster.broker
    assert broker is not None
    assert all(c == Capacity() for c in broker.auctioneer.core.reserved.values())
    assert not broker.auctioneer.core.inflight and not broker.auctioneer.auctions
    # the CLI prints the same placement and the adjustment
    code, out, err = await gavel("plan", "--nats", cluster.url, str(_spec_file(cluster, spec)))
    assert code == 0, err
    assert "place   job[1] on n2" in out and "affinity" in out, out
    assert "warning: " + Reason.AFFINITY_UNMATCHED in err
    assert commits(cluster) == before
    # a real submit right after gets the same node, and says what it warned of
    got = await cluster.call("submit", SubmitRequest(spec=spec, instance_id="job-1"),
                             SubmitReply)
    assert any("rack" in w for w in got.warnings)
    await wait_for(lambda: cluster.holders("job-1") == ["n2"], 20, what="job-1 on n2")
    why = await cluster.call("why", WhyRequest(instance_id="job-1"), WhyReply)
    assert why.auctions and why.auctions[0].winner == "n2"
    assert any(b.node_id == "n2" and b.affinity == pytest.approx(-1.0)
               for b in why.auctions[0].bids)


def _spec_file(cluster: Cluster, spec: Spec) -> Path:
    path = cluster.root / f"{spec.name}.json"
    path.write_bytes(msgspec.json.encode(spec))
    return path


async def test_deploy_check_index_refuses_a_stale_plan_and_applies_a_fresh_one(
        cluster: Cluster) -> None:
    await start(cluster)
    v1 = Spec(name="web", type="service", count=2, command=SLEEP, cpu=0.1, memory_mb=16,
              env={"V": "1"})
    async with await Client.connect(cluster.url) as client:  # the typed client's verbs
        fresh = await client.plan(v1)
        assert fresh.index == 0 and fresh.next_version == 1 and len(fresh.placements) == 2
        assert len({p.winner for p in fresh.placements} - {""}) == 2  # on distinct nodes
        await client.deploy(v1, check_index=0)  # 0: only a new service
        with pytest.raises(BrokerRefused, match=Reason.STALE_INDEX):
            await client.deploy(v1, check_index=0)  # no longer new
    await wait_for(lambda: len(cluster.ledger().state().where) == 2, 20, what="2 replicas")
    v2 = Spec(name="web", type="service", count=2, command=SLEEP, cpu=0.2, memory_mb=16,
              env={"V": "2"})
    plan = await cluster.call("plan", PlanRequest(spec=v2), PlanReply)
    assert plan.version == 1 and plan.next_version == 2 and plan.index
    assert {c.field for c in plan.changes} == {"env", "cpu"}
    assert len(plan.stops) == 2 and len(plan.placements) == 2
    # the service changes behind the plan's back: a scale
    await cluster.call("scale", ScaleRequest(name="web", count=3), ServiceReply)
    path = _spec_file(cluster, v2)
    code, out, err = await gavel("deploy", "--nats", cluster.url, str(path),
                                 "--check-index", str(plan.index))
    assert code == 3, (out, err)
    assert Reason.STALE_INDEX in err and len(err.strip().splitlines()) == 1, err
    assert cluster.ledger().state().services["web"].version == 1
    assert [v.version for v in cluster.ledger().state().services["web"].versions] == [1]
    again = await cluster.call("plan", PlanRequest(spec=v2), PlanReply)
    assert again.index != plan.index
    code, out, err = await gavel("deploy", "--nats", cluster.url, str(path),
                                 "--check-index", str(again.index))
    assert code == 0, (out, err)
    assert cluster.ledger().state().services["web"].version == 2


async def test_a_system_job_plan_names_the_nodes_that_would_run_one_and_why_not(
        cluster: Cluster) -> None:
    await start(cluster)
    before = commits(cluster)
    agent = Spec(name="agent", type="system", command=SLEEP, cpu=0.1, memory_mb=16,
                 labels={"zone": "east"})
    plan = await cluster.call("plan", PlanRequest(spec=agent), PlanReply)
    assert plan.type == "system" and plan.next_version == 1 and plan.index == 0
    assert [p.winner for p in plan.placements if p.winner] == ["n1", "n3"]
    [refused] = [p for p in plan.placements if not p.winner]
    assert [(d.node_id, d.reason) for d in refused.declines] == [("n2", Reason.MISSING_LABEL)]
    array = Spec(name="batch", command=SLEEP, cpu=0.1, memory_mb=16, count=5, parallelism=2)
    code, out, err = await gavel("plan", "--json", "--nats", cluster.url,
                                 str(_spec_file(cluster, array)))
    assert code == 0, err
    plan = msgspec.json.decode(out, type=PlanReply)
    assert plan.placements_total == 2 and plan.count == 5
    assert all(p.winner for p in plan.placements)
    assert commits(cluster) == before
