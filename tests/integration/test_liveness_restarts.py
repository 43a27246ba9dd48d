"""A node's offline clock survives broker restarts, and an outage that silenced everyone
counts against no one.

Real nats-server, real `gavel broker` and `gavel worker` child processes under fast timers;
brokers die by SIGKILL, as a crash-looping broker would. What must hold:
- a node that dies has its instances re-placed however often the broker restarts - even
  every `offline_s / 3`, when no broker ever lives long enough to count `offline_s` itself -
  within the restarts that `offline_s` + a heartbeat + a tick after its last heartbeat
  allow, or at the first start after that;
- a NATS outage longer than `offline_s` (nats-server stopped and started, or frozen and
  resumed) with every node unable to speak does not make the next broker declare live nodes
  offline, even when the nodes are heard only after that broker has been up for longer
  than a heartbeat.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import nats
import pytest

from gavel.broker.ledger.repository import Ledger
from gavel.shared.api import StatusReply, StatusRequest, SubmitReply, SubmitRequest
from gavel.shared.messages import Spec
from gavel.shared.reasons import Reason
from gavel.transport.client import ClientError, call
from gavel.transport.natsserver import NatsServer
from tests.integration.harness import TIMING, Daemons, healthy_nodes, wait_for

pytestmark = pytest.mark.integration


def sleeper(name: str, **kw: Any) -> Spec:
    return Spec(name=name, command=[sys.executable, "-c", "import time; time.sleep(600)"],
                cpu=0.5, memory_mb=64, **kw)


def holders(state: Path, iid: str) -> list[str]:
    st = Ledger(state / "state.git").state()
    return sorted(n for n, nf in st.nodes.items() if iid in nf.instances)


async def running_on(nc: Any, iid: str, node: str) -> bool:
    try:
        reply = await call(nc, "status", StatusRequest(instance_id=iid), StatusReply,
                           timeout=2.0)
    except ClientError:
        return False
    st = reply.instances[0]
    return st.state == "running" and st.node_id == node


async def submit(nc: Any, spec: Spec) -> str:
    reply = await call(nc, "submit", SubmitRequest(spec=spec), SubmitReply, timeout=10.0)
    return reply.instance_id


async def test_a_dead_node_is_replaced_however_often_the_broker_restarts(
        nats_server: NatsServer, tmp_path: Path) -> None:
    d = Daemons(nats_server.url, tmp_path)
    nc = await nats.connect(nats_server.url)
    try:
        d.broker()
        d.worker("node-a")
        await wait_for(lambda: _has(nc, {"node-a"}), 30, what="node-a healthy")
        iid = await submit(nc, sleeper("doomed"))
        await wait_for(lambda: running_on(nc, iid, "node-a"), 30, what="running on node-a")
        d.worker("node-b")
        await wait_for(lambda: _has(nc, {"node-a", "node-b"}), 30, what="both healthy")

        d.kill(d.workers["node-a"], children=True)  # dead, its instance with it
        # Each restart SIGKILLs the broker, offline_s / 3 after the one before: no broker
        # ever lives for offline_s. The instance must move within the restarts that
        # offline_s + a heartbeat + a tick after the node's last heartbeat allow, plus the
        # start after that moment.
        period = TIMING.offline_s / 3
        allowed = math.ceil((TIMING.offline_s + TIMING.heartbeat_s + TIMING.tick_s)
                            / period) + 1
        restarts = 0
        moved = False
        while not moved and restarts <= allowed + 2:
            until = time.monotonic() + period
            while time.monotonic() < until:
                if holders(d.state, iid) != ["node-a"]:
                    moved = True
                    break
                await asyncio.sleep(0.05)
            if not moved:
                d.kill(d.brokers[-1])
                d.broker()
                restarts += 1
                # Each broker's period runs from when it answers: a start slowed by a loaded
                # machine is no broker life, and must not count as one of the restarts.
                await wait_for(lambda: _answers(nc), 60,
                               what="the restarted broker answering")
        assert moved, f"still on the dead node after {restarts} broker restarts"
        assert restarts <= allowed, f"moved only after {restarts} restarts ({allowed} allowed)"
        await wait_for(lambda: holders(d.state, iid) == ["node-b"], 90,
                       what="the instance placed on the live node")
        await wait_for(lambda: running_on(nc, iid, "node-b"), 90, what="running on node-b")
    finally:
        await nc.close()
        d.close()


async def _has(nc: Any, nodes: set[str]) -> bool:
    return nodes <= await healthy_nodes(nc)


@pytest.mark.parametrize("outage", ["restart", "freeze"])
async def test_an_outage_for_everyone_does_not_make_the_next_broker_declare_nodes_offline(
        nats_server: NatsServer, tmp_path: Path, outage: str) -> None:
    """"restart": nats-server stopped and started again (its memory, the heartbeat stream
    with it, is gone); "freeze": nats-server stopped with SIGSTOP and resumed (the stream
    still holds every node's heartbeat from before the outage). Either way the workers are
    paused through the outage and until the next broker has been up for two heartbeats, so
    it cannot have heard them before it judges them."""
    d = Daemons(nats_server.url, tmp_path)
    nc = await nats.connect(nats_server.url)
    try:
        d.broker()
        d.worker("node-a", labels="zone=a")
        d.worker("node-b", labels="zone=b")
        await wait_for(lambda: _has(nc, {"node-a", "node-b"}), 30, what="both healthy")
        ids = {node: await submit(nc, sleeper(f"keep-{zone}", labels={"zone": zone}))
               for node, zone in (("node-a", "a"), ("node-b", "b"))}
        for node, iid in ids.items():
            await wait_for(lambda n=node, i=iid: running_on(nc, i, n), 30,  # type: ignore[misc]
                           what=f"running on {node}")
        await nc.close()
        d.kill(d.brokers[-1])
        for proc in d.workers.values():
            os.kill(proc.pid, signal.SIGSTOP)
        head = Ledger(d.state / "state.git").head()

        quiet = TIMING.offline_s + 2 * TIMING.heartbeat_s
        if outage == "restart":
            nats_server.stop()
            await asyncio.sleep(quiet)
            nats_server.start()
        else:
            assert nats_server.proc is not None
            nats_server.proc.send_signal(signal.SIGSTOP)
            await asyncio.sleep(quiet)
            nats_server.proc.send_signal(signal.SIGCONT)

        nc = await nats.connect(nats_server.url)
        d.broker()
        await wait_for(lambda: _answers(nc), 30, what="the next broker to answer")
        await asyncio.sleep(2 * TIMING.heartbeat_s)  # past any grace a presumption gives
        for proc in d.workers.values():
            os.kill(proc.pid, signal.SIGCONT)
        await wait_for(lambda: _has(nc, {"node-a", "node-b"}), 30, what="both heard again")
        await asyncio.sleep(2 * TIMING.tick_s)  # a watch or two after they were heard

        ledger = Ledger(d.state / "state.git")
        since = []
        for commit in ledger.history():
            if str(commit.id) == head:
                break
            since.append(commit.message)
        assert not [m for m in since if Reason.NO_LEASE.value in m], \
            "the next broker declared a live node offline"
        for node, iid in ids.items():
            assert holders(d.state, iid) == [node]
    finally:
        await nc.close()
        d.close()


async def _answers(nc: Any) -> bool:
    try:
        await call(nc, "status", StatusRequest(), StatusReply, timeout=2.0)
    except ClientError:
        return False
    return True
