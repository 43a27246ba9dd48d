"""The worker agent against a real nats-server and real child processes.

The broker side is a plain nats-py client (`FakeBroker`) that speaks the wire protocol: it
publishes RFBs, awards and cancels and reads bids, heartbeats and events, so these tests pin
the worker's half of the protocol without depending on the broker's code.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import nats
import psutil
import pytest

from gavel.shared import subjects
from gavel.shared.messages import (
    RFB,
    Award,
    Bid,
    BidReply,
    Cancel,
    Decline,
    Event,
    Heartbeat,
    Shape,
    Spec,
)
from gavel.shared.reasons import Reason
from gavel.shared.spec import Restart
from gavel.shared.strategies import make_strategy
from gavel.shared.timing import Timing
from gavel.transport import wire
from gavel.transport.natsserver import NatsServer
from gavel.worker.agent import Agent
from tests.integration.harness import free_range

pytestmark = pytest.mark.integration

TIMING = Timing.from_env(os.environ)
NODE = "n1"
SECRET = "hunter2-very-secret-value"
_enc = msgspec.msgpack.Encoder()


def py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def pid_gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


async def until(pred: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class FakeBroker:
    """The broker's side of the wire, for one node."""

    def __init__(self, nc: Any, node: str = NODE) -> None:
        self.nc = nc
        self.node = node
        self.bids: asyncio.Queue[BidReply] = asyncio.Queue()
        self.heartbeats: asyncio.Queue[Heartbeat] = asyncio.Queue()
        self.events: dict[str, asyncio.Queue[Event]] = {}
        self.n = 0

    async def listen(self) -> FakeBroker:
        for subject, decoder, sink in (
            (subjects.BIDS, msgspec.msgpack.Decoder(BidReply), self.bids.put_nowait),
            (subjects.HEARTBEAT, msgspec.msgpack.Decoder(Heartbeat), self.heartbeats.put_nowait),
            (subjects.REPORT, msgspec.msgpack.Decoder(Event), self._event),
        ):
            async def cb(msg: Any, decoder: Any = decoder, sink: Any = sink) -> None:
                sink(decoder.decode(msg.data))
            await self.nc.subscribe(subject.format(node=self.node), cb=cb)
        await wire.subscribed(self.nc)
        return self

    def _event(self, ev: Event) -> None:
        self.events.setdefault(ev.instance_id, asyncio.Queue()).put_nowait(ev)

    async def event(self, iid: str, timeout: float = 5.0) -> Event:
        queue = self.events.setdefault(iid, asyncio.Queue())
        return await asyncio.wait_for(queue.get(), timeout)

    async def rfb(self, *shapes: Shape, subject: str = subjects.RFB) -> BidReply:
        self.n += 1
        aid = f"a{self.n}"
        rfb = RFB(auction_id=aid, shapes=list(shapes), deadline_s=TIMING.bid_deadline_s)
        await self.nc.publish(subject, _enc.encode(rfb))
        while True:
            reply = await asyncio.wait_for(self.bids.get(), 5)
            if reply.auction_id == aid:
                return reply

    async def award(self, iid: str, spec: Spec, **kw: Any) -> None:
        kw.setdefault("node_id", self.node)
        await self.nc.publish(subjects.AWARD.format(node=self.node), _enc.encode(
            Award(auction_id=f"x-{iid}", instance_id=iid, spec=spec, **kw)))

    async def cancel(self, iid: str) -> None:
        await self.nc.publish(subjects.CANCEL.format(node=self.node),
                              _enc.encode(Cancel(instance_id=iid, node_id=self.node)))

    async def heartbeat(self, pred: Callable[[Heartbeat], bool], timeout: float = 5.0
                        ) -> Heartbeat:
        deadline = time.monotonic() + timeout
        while True:
            hb = await asyncio.wait_for(self.heartbeats.get(), deadline - time.monotonic())
            if pred(hb):
                return hb

    def forget_heartbeats(self) -> None:
        while not self.heartbeats.empty():
            self.heartbeats.get_nowait()

    async def started(self, iid: str) -> int:
        """Expect provisioning then running; the pid."""
        assert (await self.event(iid)).type == "provisioning"
        running = await self.event(iid)
        assert running.type == "running", running
        return int(running.detail.removeprefix("pid "))


Start = Callable[..., Awaitable[Agent]]


@pytest.fixture
async def broker(nats_url: str) -> AsyncIterator[FakeBroker]:
    nc = await nats.connect(nats_url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    try:
        yield await FakeBroker(nc).listen()
    finally:
        await nc.close()


@pytest.fixture
def ports() -> tuple[int, int]:
    """The node's port range: ten ports free when the test starts (the worker skips one in use,
    so a port another test holds would move every port these tests expect)."""
    return free_range(21000, 10)


@pytest.fixture
async def start(nats_url: str, tmp_path: Path, ports: tuple[int, int]) -> AsyncIterator[Start]:
    running: list[tuple[Agent, asyncio.Task[None]]] = []

    async def start(**kw: Any) -> Agent:
        options: dict[str, Any] = {
            "nats_url": nats_url, "node_id": NODE, "strategy": make_strategy("least-loaded"),
            "labels": {"zone": "a"}, "state_dir": tmp_path / "worker", "timing": TIMING,
            "cpu": 4.0, "memory_mb": 4096, "port_range": ports,
        }
        options.update(kw)
        agent = Agent(**options)
        task = asyncio.create_task(agent.run())
        running.append((agent, task))
        await asyncio.wait_for(agent.ready.wait(), 15)
        return agent

    yield start
    for agent, task in running:
        await agent.stop()
        await asyncio.wait_for(task, 10)


def req(**kw: Any) -> Shape:
    return Shape(cpu=kw.pop("cpu", 1.0), memory_mb=kw.pop("memory_mb", 256),
                   **kw)


async def test_bids_declines_and_draining(start: Start, broker: FakeBroker) -> None:
    agent = await start()
    reply = await broker.rfb(req(), req(labels={"zone": "b"}), req(cpu=8.0),
                             req(memory_mb=9999), req(ports=11))
    assert reply.node_id == NODE
    assert [a.shape for a in reply.answers] == [0, 1, 2, 3, 4]  # answers name their shape
    fits, label, cpu, mem, ports = reply.answers
    assert isinstance(fits, Bid) and fits.strategy == "least-loaded" and 0 <= fits.load <= 1
    assert isinstance(label, Decline) and label.reason == Reason.MISSING_LABEL
    assert label.detail == "zone=b"
    assert isinstance(cpu, Decline) and cpu.reason == Reason.NO_ROOM_CPU
    assert isinstance(mem, Decline) and mem.reason == Reason.NO_ROOM_MEMORY
    assert isinstance(ports, Decline) and ports.reason == Reason.NO_ROOM_PORTS

    directed = await broker.rfb(req(), subject=subjects.RFB_NODE.format(node=NODE))
    assert isinstance(directed.answers[0], Bid)

    await broker.nc.publish(subjects.RFB, b"\xc1 not msgpack")
    await broker.nc.publish(subjects.RFB, _enc.encode(Cancel(instance_id="x", node_id=NODE)))
    assert isinstance((await broker.rfb(req())).answers[0], Bid)  # still answering
    assert agent.malformed["rfb"] == 2

    agent.set_draining(True)
    assert (await broker.heartbeat(lambda hb: hb.draining)).node_id == NODE
    drained = (await broker.rfb(req())).answers[0]
    assert isinstance(drained, Decline) and drained.reason == Reason.DRAINING
    agent.set_draining(False)
    assert isinstance((await broker.rfb(req())).answers[0], Bid)


async def test_award_runs_the_command_with_its_environment(
        start: Start, broker: FakeBroker, tmp_path: Path, ports: tuple[int, int],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GAVEL_TEST_LEAK", "must not reach the child")
    agent = await start()
    out = tmp_path / "env.json"
    spec = Spec(name="web", ports=["http", "admin"], env={"MODE": "test"}, secrets=["TOKEN"],
                command=py(f"""
                    import json, os
                    seen = {{"env": dict(os.environ), "cwd": os.getcwd()}}
                    json.dump(seen, open({str(out)!r}, "w"))
                """))
    http, admin = ports[0] + 3, ports[0] + 4
    await broker.award("web-1", spec, ports={"http": http, "admin": admin}, attempt=2,
                       secret_env={"TOKEN": SECRET})
    provisioning = await broker.event("web-1")
    assert (provisioning.type, provisioning.node_id, provisioning.attempt) == (
        "provisioning", NODE, 2)
    running = await broker.event("web-1")
    assert running.type == "running" and running.detail.startswith("pid ")
    exited = await broker.event("web-1")
    assert (exited.type, exited.exit_code, exited.reason) == ("exited", 0, "")

    seen = json.loads(out.read_text())
    env = seen["env"]
    assert env["GAVEL_INSTANCE_ID"] == "web-1" and env["GAVEL_NODE_ID"] == NODE
    assert env["GAVEL_ATTEMPT"] == "2"
    assert env["GAVEL_PORT_HTTP"] == str(http) and env["GAVEL_PORT_ADMIN"] == str(admin)
    assert env["PORT"] == str(http)
    assert env["MODE"] == "test" and env["TOKEN"] == SECRET
    assert "GAVEL_TEST_LEAK" not in env and "PATH" in env
    assert Path(seen["cwd"]) == tmp_path / "worker" / "instances" / "web-1"

    state = (tmp_path / "worker" / "agent.json").read_text()
    assert SECRET not in state and "web-1/2" in state

    # The same award again (a broker retry) does not run the instance a second time.
    await broker.award("web-1", spec, ports={"http": http, "admin": admin}, attempt=2,
                       secret_env={"TOKEN": SECRET})
    await until(lambda: sum(agent.ignored.values()) == 1, what="duplicate award ignored")
    await broker.award("web-2", spec, node_id="n2")
    await until(lambda: agent.ignored["award for another node"] == 1, what="misdirected award")
    assert broker.events["web-1"].empty() and "web-2" not in broker.events


async def test_secret_never_in_state_file_while_running(
        start: Start, broker: FakeBroker, tmp_path: Path) -> None:
    await start()
    spec = Spec(name="s", secrets=["TOKEN"], command=py("import time; time.sleep(30)"))
    await broker.award("s-1", spec, secret_env={"TOKEN": SECRET})
    await broker.started("s-1")
    state = (tmp_path / "worker" / "agent.json").read_text()
    assert '"s-1"' in state and '"TOKEN"' in state and SECRET not in state
    await broker.cancel("s-1")
    assert (await broker.event("s-1")).type == "cancelled"


async def test_nonzero_exit_is_failed(start: Start, broker: FakeBroker) -> None:
    await start()  # no restart policy: the exit is the instance's end, where it ran
    await broker.award("bad", Spec(name="bad", command=py("raise SystemExit(3)"),
                                   restart=Restart(attempts=0)))
    await broker.started("bad")
    failed = await broker.event("bad")
    assert (failed.type, failed.reason, failed.exit_code) == (
        "failed", Reason.EXITED_NONZERO, 3)


async def test_missing_binary_is_a_driver_failure(start: Start, broker: FakeBroker) -> None:
    agent = await start()
    await broker.award("nope", Spec(name="nope", command=["/no/such/binary", "--flag"]))
    assert (await broker.event("nope")).type == "provisioning"
    failed = await broker.event("nope")
    assert (failed.type, failed.reason) == ("failed", Reason.DRIVER_FAILED)
    assert "No such file" in failed.detail and failed.exit_code is None
    assert agent.instances() == [] and agent.committed.cpu == 0


async def test_timeout_sigterm_then_sigkill(
        start: Start, broker: FakeBroker, tmp_path: Path) -> None:
    await start()
    ready, got_term = tmp_path / "ready", tmp_path / "got-term"
    spec = Spec(name="stubborn", timeout_s=0.5, command=py(f"""
        import signal, time, pathlib
        signal.signal(signal.SIGTERM, lambda *_: pathlib.Path({str(got_term)!r}).touch())
        pathlib.Path({str(ready)!r}).touch()
        while True:
            time.sleep(0.05)
    """))
    began = time.monotonic()
    await broker.award("slow", spec)
    pid = await broker.started("slow")
    failed = await broker.event("slow", timeout=TIMING.kill_grace_s + 5)
    took = time.monotonic() - began
    assert (failed.type, failed.reason) == ("failed", Reason.TIMEOUT)
    assert failed.exit_code == -signal.SIGKILL
    assert ready.exists() and got_term.exists()  # it was asked nicely first
    assert took >= TIMING.kill_grace_s  # ... and killed only after the grace period
    assert pid_gone(pid)


async def test_cancel(start: Start, broker: FakeBroker) -> None:
    agent = await start()
    await broker.award("c", Spec(name="c", cpu=1.5, command=py("import time; time.sleep(30)")))
    pid = await broker.started("c")
    assert agent.committed.cpu == 1.5
    await broker.cancel("c")
    cancelled = await broker.event("c")
    assert (cancelled.type, cancelled.reason) == ("cancelled", Reason.CANCELLED)
    assert cancelled.exit_code == -signal.SIGTERM
    assert pid_gone(pid) and agent.committed.cpu == 0

    await broker.cancel("never-here")  # confirmed, so the broker need not wait it out
    unknown = await broker.event("never-here")
    assert (unknown.type, unknown.detail) == ("cancelled", "not running on this node")


async def test_heartbeats_report_node_and_instances(
        start: Start, broker: FakeBroker, ports: tuple[int, int]) -> None:
    await start(labels={"zone": "a", "disk": "ssd"})
    first = await broker.heartbeat(lambda hb: True, timeout=2)
    assert (first.node_id, first.strategy, first.labels) == (
        NODE, "least-loaded", {"zone": "a", "disk": "ssd"})
    assert (first.capacity.cpu, first.capacity.memory_mb, first.capacity.ports) == (4.0, 4096, 10)
    assert first.port_range == list(ports) and first.instances == []
    assert first.stats.cpu_count >= 1 and first.stats.memory_total_mb > 0

    spec = Spec(name="svc", cpu=0.5, memory_mb=128, ports=["http"],
                command=py("import time; time.sleep(30)"))
    await broker.award("svc-1", spec)  # no ports from the broker: the worker picks them
    pid = await broker.started("svc-1")
    hb = await broker.heartbeat(lambda hb: bool(hb.instances), timeout=TIMING.heartbeat_s * 3)
    assert hb.seq > first.seq
    (inst,) = hb.instances
    assert (inst.instance_id, inst.state, inst.pid, inst.ports) == (
        "svc-1", "running", pid, {"http": ports[0]})
    assert (hb.committed.cpu, hb.committed.memory_mb, hb.committed.ports) == (0.5, 128, 1)


async def test_restart_readopts_running_children(
        start: Start, broker: FakeBroker, tmp_path: Path) -> None:
    first = await start()
    starts, release = tmp_path / "starts", tmp_path / "release"
    spec = Spec(name="keep", command=py(f"""
        import os, time
        with open({str(starts)!r}, "a") as f:
            f.write(f"{{os.getpid()}}\\n")
        while not os.path.exists({str(release)!r}):
            time.sleep(0.02)
    """))
    await broker.award("keep", spec)
    pid = await broker.started("keep")
    await broker.award("doomed", Spec(name="doomed", command=py("import time; time.sleep(30)")))
    doomed = await broker.started("doomed")

    await first.stop(kill_children=False)
    assert not pid_gone(pid) and not pid_gone(doomed)
    os.kill(doomed, signal.SIGKILL)  # dies while no worker watches it
    await until(lambda: pid_gone(doomed), what="doomed to die")

    broker.forget_heartbeats()
    second = await start()
    lost = await broker.event("doomed")
    assert (lost.type, lost.exit_code) == ("exited", None)
    assert lost.detail == "exit status unknown: process ended while the worker was down"
    hb = await broker.heartbeat(lambda hb: bool(hb.instances), timeout=TIMING.heartbeat_s * 3)
    assert [(i.instance_id, i.pid) for i in hb.instances] == [("keep", pid)]
    await broker.award("keep", spec)  # the broker re-sends: still held, not started again
    await until(lambda: second.ignored["award for an instance already held"] == 1,
                what="re-sent award ignored")

    release.touch()
    exited = await broker.event("keep")
    assert (exited.type, exited.exit_code) == ("exited", None)
    assert exited.detail == "exit status unknown: re-adopted process"
    assert starts.read_text().split() == [str(pid)]  # never a second copy
    assert second.instances() == []


async def test_stop_kills_children_by_default(start: Start, broker: FakeBroker) -> None:
    agent = await start()
    await broker.award("k", Spec(name="k", command=py("import time; time.sleep(30)")))
    pid = await broker.started("k")
    await agent.stop()
    ended = await broker.event("k")
    assert ended.type == "failed" and "worker shut down" in ended.detail
    assert pid_gone(pid)


async def test_keeps_working_across_a_nats_restart(
        start: Start, broker: FakeBroker, nats_server: NatsServer) -> None:
    await start()
    await broker.heartbeat(lambda hb: True)
    await asyncio.to_thread(nats_server.restart)
    await until(lambda: broker.nc.is_connected, timeout=10, what="test client reconnect")
    await broker.heartbeat(lambda hb: True, timeout=10)  # heartbeats resume at once
    reply = await broker.rfb(req())  # and the subscriptions came back
    assert isinstance(reply.answers[0], Bid)
