"""Priority and preemption by bids (issue 33) against a real nats-server, real git and real
processes: low-priority work fills a node, a high-priority job preempts it through the
node's preempting offer, the evicted job is re-queued with the fixed reason (its event, the
commit, `why`), its process is stopped, and it runs again once room appears."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import msgspec
import pytest

from gavel.shared.api import (
    DeployReply,
    DeployRequest,
    EventsReply,
    EventsRequest,
    WhyReply,
    WhyRequest,
)
from gavel.shared.messages import EventType
from gavel.shared.planning import PlanReply, PlanRequest
from gavel.shared.reasons import Reason, render
from tests.integration.harness import TIMING, Cluster, sleeper_spec, wait_for

pytestmark = pytest.mark.integration


async def _events(cluster: Cluster, iid: str) -> list[tuple[str, str, str]]:
    reply = await cluster.call("events", EventsRequest(instance_id=iid, limit=0), EventsReply)
    return [(e.type, e.reason, e.detail) for e in reply.events]


async def _running(cluster: Cluster, iid: str, node: str) -> bool:
    st = await cluster.status(iid)
    return bool(st.state == "running" and st.node_id == node)


async def test_a_high_priority_job_preempts_and_the_evicted_job_is_requeued(
        cluster: Cluster) -> None:
    await cluster.start_broker()
    node_a = await cluster.start_agent("node-a", cpu=2.0)
    await cluster.wait_nodes(1)
    low = await cluster.submit(sleeper_spec("low", cpu=2.0, priority=10))
    await wait_for(lambda: _running(cluster, low, "node-a"), 15, what="low runs on node-a")

    # `gavel plan` says what the urgent job would preempt, and changes nothing.
    commits = len(list(cluster.ledger().history()))
    plan = await cluster.call("plan", PlanRequest(spec=sleeper_spec("urgent", cpu=2.0,
                                                                    priority=80)), PlanReply)
    [planned] = plan.placements
    assert planned.winner == "node-a" and [v.instance_id for v in planned.displaced] == [low]
    assert len(list(cluster.ledger().history())) == commits
    assert cluster.holders(low) == ["node-a"]
    spec_file = cluster.root / "urgent.json"
    spec_file.write_bytes(msgspec.json.encode(sleeper_spec("urgent", cpu=2.0, priority=80)))
    shown = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "gavel", "plan",
                                                     "--nats", cluster.url, str(spec_file)],
                                    capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert f"would preempt {low} (priority 10)" in shown.stdout

    urgent = await cluster.submit(sleeper_spec("urgent", cpu=2.0, priority=80))
    await wait_for(lambda: _running(cluster, urgent, "node-a"), 15 + TIMING.kill_grace_s,
                   what="urgent runs on node-a")
    assert cluster.holders(low) == []
    await wait_for(lambda: not node_a._supervisor.holds(low), TIMING.kill_grace_s * 2,
                   what="node-a stopped the evicted job")

    detail = f"{urgent} (priority 80)"
    assert (EventType.PREEMPTED, Reason.PREEMPTED, detail) in await _events(cluster, low)
    assert render(Reason.PREEMPTED, detail) == f"preempted by {urgent} (priority 80)"
    messages = [c.message for c in cluster.ledger().history()]
    both = [m for m in messages if f"preempt {low} on node-a for {urgent}" in m]
    assert len(both) == 1 and f"place {urgent} (priority 80) on node-a displacing" in both[0]

    why = await cluster.call("why", WhyRequest(instance_id=urgent), WhyReply)
    won = why.auctions[0]
    assert won.winner == "node-a" and [v.instance_id for v in won.displaced] == [low]
    assert [o.node_id for o in won.offers] == ["node-a"]
    proc = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "gavel", "why",
                                                    urgent, "--nats", cluster.url],
                                   capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "* preempt node-a" in proc.stdout and f"would stop {low} (priority 10)" in proc.stdout
    assert f"displaced {low} (priority 10)" in proc.stdout
    # The evicted job waits (node-a is full of higher-priority work), then runs again.
    st = await cluster.status(low)
    assert st.state in ("queued", "scheduled", "unschedulable")
    await cluster.start_agent("node-b", cpu=2.0)
    await wait_for(lambda: _running(cluster, low, "node-b"), 15 + TIMING.heartbeat_s * 2,
                   what="the evicted job re-placed on node-b")
    assert (await cluster.status(urgent)).node_id == "node-a"
    assert cluster.broker is not None
    assert cluster.broker.metrics.preemptions._value.get() == 1


async def test_equal_priority_never_preempts(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a", cpu=2.0)
    await cluster.wait_nodes(1)
    first = await cluster.submit(sleeper_spec("first", cpu=2.0, priority=55))
    await wait_for(lambda: _running(cluster, first, "node-a"), 15, what="first runs")
    second = await cluster.submit(sleeper_spec("second", cpu=2.0, priority=60))
    await wait_for(lambda: _unschedulable(cluster, second), 15, what="second waits")
    assert (await cluster.status(first)).state == "running"


async def _unschedulable(cluster: Cluster, iid: str) -> bool:
    return bool((await cluster.status(iid)).state == "unschedulable")


async def test_a_services_replica_preempted_is_placed_again_and_the_count_holds(
        cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a", cpu=2.0)
    await cluster.wait_nodes(1)
    web = sleeper_spec("web", cpu=2.0, priority=20, type="service", count=1)
    await cluster.call("deploy", DeployRequest(spec=web), DeployReply)

    def replicas() -> list[tuple[str, str]]:
        st = cluster.ledger().state()
        return sorted((r.instance_id, st.placement_of(r.instance_id) or "")
                      for r in st.replicas_of("web") if not r.state.terminal)
    await wait_for(lambda: [n for _, n in replicas()] == ["node-a"], 15, what="web on node-a")
    [(replica, _)] = replicas()
    urgent = await cluster.submit(sleeper_spec("urgent", cpu=2.0, priority=90))
    await wait_for(lambda: _running(cluster, urgent, "node-a"), 15 + TIMING.kill_grace_s,
                   what="urgent runs on node-a")
    assert (EventType.PREEMPTED, Reason.PREEMPTED, f"{urgent} (priority 90)") in \
        await _events(cluster, replica)
    await cluster.start_agent("node-b", cpu=2.0)
    await wait_for(lambda: _running(cluster, replica, "node-b"), 15 + TIMING.heartbeat_s * 2,
                   what="the replica placed again on node-b")
    assert replicas() == [(replica, "node-b")]  # the same replica: the count holds, no second
