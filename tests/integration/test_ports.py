"""Ports on a node never overlap, and a port taken outside gavel is replaced and blocked -
until it binds again, when the node reports it free and the broker unblocks it.

Real nats-server, real git, real processes: what a process "really got" is read from its
own environment in /proc, what the node says from its heartbeats, what the broker recorded
from node.json.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec
import nats
import pytest

from gavel.shared import subjects
from gavel.shared.api import SubmitReply, SubmitRequest
from gavel.shared.messages import Award, Event, Heartbeat, Spec
from gavel.shared.reasons import Reason
from gavel.shared.records import NodeFile
from gavel.shared.strategies import make_strategy
from gavel.shared.timing import Timing
from gavel.worker.agent import Agent
from tests.integration.harness import TIMING, Cluster, free_range, sleeper_spec, wait_for

pytestmark = pytest.mark.integration

PORTS = ["http", "admin", "metrics"]


def proc_ports(pid: int) -> dict[str, int]:
    """The GAVEL_PORT_* variables the process really has."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    return {k.decode()[len("GAVEL_PORT_"):].lower(): int(v) for k, v in env.items()
            if k.startswith(b"GAVEL_PORT_")}


@contextmanager
def listening(port: int) -> Iterator[socket.socket]:
    """Something outside gavel listening on `port`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        yield s


@pytest.mark.parametrize("count", [pytest.param(100, id="100"),
                                   pytest.param(200, id="200", marks=pytest.mark.slow)])
async def test_hundreds_of_instances_never_share_a_port(cluster: Cluster, count: int) -> None:
    """`count` instances of three ports each on three nodes whose ranges hold 6 of every 5
    ports asked for: ranges nearly full, so a node given the whole of its range hands the
    last instance back."""
    # The production provisioning deadline: hundreds of processes starting at once on a
    # loaded machine may take longer than the fast one to say provisioning, and a node that
    # did not accept in time is not what this test is about.
    await cluster.start_broker(timing=msgspec.structs.replace(
        TIMING, provisioning_s=Timing().provisioning_s))
    size = count * len(PORTS) * 6 // 5 // 3  # 240 ports a node for 200 instances
    ranges = {f"node-{n}": free_range(start, size)
              for n, start in (("a", 22000), ("b", 23000), ("c", 24000))}
    agents = {node: await cluster.start_agent(node, port_range=r) for node, r in ranges.items()}
    await cluster.wait_nodes(3)
    heartbeats: dict[str, Heartbeat] = {}
    nc = await cluster.client()

    async def on_hb(msg: Any) -> None:
        hb = msgspec.msgpack.decode(msg.data, type=Heartbeat)
        heartbeats[hb.node_id] = hb
    await nc.subscribe(subjects.HEARTBEAT_ALL, cb=on_hb)

    def all_running() -> bool:
        return sum(1 for a in agents.values() for r in a.instances()
                   if r.state == "running") == count

    spec = Spec(name="light", command=["sleep", "60"], cpu=0.01, memory_mb=1, ports=PORTS)
    outside = {node: [first + 5, first + 60] for node, (first, _) in ranges.items()}
    # A few ports taken outside gavel, mid-range, and kept taken to the end: once one
    # binds again the node reports it free and the broker unblocks it (another test).
    with contextlib.ExitStack() as stack:
        for ports in outside.values():
            for port in ports:
                stack.enter_context(listening(port))
        reply = await cluster.call("submit", SubmitRequest(spec=spec, count=count),
                                   SubmitReply)
        ids = set(reply.instance_ids)
        assert len(ids) == count
        # Generous: hundreds of processes start on a machine that may be busy.
        await wait_for(lambda: all_running(), 120, what=f"{count} instances running")

        def node_files() -> dict[str, NodeFile]:
            """Each node's node.json; an empty one for a node that won none of the batch (a
            late bid on a busy machine): git has no file for it."""
            held = cluster.ledger().state().nodes
            return {n: held.get(n) or NodeFile(node_id=n) for n in agents}

        def recorded() -> bool:  # node.json holds the ports every process really got
            nodes = node_files()
            return all({i: pl.ports for i, pl in nodes[n].instances.items()}
                       == {r.instance_id: r.ports for r in a.instances()}
                       for n, a in agents.items())

        def settled() -> bool:  # and each instance a node handed back is placed again
            nodes = node_files()
            return sorted(i for n in agents for i in nodes[n].instances) == sorted(ids)
        # A loaded machine may still be placing again what a full node handed back when
        # the count first runs: wait for that, then for what git records of it.
        await wait_for(lambda: settled() and recorded() and all_running(), 60,
                       what="every instance placed once, node.json recording its real ports")

        # The batch was decided before anyone knew of the taken ports, so a node given its
        # whole range hands the last instance back (retryable, placed elsewhere); nothing else
        # moves.
        lines = [line for c in cluster.ledger().history() for line in c.message.split("\n")]
        requeues = [line for line in lines if line.startswith("requeue ")]
        assert all(line.endswith(f": {Reason.NO_ROOM_PORTS}") for line in requeues), requeues
        # At most one port change per taken port: a replacement never pushes other
        # instances around (a taken port no instance reached needs none — how far each
        # node's range fills depends on how the batch spread).
        changes = sum(line.startswith("ports of ") for line in lines)
        assert 1 <= changes <= sum(len(p) for p in outside.values()), changes
        blocks = [line for line in lines if line.startswith("block ports ")]
        assert all(line.endswith(f": {Reason.PORT_TAKEN}") for line in blocks), blocks
        nodes = node_files()
        placed = [i for n in agents for i in nodes[n].instances]
        assert sorted(placed) == sorted(ids), "every instance on exactly one node"
        for node, agent in agents.items():
            first, last = ranges[node]
            in_git = [p for pl in nodes[node].instances.values() for p in pl.ports.values()]
            assert len(in_git) == len(set(in_git)), f"overlapping ports in {node}'s node.json"
            assert all(first <= p <= last for p in in_git)
            assert not set(in_git) & set(outside[node])
            # Blocked: each taken port the node's lowest-first allocation went past - found by
            # the instance given it, whether that instance got other ports or, the range
            # nearly full, was handed back (its report names the taken ports all the same).
            # A node that won few of the batch (a late bid on a busy machine) never reached
            # them.
            reached = {p for p in outside[node] if in_git and p < max(in_git)}
            assert reached <= set(nodes[node].blocked_ports) <= set(outside[node])
            really = {r.instance_id: proc_ports(r.pid) for r in agent.instances()}
            got = [p for ports in really.values() for p in ports.values()]
            assert len(got) == len(set(got)), f"two processes on {node} got the same port"
            assert really == {i: pl.ports for i, pl in nodes[node].instances.items()}
        await wait_for(lambda: all(len(heartbeats.get(n, Heartbeat(node_id=n)).instances)
                                   == len(nodes[n].instances) for n in agents),
                       TIMING.heartbeat_s * 3, what="heartbeats list every instance")
        for node, hb in heartbeats.items():
            reported = [p for r in hb.instances for p in r.ports.values()]
            assert len(reported) == len(set(reported)) == 3 * len(nodes[node].instances)


async def test_a_port_taken_outside_gavel_is_replaced_and_blocked(cluster: Cluster) -> None:
    broker = await cluster.start_broker()
    first, last = free_range(25000, 10)
    await cluster.start_agent("node-a", port_range=(first, last))
    await cluster.wait_nodes(1)
    with listening(first):  # the lowest port of the range: the broker's first choice
        iid = await cluster.submit(sleeper_spec("web", ports=["http"]))
        await wait_for(lambda: cluster.holders(iid) == ["node-a"], 10, what="placed")
        agent = cluster.agents["node-a"]
        await wait_for(lambda: any(r.state == "running" for r in agent.instances()), 10,
                       what="running")
        (report,) = agent.instances()
        assert report.ports == {"http": last}  # replacements come from the top of the range
        assert proc_ports(report.pid) == {"http": last}

        def recorded() -> bool:
            nf = cluster.ledger().state().nodes["node-a"]
            return nf.instances[iid].ports == {"http": last} and nf.blocked_ports == [first]
        await wait_for(recorded, 10, what="node.json records the real port and the blocked one")
        provisioning = next(e for e in broker.events
                            if e.instance_id == iid and e.type == "provisioning")
        assert (provisioning.ports, provisioning.taken) == ({"http": last}, [first])

        # The next instance is offered neither the blocked port nor the one really in use.
        other = await cluster.submit(sleeper_spec("web2", ports=["http"]))
        await wait_for(lambda: cluster.holders(other) == ["node-a"], 10, what="placed")
        nf = cluster.ledger().state().nodes["node-a"]
        assert nf.instances[other].ports == {"http": first + 1}
        assert nf.blocked_ports == [first]
        assert agent.heartbeat().freed_ports == []  # still taken: nothing to give back

    # The outside listener is gone: the node says so in a heartbeat and the broker unblocks
    # the port in git, so the next instance may have it again.
    await wait_for(lambda: cluster.ledger().state().nodes["node-a"].blocked_ports == [], 10,
                   what="the freed port unblocked in node.json")
    log = cluster.ledger().repo.walk(cluster.ledger().repo.head.target)
    assert any(f"ports {first} on node-a are free again" in c.message for c in log)
    third = await cluster.submit(sleeper_spec("web3", ports=["http"]))
    await wait_for(lambda: cluster.holders(third) == ["node-a"], 10, what="placed")
    assert cluster.ledger().state().nodes["node-a"].instances[third].ports == {"http": first}


async def test_an_instance_handed_back_for_want_of_ports_still_blocks_the_taken_one(
        cluster: Cluster) -> None:
    """A two-port range with one port taken outside gavel and an instance that needs
    both: the node cannot run it and hands it back (no free ports), naming the taken port;
    the broker blocks it there, so no later award carries it again."""
    await cluster.start_broker()
    first, last = free_range(27000, 2)
    await cluster.start_agent("node-a", port_range=(first, last))
    await cluster.wait_nodes(1)
    with listening(first):
        iid = await cluster.submit(sleeper_spec("pair", ports=["http", "admin"]))

        def blocked() -> bool:
            nf = cluster.ledger().state().nodes.get("node-a")
            return nf is not None and nf.blocked_ports == [first]
        await wait_for(blocked, 15, what="the taken port blocked in node.json")
        lines = [line for c in cluster.ledger().history() for line in c.message.split("\n")]
        assert f"requeue {iid} off node-a: {Reason.NO_ROOM_PORTS}" in lines
        assert f"block ports {first} on node-a: {Reason.PORT_TAKEN}" in lines
        assert iid not in cluster.ledger().state().nodes["node-a"].instances


async def test_a_port_held_by_a_local_instance_is_replaced_not_blocked(
        nats_url: str, tmp_path: Any) -> None:
    """Two awards naming the same port (a replacement the broker has not recorded yet can do
    that): the second instance gets another port, and the clash is not reported as taken
    outside gavel."""
    first, last = free_range(26000, 10)
    agent = Agent(nats_url=nats_url, node_id="n1", strategy=make_strategy("least-loaded"),
                  labels={}, state_dir=tmp_path / "w", timing=TIMING, cpu=4.0, memory_mb=4096,
                  port_range=(first, last))
    task = asyncio.create_task(agent.run())
    nc = await nats.connect(nats_url)
    events: list[Event] = []

    async def on_event(msg: Any) -> None:
        events.append(msgspec.msgpack.decode(msg.data, type=Event))
    try:
        await nc.subscribe(subjects.REPORT.format(node="n1"), cb=on_event)
        await asyncio.wait_for(agent.ready.wait(), 15)
        enc = msgspec.msgpack.Encoder()
        for iid in ("one", "two"):
            award = Award(auction_id=f"x-{iid}", instance_id=iid, node_id="n1",
                          spec=sleeper_spec(iid, ports=["http"]), ports={"http": first})
            await nc.publish(subjects.AWARD.format(node="n1"), enc.encode(award))
        await wait_for(lambda: sum(e.type == "running" for e in events) == 2, 10,
                       what="both running")
        running = {e.instance_id: (e.ports, e.taken) for e in events if e.type == "running"}
        assert running == {"one": ({"http": first}, []), "two": ({"http": last}, [])}
        pids = {r.instance_id: r.pid for r in agent.instances()}
        assert proc_ports(pids["one"]) == {"http": first}
        assert proc_ports(pids["two"]) == {"http": last}
    finally:
        await agent.stop()
        await asyncio.wait_for(task, 10)
        await nc.close()
