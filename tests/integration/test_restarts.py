"""Restarts: a worker restarted under its instances re-adopts them, and a broker killed with
SIGKILL in the middle of a stream of submissions places every instance exactly once.

Real nats-server, real git, real processes; in the second test the broker is a real
`gavel broker` child process, so it can be killed without any chance to clean up.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import psutil
import pytest

from gavel.shared.api import NodesReply, NodesRequest, SubmitReply, SubmitRequest
from gavel.shared.messages import Spec
from gavel.shared.reasons import Reason
from gavel.shared.records import parse_trailers
from gavel.transport.client import ClientError, call
from tests.integration.harness import TIMING, Cluster, gavel_process, wait_for

pytestmark = pytest.mark.integration


def alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def counting_spec(name: str, starts: Path) -> Spec:
    """Appends its pid to `starts` each time it starts, then sleeps."""
    code = (f"import os, time; open({str(starts)!r}, 'a').write(f'{{os.getpid()}}\\n'); "
            "time.sleep(60)")
    return Spec(name=name, command=[sys.executable, "-c", code])


async def test_worker_restart_readopts_without_a_second_copy(
        cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    a = await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    starts = tmp_path / "starts"
    iid = await cluster.submit(counting_spec("keep", starts))
    await wait_for(lambda: any(r.state == "running" for r in a.instances()), 10, what="running")
    (before,) = a.instances()
    assert cluster.holders(iid) == ["node-a"]
    await asyncio.sleep(TIMING.heartbeat_s * 2)  # let every report of the first run land
    head = cluster.ledger().head()

    await cluster.stop_agent("node-a", kill_children=False)
    assert alive(before.pid)
    b = await cluster.start_agent("node-a")  # the same state dir
    await wait_for(lambda: bool(b.instances()), 15, what="re-adopted")
    (after,) = b.instances()
    assert (after.instance_id, after.pid, after.state) == (iid, before.pid, "running")
    await asyncio.sleep(TIMING.heartbeat_s * 3)  # heartbeats, a KV round, convergence
    assert [r.pid for r in b.instances()] == [before.pid] and alive(before.pid)
    assert starts.read_text().split() == [str(before.pid)], "never a second copy"
    assert cluster.ledger().head() == head, "a worker restart changes nothing in git"
    status = await cluster.status(iid)
    assert (status.state, status.node_id, status.attempt) == ("running", "node-a", 1)


async def test_broker_kill_9_mid_stream_places_every_instance_once(
        cluster: Cluster, tmp_path: Path) -> None:
    env = {"GAVEL_NATS_URL": cluster.url, "GAVEL_FAST_TIMERS": "1"}
    log = tmp_path / "broker.log"

    def broker() -> subprocess.Popen[bytes]:
        return gavel_process(["broker", "--state", str(cluster.state)], log, env=env)

    procs = [broker()]
    try:
        agents = [await cluster.start_agent(f"node-{n}", cpu=4.0) for n in "abc"]
        nc = await cluster.client()

        async def healthy() -> bool:
            try:
                reply = await call(nc, "nodes", NodesRequest(), NodesReply, timeout=1.0)
            except ClientError:
                return False
            return sum(n.health == "healthy" for n in reply.nodes) == 3
        await wait_for(healthy, 20, what="broker up with three nodes")

        spec = Spec(name="light", command=["sleep", "60"], cpu=0.01, memory_mb=1)
        ids = [f"r{i:02d}" for i in range(60)]
        retried: Counter[str] = Counter()

        async def submit_all() -> None:
            for iid in ids:
                while True:
                    try:
                        await call(nc, "submit", SubmitRequest(spec=spec, instance_id=iid),
                                   SubmitReply, timeout=1.0)
                        break
                    except ClientError as exc:
                        if str(exc).startswith(Reason.DUPLICATE):
                            break  # committed before the kill; the reply was lost
                        retried[iid] += 1
                        await asyncio.sleep(0.05)
                await asyncio.sleep(0.02)

        stream = asyncio.create_task(submit_all())
        def submitted() -> int:
            return len(cluster.ledger().state().instances)
        for at in (15, 40):  # two kills, each in the middle of the stream
            await wait_for(lambda: submitted() >= at, 20,  # noqa: B023 - awaited right here
                           what=f"{at} submissions")
            procs[-1].send_signal(signal.SIGKILL)
            procs[-1].wait(5)
            await asyncio.sleep(TIMING.heartbeat_s / 2)
            procs.append(broker())
        await asyncio.wait_for(stream, 40)
        assert sum(retried.values()) > 0, "the kills did not interrupt the stream"

        def all_running() -> bool:
            return sum(r.state == "running" for ag in agents for r in ag.instances()) == 60
        await wait_for(all_running, 30, what="60 instances running")

        nodes = cluster.ledger().state().nodes
        holders = Counter(i for nf in nodes.values() for i in nf.instances)
        assert set(holders) == set(ids) and set(holders.values()) == {1}
        running = Counter(r.instance_id for ag in agents for r in ag.instances())
        assert running == holders, "each instance runs on exactly one node, once"

        wins: Counter[str] = Counter()
        requeues: Counter[str] = Counter()
        for commit in cluster.ledger().history():
            wins.update(r.instance_id for r in parse_trailers(commit.message) if r.winner)
            for line in commit.message.split("\n"):
                if line.startswith("requeue "):
                    requeues[line.split()[1]] += 1
        for iid in ids:
            assert wins[iid] == 1 + requeues[iid], (iid, wins[iid], requeues[iid])
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
