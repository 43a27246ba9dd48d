"""What an instance measurably uses (`worker.usage`), on this host's real kernel through a
real worker and broker: a busy instance's cpu and memory are non-zero in `gavel status`, the
node's view and Prometheus, and bounded by its cgroup (memory by its limit; cpu by its quota,
allowing what a quota lets through at the edges of one reading's window)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from prometheus_client import generate_latest

from gavel.shared.api import NodesReply, NodesRequest
from gavel.shared.messages import Spec
from gavel.worker import usage
from gavel.worker.cgroups import PERIOD_US
from tests.integration.harness import Cluster, wait_for
from tests.integration.test_cgroups import enforced, node_id

#: A clock tick: the resolution of a process's cpu times where the cgroup's own counter
#: is not there to read (a v1 hierarchy without cpuacct); two readings make a rate.
_TICK_S = 0.01


async def test_a_busy_instance_shows_what_it_uses_within_its_cgroup(cluster: Cluster) -> None:
    node = node_id()
    await cluster.start_broker()
    await cluster.start_agent(node, cgroups=enforced(node, cpu_limit="quota"))
    await cluster.wait_nodes(1)
    code = ("b = bytearray(24 * 1024 * 1024); b[::4096] = b'x' * len(range(0, len(b), 4096))\n"
            "while True: pass")
    iid = await cluster.submit(Spec(name="busy", command=[sys.executable, "-c", code],
                                    cpu=0.5, memory_mb=64))

    async def measured() -> bool:
        st = await cluster.status(iid)
        return bool(st.cpu_used > 0 and st.memory_used_mb >= 24)

    await wait_for(measured, 60, what="its cpu and memory measured")
    window = usage.MIN_INTERVAL_S
    most_cpu = 0.5 * (1 + PERIOD_US / 1e6 / window) + 2 * _TICK_S / window
    for _ in range(3):  # three readings of the node's, each within the cgroup's bounds
        st = await cluster.status(iid)
        assert 0 < st.cpu_used <= most_cpu, st
        assert 0 < st.memory_used_mb <= 64, st
        await wait_for(lambda b=st.cpu_used: _new_reading(cluster, node, b), 30,
                       what="a new reading")
    nodes = await cluster.call("nodes", NodesRequest(), NodesReply)
    mine = next(n for n in nodes.nodes if n.node_id == node)
    assert mine.cpu_used > 0 and mine.memory_used_mb >= 24  # beside committed 0.5 cpu, 64 MB
    assert (mine.committed.cpu, mine.committed.memory_mb) == (0.5, 64)
    detail = await cluster.call("nodes", NodesRequest(node_id=node), NodesReply)
    assert detail.detail is not None and detail.detail.instances[0].memory_used_mb >= 24
    assert cluster.broker is not None
    text = generate_latest(cluster.broker.metrics.registry).decode()
    assert f'gavel_instance_cpu_used{{instance="{iid}",node="{node}"}}' in text
    assert f'gavel_node_memory_used_bytes{{node="{node}"}}' in text
    assert "gavel_instance_usage_omitted 0.0" in text
    proc = await asyncio.to_thread(subprocess.run, [
        sys.executable, "-m", "gavel", "status", iid, "--nats", cluster.url],
        capture_output=True, text=True, timeout=60)
    head, row = proc.stdout.splitlines()[-2:]
    cells = dict(zip(head.replace("MEM MB", "MEM_MB").split(), row.split(), strict=False))
    assert float(cells["CPU"]) > 0 and 0 < float(cells["MEM_MB"]) <= 64, proc.stdout


def _new_reading(cluster: Cluster, node: str, before: float) -> bool:
    b = cluster.broker
    hb = b.liveness.heartbeats.get(node) if b is not None else None
    return hb is not None and any(r.cpu_used != before for r in hb.instances)
