"""Workers converge onto their node.json (mirrored to JetStream KV): draining, migration, a
missed award, and a node that comes back after the broker moved its instances away.

Real nats-server, real git, real processes; the agents run in this process.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import nats
import nats.js.errors
import psutil
import pytest
from nats.aio.msg import Msg

from gavel.shared import subjects
from gavel.shared.api import DrainReply, DrainRequest, WhyReply, WhyRequest
from gavel.shared.messages import Award
from gavel.shared.reasons import Reason
from gavel.shared.records import NodeFile, parse_trailers
from gavel.shared.strategies import make_strategy
from gavel.transport.natsserver import NatsServer
from gavel.worker.agent import Agent
from tests.integration.harness import TIMING, Cluster, FakeNode, sleeper_spec, wait_for

pytestmark = pytest.mark.integration


def gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def running_on(agent: Agent, iid: str) -> int:
    """The pid the agent runs `iid` under, or 0."""
    return next((r.pid for r in agent.instances()
                 if r.instance_id == iid and r.state == "running"), 0)


class DeafAgent(Agent):
    """Drops every award message: it can only learn of its instances from node.json."""

    dropped = 0

    async def _on_award(self, msg: Msg) -> None:
        self.dropped += 1


A = TypeVar("A", bound=Agent)


def start_as(cluster: Cluster, agent: A) -> A:
    cluster.agents[agent.node_id] = agent
    cluster.agent_tasks[agent.node_id] = asyncio.create_task(agent.run())
    return agent


def agent_options(cluster: Cluster, node_id: str, **kw: Any) -> dict[str, Any]:
    options: dict[str, Any] = {
        "nats_url": cluster.url, "node_id": node_id,
        "strategy": make_strategy("least-loaded"), "labels": {},
        "state_dir": cluster.root / "workers" / node_id, "timing": TIMING,
        "cpu": 4.0, "memory_mb": 4096}
    options.update(kw)
    return options


async def test_drain_declines_then_undo_takes_work_again(cluster: Cluster) -> None:
    await cluster.start_broker()
    a = await cluster.start_agent("node-a")
    await cluster.start_agent("node-b", cpu=1.0)
    await cluster.wait_nodes(2)

    reply = await cluster.call("drain", DrainRequest(node_id="node-a"), DrainReply)
    assert reply.draining
    await wait_for(lambda: a.draining, 15, what="node-a drains from node.json")
    first = await cluster.submit(sleeper_spec("first", cpu=0.6))
    await wait_for(lambda: cluster.holders(first) == ["node-b"], 10, what="placed on node-b")
    why = await cluster.call("why", WhyRequest(instance_id=first), WhyReply)
    declines = {d.node_id: d.reason for d in why.auctions[0].declines}
    assert declines == {"node-a": Reason.DRAINING}

    await cluster.call("drain", DrainRequest(node_id="node-a", undo=True), DrainReply)
    await wait_for(lambda: not a.draining, 15, what="node-a back in service")
    second = await cluster.submit(sleeper_spec("second", cpu=0.6))  # node-b is full now
    await wait_for(lambda: cluster.holders(second) == ["node-a"], 10, what="placed on node-a")
    await wait_for(lambda: running_on(a, second) > 0, 10, what="running on node-a")


async def test_a_draining_node_that_still_bids_wins_nothing(cluster: Cluster) -> None:
    """Draining is decided in git, not by the node: a bid from one that has not heard of its
    drain (or ignores it) counts as its decline, however low its load."""
    await cluster.start_broker()
    nodes = [FakeNode(cluster.url, "node-a", load=0.0), FakeNode(cluster.url, "node-b", load=0.5)]
    for n in nodes:
        n.confirm = True  # it runs what it wins
        await n.start()
    try:
        await cluster.wait_nodes(2)
        first = await cluster.submit(sleeper_spec("first"))
        await wait_for(lambda: cluster.holders(first) == ["node-a"], 10, what="lowest wins")
        await cluster.call("drain", DrainRequest(node_id="node-a"), DrainReply)
        second = await cluster.submit(sleeper_spec("second"))
        await wait_for(lambda: cluster.holders(second) == ["node-b"], 10, what="on node-b")
        assert cluster.holders(first) == ["node-a"]  # a drain without migrate moves nothing
        assert [a.instance_id for a in nodes[0].awards] == [first]
        why = await cluster.call("why", WhyRequest(instance_id=second), WhyReply)
        declines = {d.node_id: d.reason for d in why.auctions[0].declines}
        assert declines == {"node-a": Reason.DRAINING}
    finally:
        for n in nodes:
            await n.close()


async def test_drain_with_migrate_moves_instances_one_by_one(cluster: Cluster) -> None:
    await cluster.start_broker()
    a = await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    ids = [await cluster.submit(sleeper_spec(f"m{i}")) for i in range(3)]
    await wait_for(lambda: all(running_on(a, i) for i in ids), 10, what="all run on node-a")
    pids = {i: running_on(a, i) for i in ids}
    b = await cluster.start_agent("node-b")
    c = await cluster.start_agent("node-c")
    await cluster.wait_nodes(3)

    reply = await cluster.call("drain", DrainRequest(node_id="node-a", migrate=True),
                               DrainReply)
    assert (reply.draining, reply.migrating) == (True, 3)

    def moved() -> bool:
        return all(running_on(b, i) or running_on(c, i) for i in ids)
    await wait_for(moved, 20, what="all three run elsewhere")
    await wait_for(lambda: all(gone(p) for p in pids.values()), 10, what="old copies gone")
    assert a.instances() == [] and a.draining
    assert all(cluster.holders(i) in (["node-b"], ["node-c"]) for i in ids)

    # One by one: each instance leaves node-a only after the one before it was placed.
    order: list[tuple[str, str]] = []  # ("requeue" | "place", instance), oldest first
    for commit in reversed(list(cluster.ledger().history())):
        for line in commit.message.split("\n"):
            for i in ids:
                if line.startswith(f"requeue {i} off node-a: {Reason.MIGRATED}"):
                    order.append(("requeue", i))
        order += [("place", r.instance_id) for r in parse_trailers(commit.message)
                  if r.instance_id in ids and r.winner in ("node-b", "node-c")]
    requeues = [i for kind, i in order if kind == "requeue"]
    assert sorted(requeues) == sorted(ids)
    for before, after in itertools.pairwise(requeues):
        assert order.index(("place", before)) < order.index(("requeue", after)), order


async def test_a_worker_that_missed_the_award_converges_from_kv(cluster: Cluster) -> None:
    await cluster.start_broker()
    deaf = start_as(cluster, DeafAgent(**agent_options(cluster, "node-a")))
    await cluster.wait_nodes(1)
    iid = await cluster.submit(sleeper_spec("missed"))
    await wait_for(lambda: running_on(deaf, iid) > 0, 10, what="runs from node.json")
    assert deaf.dropped >= 1
    assert cluster.holders(iid) == ["node-a"]
    await asyncio.sleep(TIMING.provisioning_s * 2)  # the award is not revoked ...
    assert cluster.holders(iid) == ["node-a"]
    assert len(deaf.instances()) == 1  # ... and it runs once
    status = await cluster.status(iid)
    assert (status.state, status.attempt) == ("running", 1)
    # The mirror is git's node.json as compact JSON: the same record, fewer bytes.
    kv = await (await cluster.client()).jetstream().key_value(subjects.NODES_BUCKET)
    mirrored = (await kv.get("node-a")).value
    assert b"\n" not in mirrored
    in_git = cluster.ledger().state().nodes["node-a"]
    assert msgspec.json.decode(mirrored, type=NodeFile) == in_git


async def test_commits_within_the_mirror_window_are_put_once_the_newest(
        cluster: Cluster) -> None:
    """broker.mirror: the first award after a quiet window is mirrored at once; what the next
    ones change waits for the window's end and goes out as one put of the newest node.json."""
    broker = await cluster.start_broker(timing=msgspec.structs.replace(TIMING, mirror_s=8.0))
    a = await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    kv = await (await cluster.client()).jetstream().key_value(subjects.NODES_BUCKET)

    async def mirrored() -> set[str]:
        try:
            return set(msgspec.json.decode((await kv.get("node-a")).value,
                                           type=NodeFile).instances)
        except nats.js.errors.KeyNotFoundError:
            return set()

    ids = []
    for n in range(4):  # four awards, four commits touching node-a
        ids.append(await cluster.submit(sleeper_spec(f"burst-{n}")))
        await wait_for(lambda: cluster.holders(ids[-1]) == ["node-a"], 10, what="placed")
    await wait_for(lambda: all(running_on(a, i) for i in ids), 10, what="all running")
    await asyncio.sleep(0.5)
    assert await mirrored() == {ids[0]}, "the later awards wait for the window's end"
    assert broker.mirror.coalesced >= 2
    in_git = set(cluster.ledger().state().nodes["node-a"].instances)
    assert in_git == set(ids)
    deadline = time.monotonic() + 15
    while await mirrored() != in_git:
        assert time.monotonic() < deadline, "the window ended without the newest put"
        await asyncio.sleep(0.1)


async def _is(got: Awaitable[set[str]], want: set[str]) -> bool:
    return await got == want


async def test_a_broker_that_stops_puts_what_its_mirror_window_held(cluster: Cluster) -> None:
    broker = await cluster.start_broker(timing=msgspec.structs.replace(TIMING, mirror_s=60.0))
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    ids = []
    for n in range(2):
        ids.append(await cluster.submit(sleeper_spec(f"held-{n}")))
        await wait_for(lambda: cluster.holders(ids[-1]) == ["node-a"], 10, what="placed")
    # Git holds it as soon as the writer is done; the broker hands the change to its mirror
    # a moment later (a loaded machine's moment may outlast a stop that follows at once).
    await wait_for(broker.committer.idle.is_set, 10, what="the broker done with the commit")
    await cluster.stop_broker()  # a minute before the window ends
    kv = await (await cluster.client()).jetstream().key_value(subjects.NODES_BUCKET)

    async def mirrored() -> set[str]:
        return set(msgspec.json.decode((await kv.get("node-a")).value, type=NodeFile
                                       ).instances)
    # The broker's last put is a publish the server stores when it gets to it (a loaded
    # machine may read the key first): wait for it, as a worker's watch would.
    await wait_for(lambda: _is(mirrored(), set(ids)), 10,
                   what=f"the node's key to hold {sorted(ids)}")


async def test_a_stale_node_json_never_stops_a_fresh_award(cluster: Cluster) -> None:
    """The KV copy of node.json can lag the award; a revision without the instance makes the
    node ask the broker, which still places it here: the instance keeps running."""
    await cluster.start_broker()
    a = await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    iid = await cluster.submit(sleeper_spec("fresh"))
    await wait_for(lambda: running_on(a, iid) > 0, 10, what="running")
    pid = running_on(a, iid)
    kv = await (await cluster.client()).jetstream().key_value(subjects.NODES_BUCKET)
    await kv.put("node-a", msgspec.json.encode(NodeFile(node_id="node-a")))  # as if older
    await wait_for(lambda: a.converger.outcomes["kept"] == 1, 15, what="the broker asked")
    await asyncio.sleep(TIMING.heartbeat_s * 2)
    assert running_on(a, iid) == pid and not gone(pid)
    assert a.converger.asked["verify"] == 1, "settled for that revision: asked once"
    assert a.converger.outcomes["fenced"] == 0


async def test_node_back_after_offline_stops_the_moved_instance(cluster: Cluster) -> None:
    # The broker's offline clock shorter than the suite's: what is waited for is only that
    # node-a went offline, however long that takes.
    broker = await cluster.start_broker(timing=msgspec.structs.replace(
        TIMING, offline_s=max(TIMING.unreachable_s, TIMING.offline_s / 2)))
    a = await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    iid = await cluster.submit(sleeper_spec("moved"))
    await wait_for(lambda: running_on(a, iid) > 0, 10, what="runs on node-a")
    old_pid = running_on(a, iid)
    b = await cluster.start_agent("node-b")
    await cluster.wait_nodes(2)

    await cluster.stop_agent("node-a", kill_children=False)  # silent, its process lives on
    await wait_for(lambda: broker.liveness.health("node-a", broker.now()) == "offline",
                   TIMING.offline_s * 2, what="node-a offline")
    await wait_for(lambda: running_on(b, iid) > 0, 10, what="re-placed and running on node-b")
    assert not gone(old_pid), "the old copy should still run: nobody told it to stop"

    def from_a() -> int:
        return sum(1 for e in broker.events if e.instance_id == iid and e.node_id == "node-a")
    before = from_a()
    back = await cluster.start_agent("node-a")  # same state dir: adopts, then sees node.json
    await wait_for(lambda: gone(old_pid), 10, what="the moved copy fenced")
    await wait_for(lambda: back.instances() == [], 15, what="node-a holds nothing")
    assert running_on(b, iid) > 0 and cluster.holders(iid) == ["node-b"]
    status = await cluster.status(iid)
    assert (status.state, status.node_id, status.attempt) == ("running", "node-b", 2)
    await asyncio.sleep(TIMING.heartbeat_s)
    assert from_a() == before, "a fenced instance must not be reported"


async def test_a_worker_cut_off_from_nats_past_offline_fences_itself(
        nats_server: NatsServer, tmp_path: Path) -> None:
    timing = msgspec.structs.replace(TIMING, offline_s=2.0)
    agent = Agent(**{**agent_options(Cluster(nats_server.url, tmp_path), "n1"),
                     "timing": timing})
    task = asyncio.create_task(agent.run())
    try:
        await asyncio.wait_for(agent.ready.wait(), 15)
        nc = await nats.connect(nats_server.url)
        award = Award(auction_id="x", instance_id="cut", node_id="n1",
                      spec=sleeper_spec("cut"))
        await nc.publish(subjects.AWARD.format(node="n1"), msgspec.msgpack.encode(award))
        await nc.close()
        await wait_for(lambda: running_on(agent, "cut") > 0, 15, what="running")
        pid = running_on(agent, "cut")

        await asyncio.to_thread(nats_server.stop)
        cut = time.monotonic()
        await wait_for(lambda: gone(pid), timing.offline_s + 5, what="self-fenced")
        assert time.monotonic() - cut >= timing.offline_s - timing.heartbeat_s
        await wait_for(lambda: agent.instances() == [], 15, what="nothing held")
        assert agent.converger.self_fenced

        await asyncio.to_thread(nats_server.start)
        await wait_for(lambda: not agent.converger.self_fenced, 10, what="contact again")
    finally:
        await agent.stop()
        await asyncio.wait_for(task, 10)
