"""Issue 3's promises, each against a real nats-server, real git and real processes."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from gavel.shared.api import CancelReply, CancelRequest, WhyReply, WhyRequest
from gavel.shared.messages import Spec
from gavel.shared.reasons import Reason
from tests.integration.harness import TIMING, Cluster, FakeNode, sleeper_spec, wait_for, writer_spec

pytestmark = pytest.mark.integration


def _state(cluster: Cluster, iid: str) -> str:
    return cluster.ledger().state().instances[iid].state


async def test_missed_provisioning_deadline_replaces_elsewhere(cluster: Cluster) -> None:
    await cluster.start_broker()
    mute = await FakeNode(cluster.url, "node-z", load=0.0).start()  # wins, never accepts
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(2)
    iid = await cluster.submit(sleeper_spec("svc"))
    await wait_for(lambda: cluster.holders(iid) == ["node-z"], 10, what="node-z wins")
    await wait_for(lambda: cluster.holders(iid) == ["node-a"], TIMING.provisioning_s * 3,
                   what="re-placed on node-a")
    state = cluster.ledger().state()
    assert state.instances[iid].excluded == ("node-z",)
    placement = state.placement(iid)
    assert placement is not None and placement.attempt == 2
    messages = [c.message for c in cluster.ledger().history()]
    assert any(f"requeue {iid} off node-z: {Reason.NOT_ACCEPTED}" in m for m in messages)
    await mute.close()


async def test_unreachable_keeps_offline_replaces(cluster: Cluster) -> None:
    broker = await cluster.start_broker()
    ghost = await FakeNode(cluster.url, "node-z", load=0.0).start()
    ghost.confirm = True
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(2)
    iid = await cluster.submit(sleeper_spec("svc"))
    await wait_for(lambda: cluster.holders(iid) == ["node-z"], 10, what="node-z wins")
    ghost.heartbeating = False
    ghost.bidding = False
    await wait_for(lambda: broker.liveness.health("node-z", broker.now()) == "unreachable",
                   TIMING.unreachable_s * 2, what="node-z unreachable")
    await asyncio.sleep(TIMING.heartbeat_s * 2)
    assert cluster.holders(iid) == ["node-z"], "an unreachable node's instance was moved"
    await wait_for(lambda: cluster.holders(iid) == ["node-a"], TIMING.offline_s * 2,
                   what="re-placed after node-z went offline")
    msgs = [c.message for c in cluster.ledger().history()]
    assert any(f"requeue {iid} off node-z: {Reason.NO_LEASE}" in m for m in msgs)
    await ghost.close()


async def test_attempts_exhausted_is_lost_with_a_reason(cluster: Cluster) -> None:
    broker = await cluster.start_broker()
    ghost = await FakeNode(cluster.url, "node-z", load=0.0).start()
    ghost.confirm = True
    await cluster.wait_nodes(1)
    iid = await cluster.submit(sleeper_spec("once", attempts=1))
    await wait_for(lambda: cluster.holders(iid) == ["node-z"], 10, what="placed")
    ghost.heartbeating = False
    await wait_for(lambda: _state(cluster, iid) == "lost", TIMING.offline_s * 2,
                   what="lost")
    rec = cluster.ledger().state().instances[iid]
    assert rec.reason == Reason.NO_LEASE
    assert Reason.ATTEMPTS_EXHAUSTED in rec.detail
    assert cluster.holders(iid) == []
    assert broker.liveness.health("node-z", broker.now()) == "offline"
    await ghost.close()


async def test_driver_failure_spends_attempts_then_fails(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.start_agent("node-b")
    await cluster.wait_nodes(2)
    spec = Spec(name="nobin", command=["/nonexistent/binary"], attempts=2)
    iid = await cluster.submit(spec)
    await wait_for(lambda: _state(cluster, iid) == "failed", 20, what="failed")
    rec = cluster.ledger().state().instances[iid]
    assert rec.attempt == 2
    assert rec.reason == Reason.DRIVER_FAILED
    assert Reason.ATTEMPTS_EXHAUSTED in rec.detail


async def test_spec_timeout_kills_a_process_that_ignores_sigterm(
        cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    pidfile = tmp_path / "pid"
    code = ("import os, signal, time, pathlib; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            f"pathlib.Path({str(pidfile)!r}).write_text(str(os.getpid())); time.sleep(600)")
    # long enough for an interpreter to start and write its pid on a loaded machine (at 0.5 s
    # beside a 10,000-agent bench it was killed first, and wrote nothing)
    timeout_s = 4.0
    iid = await cluster.submit(Spec(name="stubborn", command=[sys.executable, "-c", code],
                                    timeout_s=timeout_s))
    await wait_for(pidfile.exists, 10, what="process started")
    pid = int(pidfile.read_text())
    await wait_for(lambda: _state(cluster, iid) == "failed",
                   timeout_s + TIMING.kill_grace_s + 10, what="failed by timeout")
    rec = cluster.ledger().state().instances[iid]
    assert rec.reason == Reason.TIMEOUT
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_cancel_stops_the_process(cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    pidfile = tmp_path / "pid"
    code = (f"import os, time, pathlib; pathlib.Path({str(pidfile)!r}).write_text("
            "str(os.getpid())); time.sleep(600)")
    iid = await cluster.submit(Spec(name="svc", command=[sys.executable, "-c", code]))
    await wait_for(pidfile.exists, 10, what="process started")
    pid = int(pidfile.read_text())
    reply = await cluster.call("cancel", CancelRequest(instance_id=iid), CancelReply)
    assert reply.state == "cancelling"
    await wait_for(lambda: _state(cluster, iid) == "cancelled", 15, what="cancelled")
    assert cluster.ledger().state().instances[iid].reason == Reason.CANCELLED
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_cancel_unanswered_is_written_by_the_broker(cluster: Cluster) -> None:
    await cluster.start_broker()
    deaf = await FakeNode(cluster.url, "node-z").start()
    deaf.confirm = True
    await cluster.wait_nodes(1)
    iid = await cluster.submit(sleeper_spec("svc"))
    await wait_for(lambda: cluster.holders(iid) == ["node-z"], 10, what="placed")
    await cluster.call("cancel", CancelRequest(instance_id=iid), CancelReply)
    await wait_for(lambda: _state(cluster, iid) == "cancelled", TIMING.cancel_grace_s * 2,
                   what="cancelled by the broker")
    assert cluster.ledger().state().instances[iid].reason == Reason.CANCEL_UNANSWERED
    assert cluster.holders(iid) == []
    await deaf.close()


async def test_cancel_of_a_queued_instance_is_immediate(cluster: Cluster) -> None:
    await cluster.start_broker()
    iid = await cluster.submit(sleeper_spec("nowhere"))
    reply = await cluster.call("cancel", CancelRequest(instance_id=iid), CancelReply)
    assert reply.state == "cancelled"
    await wait_for(lambda: _state(cluster, iid) == "cancelled", 15, what="cancelled")


async def test_capacity_declines(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.start_agent("small", cpu=1.0, memory_mb=512)
    await cluster.start_agent("big", cpu=8.0, memory_mb=8192)
    await cluster.wait_nodes(2)
    iid = await cluster.submit(sleeper_spec("fat", cpu=4.0, memory_mb=1024))
    await wait_for(lambda: cluster.holders(iid) == ["big"], 10, what="placed on big")
    why = await cluster.call("why", WhyRequest(instance_id=iid), WhyReply)
    declines = {d.node_id: (d.reason, d.detail) for d in why.auctions[0].declines}
    assert declines == {"small": (Reason.NO_ROOM_CPU, "4")}


async def test_secrets_reach_the_process_and_nowhere_else(
        cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    secret = "s3cr3t-value-7f2a9c"
    await cluster.start_broker(secrets={"SECRET_DB_PASSWORD": secret})
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    out = tmp_path / "out"
    iid = await cluster.submit(writer_spec("app", out, secrets=["SECRET_DB_PASSWORD"]))
    await wait_for(lambda: (out / iid).exists(), 10, what="process ran")
    assert json.loads((out / iid).read_text())["SECRET_DB_PASSWORD"] == secret
    await wait_for(lambda: _state(cluster, iid) == "succeeded", 10, what="succeeded")
    repo = cluster.ledger().repo
    for oid in repo.odb:
        assert secret.encode() not in repo.odb.read(oid)[1]
    for path in (cluster.root / "workers").rglob("*"):
        if path.is_file() and path.parent.name != "out":
            assert secret.encode() not in path.read_bytes(), path
    assert secret not in caplog.text
    events = [e for e in cluster.broker.events] if cluster.broker else []
    assert all(secret not in repr(e) for e in events)
