"""System jobs against a real broker, real workers and real processes: one instance on every
node that could run it, placed by an auction among that node alone; a node that joins gets
one; a drained node's instance is stopped and not placed elsewhere; a node without the
labels gets none; a node without room declines, and `why` shows its reason."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
from pathlib import Path

import msgspec

from gavel.broker.keeper import Backoff
from gavel.shared.api import (
    DeployReply,
    DeployRequest,
    DrainReply,
    DrainRequest,
    StatusReply,
    StatusRequest,
    SubmitReply,
    SubmitRequest,
    WhyReply,
    WhyRequest,
)
from gavel.shared.messages import EventType, Spec
from gavel.shared.reasons import Reason
from gavel.shared.spec import Restart, Update
from tests.integration.harness import Cluster, wait_for

AGENT = Spec(name="agent", type="system", labels={"role": "edge"}, cpu=1.0,
             command=[sys.executable, "-c", "import time; time.sleep(600)"])


def live(cluster: Cluster) -> dict[str, list[str]]:
    """The system job's live instances by the node they are bound to."""
    assert cluster.broker is not None
    state = cluster.broker.ledger.state()
    out: dict[str, list[str]] = {}
    for rec in state.replicas_of("agent"):
        if not rec.state.terminal and not rec.cancelling:
            out.setdefault(rec.only_node, []).append(rec.instance_id)
    return out


def running_on(cluster: Cluster) -> dict[str, str]:
    """Node -> the instance of the job its node.json holds, and which runs."""
    assert cluster.broker is not None
    state = cluster.broker.ledger.state()
    return {node: iid for node, ids in live(cluster).items() for iid in ids
            if state.placement_of(iid) == node}


async def test_a_system_job_follows_the_fleet(cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    for node in ("node-a", "node-b"):
        await cluster.start_agent(node, labels={"role": "edge"})
    await cluster.start_agent("node-x", labels={"role": "db"})  # not the job's
    await cluster.wait_nodes(3)
    got = await cluster.call("submit", SubmitRequest(spec=AGENT), SubmitReply)
    assert got.instance_id == "agent"
    await wait_for(lambda: set(running_on(cluster)) == {"node-a", "node-b"}, 30,
                   what="one instance on each edge node")

    await cluster.start_agent("node-c", labels={"role": "edge"})  # joins: gets one
    await wait_for(lambda: set(running_on(cluster)) == {"node-a", "node-b", "node-c"}, 30,
                   what="the joining node's instance")
    await cluster.start_agent("node-tiny", labels={"role": "edge"}, cpu=0.5)  # no room
    await wait_for(lambda: "node-tiny" in live(cluster), 30, what="node-tiny's instance")
    (tiny,) = live(cluster)["node-tiny"]

    async def declined() -> bool:
        why = await cluster.call("why", WhyRequest(instance_id=tiny), WhyReply)
        return why.instance.state == "unschedulable" and any(
            d.node_id == "node-tiny" and d.reason == Reason.NO_ROOM_CPU
            for a in why.auctions for d in a.declines)
    await wait_for(declined, 30, what="node-tiny's decline in why")
    why = await cluster.call("why", WhyRequest(instance_id=tiny), WhyReply)
    asked = {d.node_id for a in why.auctions for d in a.declines} | {
        b.node_id for a in why.auctions for b in a.bids}
    assert asked == {"node-tiny"}  # an auction among that node alone
    shown = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "gavel", "status", "agent", "--nats",
                         cluster.url], capture_output=True, text=True, timeout=60)
    assert shown.stdout.startswith("system job agent: version 1, on 4 nodes"), shown.stdout
    assert "unschedulable" in shown.stdout

    drained = running_on(cluster)["node-b"]
    reply = await cluster.call("drain", DrainRequest(node_id="node-b"), DrainReply)
    assert reply.draining

    async def stopped() -> bool:
        st = await cluster.call("status", StatusRequest(instance_id=drained), StatusReply)
        return st.instances[0].state == "cancelled"
    await wait_for(stopped, 30, what="the drained node's instance to stop")
    st = await cluster.call("status", StatusRequest(instance_id=drained), StatusReply)
    assert st.instances[0].reason == Reason.SYSTEM_NODE_LEFT
    # Not placed elsewhere: each other edge node still holds exactly its own one.
    assert {n: len(ids) for n, ids in live(cluster).items()} == {
        "node-a": 1, "node-c": 1, "node-tiny": 1}
    assert "node-x" not in live(cluster)

    await cluster.stop_agent("node-c")  # lost: offline, its instance is not moved
    await wait_for(lambda: "node-c" not in live(cluster), 60, what="node-c's instance to end")
    assert {n: len(ids) for n, ids in live(cluster).items()} == {"node-a": 1, "node-tiny": 1}
    assert cluster.broker is not None
    starts = sorted(e.node_id for e in cluster.broker.events
                    if e.instance_id == "agent" and e.type == EventType.REPLACED)
    assert starts == ["node-a", "node-b", "node-c", "node-tiny"]  # none made again or moved
    recs = cluster.broker.ledger.state().replicas_of("agent")
    for rec in recs:
        placed = {e.node_id for e in cluster.broker.events
                  if e.instance_id == rec.instance_id and e.type == EventType.PLACED}
        assert placed == ({rec.only_node} if rec.only_node != "node-tiny" else set()), \
            (rec.instance_id, placed)


async def test_a_broker_started_again_makes_no_second_instance_on_a_node(
        cluster: Cluster) -> None:
    await cluster.start_broker()
    for node in ("node-a", "node-b"):
        await cluster.start_agent(node, labels={"role": "edge"})
    await cluster.wait_nodes(2)
    await cluster.call("submit", SubmitRequest(spec=AGENT), SubmitReply)
    await wait_for(lambda: set(running_on(cluster)) == {"node-a", "node-b"}, 30,
                   what="one instance on each edge node")
    before = running_on(cluster)
    await cluster.stop_broker()
    await cluster.start_broker()
    await cluster.wait_nodes(2)
    await cluster.start_agent("node-c", labels={"role": "edge"})  # a pass has surely run
    await wait_for(lambda: set(running_on(cluster)) == {"node-a", "node-b", "node-c"}, 30,
                   what="the joining node's instance after the restart")
    after = running_on(cluster)
    assert {n: after[n] for n in before} == before
    assert {n: len(ids) for n, ids in live(cluster).items()} == {
        "node-a": 1, "node-b": 1, "node-c": 1}


async def test_an_instance_that_keeps_failing_is_replaced_on_its_node_after_a_back_off(
        cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    crash = Spec(name="crash", type="system", attempts=1, restart=Restart(attempts=0),
                 command=["sh", "-c", "exit 1"])
    await cluster.call("submit", SubmitRequest(spec=crash), SubmitReply)
    broker = cluster.broker
    assert broker is not None
    await wait_for(lambda: (b := broker.systems._backoff.get(("crash", "node-a"))) is not None
                   and b.streak >= 3, 60, what="three ends in a row")
    starts = [e.at for e in broker.events
              if e.instance_id == "crash" and e.type == EventType.REPLACED]
    tick = broker.timing.tick_s
    for k in range(1, min(len(starts), 4)):  # the k-th start waited out the k-th back-off
        assert starts[k] - starts[k - 1] >= Backoff.delay(k, tick) * 0.999, (k, starts)


async def test_a_new_version_rolls_one_node_at_a_time(cluster: Cluster) -> None:
    """`update.max_parallel = 1`: each node's old instance stops only once the node before
    it runs the new version, so the job never has two nodes between versions; the deploy
    succeeds with every node on the new version."""
    await cluster.start_broker()
    for node in ("node-a", "node-b", "node-c"):
        await cluster.start_agent(node, labels={"role": "edge"})
    await cluster.wait_nodes(3)
    await cluster.call("submit", SubmitRequest(spec=AGENT), SubmitReply)
    await wait_for(lambda: set(running_on(cluster)) == {"node-a", "node-b", "node-c"}, 30,
                   what="version 1 on every node")
    assert cluster.broker is not None
    broker = cluster.broker
    old = set(running_on(cluster).values())
    v2 = msgspec.structs.replace(AGENT, env={"V": "2"}, update=Update(max_parallel=1))
    await cluster.call("deploy", DeployRequest(spec=v2), DeployReply)

    def done() -> bool:
        svc = broker.ledger.state().services["agent"]
        new = set(running_on(cluster).values())
        return svc.deployment is not None and svc.deployment.state == "succeeded" and \
            len(new) == 3 and not new & old
    await wait_for(done, 90, what="version 2 on every node")
    steps = [(e.type, e.detail) for e in broker.events
             if (e.instance_id == "agent" and e.type == EventType.STOPPING
                 and e.detail in old)
             or (e.type == EventType.RUNNING and e.instance_id not in old
                 and e.instance_id.startswith("agent"))]
    stops = [k for k, (kind, _) in enumerate(steps) if kind == EventType.STOPPING]
    assert len(stops) == 3, steps
    for before, after in itertools.pairwise(stops):  # a new one ran between two stops
        assert any(kind == EventType.RUNNING for kind, _ in steps[before:after]), steps
    for commit in broker.ledger.history(limit=200):
        assert commit.message.count(f": {Reason.SUPERSEDED}") <= 1, commit.message
