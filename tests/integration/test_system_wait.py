"""`gavel submit --wait` on a system job, through the real CLI against a real broker and real
workers: it returns once an instance runs healthy on every node that could run it (each
node's auction done, each process started), and exits 3 naming the instance a node
declined (unschedulable, with the node's reason) rather than wait for ever."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from gavel.client import Client, TimedOut
from tests.integration.harness import Cluster

SLEEP = '["python3", "-c", "import time; time.sleep(600)"]'


def spec_file(tmp: Path, name: str, cpu: float) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(f'name = "{name}"\ntype = "system"\ncommand = {SLEEP}\ncpu = {cpu}\n'
                    'labels = { role = "edge" }\n')
    return path


async def submit_wait(cluster: Cluster, spec: Path) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "gavel", "submit", str(spec), "--wait",
                         "--timeout", "120", "--nats", cluster.url],
        capture_output=True, text=True, timeout=180)


async def test_submit_wait_returns_once_every_nodes_instance_runs(cluster: Cluster,
                                                                  tmp_path: Path) -> None:
    await cluster.start_broker()
    for node in ("node-a", "node-b"):
        await cluster.start_agent(node, labels={"role": "edge"})
    await cluster.start_agent("node-x", labels={"role": "db"})  # not the job's
    await cluster.wait_nodes(3)
    got = await submit_wait(cluster, spec_file(tmp_path, "agent", 0.5))
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "agent running on 2 nodes: node-a, node-b"
    assert cluster.broker is not None
    state = cluster.broker.ledger.state()
    shown = cluster.broker.api.views.state_of
    running = {r.only_node for r in state.replicas_of("agent") if shown(r) == "running"}
    assert running == {"node-a", "node-b"}  # both had reported running when it returned

    await cluster.start_agent("node-tiny", labels={"role": "edge"}, cpu=0.5)  # no room
    await cluster.wait_nodes(4)
    got = await submit_wait(cluster, spec_file(tmp_path, "big", 1.0))
    assert got.returncode == 3, got.stdout + got.stderr
    assert "is unschedulable: " in got.stderr and "no room for" in got.stderr, got.stderr


async def test_a_wait_past_its_time_says_which_nodes_it_waited_for(cluster: Cluster,
                                                                    tmp_path: Path) -> None:
    """The client's wait past its timeout is `TimedOut` with the status it last saw, and the
    CLI, whose wait it is, names the nodes still waited for (exit 3)."""
    await cluster.start_broker()
    await cluster.start_agent("node-a", labels={"role": "edge"})
    await cluster.wait_nodes(1)
    path = tmp_path / "sick.toml"  # runs, and is never healthy: its one check always fails
    path.write_text(f'name = "sick"\ntype = "system"\ncommand = {SLEEP}\ncpu = 0.1\n'
                    'labels = { role = "edge" }\n'
                    'checks = [{ type = "exec", command = ["false"], interval_s = 0.2 }]\n')
    got = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "gavel", "submit", str(path), "--wait",
                         "--timeout", "1", "--nats", cluster.url],
        capture_output=True, text=True, timeout=180)
    assert got.returncode == 3, got.stdout + got.stderr
    assert "sick not running on every node within 1s: waiting for node-a" in got.stderr, \
        got.stderr
    async with await Client.connect(cluster.url) as client:
        with pytest.raises(TimedOut) as timed_out:
            await client.wait_system("sick", timeout=0.5)
    assert timed_out.value.status.waiting == ["node-a"]
