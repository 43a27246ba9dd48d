"""Real pieces wired together for integration tests: a broker and agents in this process,
each with its own NATS connection to the real nats-server fixture, or `gavel` child
processes where a test needs to kill one."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import nats

from gavel.broker.ledger.repository import Ledger
from gavel.broker.metrics import Metrics
from gavel.broker.service import Broker, Config, MakePusher
from gavel.shared.api import StatusReply, StatusRequest, SubmitReply, SubmitRequest
from gavel.shared.messages import Message, Spec
from gavel.shared.strategies import make_strategy
from gavel.shared.timing import Timing
from gavel.transport.client import call
from gavel.worker.agent import Agent
from gavel.worker.ports import bindable

T = TypeVar("T", bound=Message)
TIMING = Timing.from_env(os.environ)


async def wait_for(pred: Callable[[], Awaitable[bool] | bool], timeout: float = 30.0,
                   every: float = 0.05, what: str = "condition") -> None:
    """Until `pred` holds, asked every `every` s and once more at the deadline. The default
    budget is a loaded machine's, not an idle one's: a wait ends as soon as its condition
    holds, so only a failure spends it all."""
    deadline = time.monotonic() + timeout
    while True:
        last = time.monotonic() >= deadline
        result = pred()
        if asyncio.iscoroutine(result) or isinstance(result, Awaitable):
            result = await result
        if result:
            return
        if last:
            break
        await asyncio.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass(frozen=True)
class UpDemo:
    """One finished `gavel up --demo --workers 2` (auth and gateway on, the defaults): what
    it printed and the state directory it left (the `up_demo` fixture)."""

    proc: subprocess.CompletedProcess[str]
    state: Path


class Cluster:
    def __init__(self, nats_url: str, root: Path) -> None:
        self.url = nats_url
        self.root = root
        self.state = root / "state"
        self.broker: Broker | None = None
        self.broker_task: asyncio.Task[None] | None = None
        self.agents: dict[str, Agent] = {}
        self.agent_tasks: dict[str, asyncio.Task[None]] = {}
        self.nc: Any = None

    async def start_broker(self, ref: str = "refs/heads/main",
                           secrets: dict[str, str] | None = None,
                           timing: Timing = TIMING, metrics: Metrics | None = None,
                           pusher: MakePusher | None = None, **kw: Any) -> Broker:
        self.broker = Broker(Config(nats_url=self.url, state_dir=self.state, ref=ref,
                                    timing=timing, secrets=secrets or {}, **kw),
                             metrics=metrics, pusher=pusher)
        await self.broker.start()
        return self.broker

    async def stop_broker(self) -> None:
        if self.broker is not None:
            await self.broker.close()
            self.broker = None

    async def start_agent(self, node_id: str, strategy: str = "least-loaded",
                          labels: dict[str, str] | None = None, cpu: float = 4.0,
                          memory_mb: int = 4096, **kw: Any) -> Agent:
        agent = Agent(nats_url=self.url, node_id=node_id, strategy=make_strategy(strategy),
                      labels=labels or {}, state_dir=self.root / "workers" / node_id,
                      timing=TIMING, cpu=cpu, memory_mb=memory_mb, **kw)
        self.agents[node_id] = agent
        self.agent_tasks[node_id] = asyncio.create_task(agent.run())
        return agent

    async def stop_agent(self, node_id: str, **kw: Any) -> None:
        agent = self.agents.pop(node_id)
        await agent.stop(**kw)
        task = self.agent_tasks.pop(node_id)
        await asyncio.wait_for(task, 10)

    async def client(self) -> Any:
        if self.nc is None:
            self.nc = await nats.connect(self.url)
        return self.nc

    async def call(self, verb: str, req: Message, reply: type[T]) -> T:
        return await call(await self.client(), verb, req, reply)

    async def submit(self, spec: Spec, instance_id: str = "") -> str:
        r = await self.call("submit", SubmitRequest(spec=spec, instance_id=instance_id),
                            SubmitReply)
        return r.instance_id

    async def status(self, iid: str) -> Any:
        r = await self.call("status", StatusRequest(instance_id=iid), StatusReply)
        return r.instances[0]

    async def wait_nodes(self, n: int, timeout: float = 10.0) -> None:
        def ready() -> bool:
            b = self.broker
            return b is not None and len(b.liveness.eligible(b.now())) >= n
        await wait_for(ready, timeout, what=f"{n} healthy nodes")

    def ledger(self) -> Ledger:
        return Ledger(self.state / "state.git")

    def holders(self, iid: str) -> list[str]:
        """Every node whose node.json holds the instance, read fresh from git."""
        st = self.ledger().state()
        return sorted(n for n, nf in st.nodes.items() if iid in nf.instances)

    async def close(self) -> None:
        for node in list(self.agents):
            with contextlib.suppress(Exception):
                await self.stop_agent(node)
        await self.stop_broker()
        if self.nc is not None:
            await self.nc.close()


def gavel_process(args: list[str], log: Path, env: dict[str, str] | None = None
                  ) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "gavel", *args],
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})},
                            start_new_session=True)


def writer_spec(name: str, out: Path, **kw: Any) -> Spec:
    """A spec whose process writes its instance id, node and ports into `out`/<instance>."""
    code = (f"import os, json, pathlib; d = pathlib.Path({str(out)!r}); d.mkdir(exist_ok=True); "
            "(d / os.environ['GAVEL_INSTANCE_ID']).write_text(json.dumps("
            "{k: v for k, v in os.environ.items() if k.startswith(('GAVEL_', 'PORT', 'SECRET'))}))")
    return Spec(name=name, command=[sys.executable, "-c", code], **kw)


def sleeper_spec(name: str, seconds: float = 60.0, **kw: Any) -> Spec:
    return Spec(name=name, command=[sys.executable, "-c", f"import time; time.sleep({seconds})"],
                **kw)


class FakeNode:
    """A node speaking the wire protocol by hand: it heartbeats, bids a fixed load and does
    only what a test tells it — to play a node that accepts nothing, goes quiet, or lies."""

    def __init__(self, url: str, node_id: str, load: float = 0.0, cpu: float = 64.0) -> None:
        import msgspec as _m

        self.url, self.node_id, self.load, self.cpu = url, node_id, load, cpu
        self.enc = _m.msgpack.Encoder()
        self.heartbeating = True
        self.bidding = True
        self.confirm = False  # report provisioning+running for every award
        self.advertise = ""  # the address its heartbeats advertise
        self.awards: list[Any] = []
        self.listed: list[str] = []
        self.nc: Any = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> FakeNode:
        import msgspec as _m

        from gavel.shared import subjects as s
        from gavel.shared.messages import RFB, Award, Bid, BidReply, Event

        self.nc = await nats.connect(self.url)

        async def on_rfb(msg: Any) -> None:
            if not self.bidding:
                return
            rfb = _m.msgpack.decode(msg.data, type=RFB)
            answers: list[Any] = [Bid(shape=i, load=self.load, strategy="fake")
                                  for i in range(len(rfb.shapes))]
            await self.nc.publish(s.BIDS.format(node=self.node_id), self.enc.encode(
                BidReply(auction_id=rfb.auction_id, node_id=self.node_id, answers=answers)))

        async def on_award(msg: Any) -> None:
            award = _m.msgpack.decode(msg.data, type=Award)
            self.awards.append(award)
            if self.confirm:
                self.listed.append(award.instance_id)
                for t in ("provisioning", "running"):
                    await self.nc.publish(s.REPORT.format(node=self.node_id), self.enc.encode(
                        Event(instance_id=award.instance_id, type=t, node_id=self.node_id,
                              attempt=award.attempt)))

        await self.nc.subscribe(s.RFB, cb=on_rfb)
        await self.nc.subscribe(s.AWARD.format(node=self.node_id), cb=on_award)
        self._task = asyncio.create_task(self._beat())
        return self

    async def _beat(self) -> None:
        from gavel.shared import subjects as s
        from gavel.shared.messages import Capacity, Heartbeat, InstanceReport

        while True:
            if self.heartbeating:
                hb = Heartbeat(node_id=self.node_id, strategy="fake",
                               capacity=Capacity(cpu=self.cpu, memory_mb=65536, ports=100),
                               port_range=[31000, 31099], advertise=self.advertise,
                               instances=[InstanceReport(instance_id=i, state="running")
                                          for i in self.listed])
                await self.nc.publish(s.HEARTBEAT.format(node=self.node_id),
                                      self.enc.encode(hb))
            await asyncio.sleep(TIMING.heartbeat_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self.nc is not None:
            await self.nc.close()


class Daemons:
    """`gavel broker` and `gavel worker` as child processes on one state directory, each
    with its log in `root` and, if `creds` names them, its own credential - for the tests
    that kill, pause or flood a real process."""

    def __init__(self, url: str, root: Path, creds: dict[str, Path] | None = None) -> None:
        self.url, self.root, self.creds = url, root, creds or {}
        self.state = root / "state"
        self.brokers: list[subprocess.Popen[bytes]] = []
        self.workers: dict[str, subprocess.Popen[bytes]] = {}

    def _creds(self, who: str) -> list[str]:
        return ["--creds", str(self.creds[who])] if who in self.creds else []

    def broker(self) -> subprocess.Popen[bytes]:
        proc = gavel_process(["broker", "--state", str(self.state), *self._creds("broker")],
                             self.root / "broker.log", env={"GAVEL_NATS_URL": self.url})
        self.brokers.append(proc)
        return proc

    def worker(self, node: str, *, labels: str = "", cpu: float = 4.0,
               ports: str = "") -> subprocess.Popen[bytes]:
        n = len(self.workers)
        args = ["worker", "--node-id", node, "--state", str(self.root / "workers" / node),
                "--cpu", str(cpu), "--memory-mb", "4096",
                "--ports", ports or f"{24000 + 100 * n}-{24000 + 100 * n + 99}",
                *self._creds(node)]
        if labels:
            args += ["--labels", labels]
        proc = gavel_process(args, self.root / f"{node}.log", env={"GAVEL_NATS_URL": self.url})
        self.workers[node] = proc
        return proc

    @staticmethod
    def kill(proc: subprocess.Popen[bytes], children: bool = False) -> None:
        """SIGKILL, with every process it started if `children` (instances run in sessions
        of their own, so they outlive their worker otherwise)."""
        import psutil

        kids = []
        if children:
            with contextlib.suppress(psutil.Error):
                kids = psutil.Process(proc.pid).children(recursive=True)
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        for kid in kids:
            with contextlib.suppress(psutil.Error):
                kid.kill()

    def close(self) -> None:
        for proc in [*self.workers.values(), *self.brokers]:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)  # a paused one must hear the TERM
                proc.terminate()
        for proc in [*self.workers.values(), *self.brokers]:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill(proc, children=True)


async def healthy_nodes(nc: Any) -> set[str]:
    """The nodes the broker answering `nc`'s API counts healthy (empty: no answer)."""
    from gavel.shared.api import NodesReply, NodesRequest
    from gavel.transport.client import ClientError

    try:
        reply = await call(nc, "nodes", NodesRequest(), NodesReply, timeout=2.0)
    except ClientError:
        return set()
    return {n.node_id for n in reply.nodes if n.health == "healthy"}


#: The ports `free_range` handed out to the test processes running now: a file a port,
#: naming the process that holds it.
PORT_CLAIMS = Path(tempfile.gettempdir()) / "gavel-test-ports"


def free_range(start: int, size: int = 40) -> tuple[int, int]:
    """The first `size` consecutive ports from `start` that bind now and no other test
    process has claimed, in steps of `size`, claimed for this one until `release_ports` (the
    integration tests' conftest, after each test). A port that binds now can be an
    instance's a moment later: tests of other files run beside this one (xdist) and name
    the same starts."""
    first = start
    while not (all(bindable(p) for p in range(first, first + size))
               and _claim(range(first, first + size))):
        first += size
    return first, first + size - 1


def release_ports() -> None:
    """This process's claims (`free_range`) let go."""
    me = str(os.getpid())
    for path in PORT_CLAIMS.glob("*"):
        if _holder(path) == me:
            path.unlink(missing_ok=True)


def _claim(ports: range) -> bool:
    """Every port of `ports` claimed for this process, or none claimed anew (another live
    process holds one)."""
    PORT_CLAIMS.mkdir(exist_ok=True)
    made: list[Path] = []
    for port in ports:
        path = PORT_CLAIMS / str(port)
        got = _claim_port(path)
        if got is None:
            for claimed in made:
                claimed.unlink(missing_ok=True)
            return False
        if got:
            made.append(path)
    return True


def _claim_port(path: Path) -> bool | None:
    """True: claimed now; False: this process held it already; None: another live process
    holds it. A dead process's claim is taken over."""
    me = str(os.getpid())
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _holder(path)
            if holder == me:
                return False
            if holder is None or _alive(int(holder)):
                return None
            path.unlink(missing_ok=True)  # its process is gone: try again
            continue
        with os.fdopen(fd, "w") as out:
            out.write(me)
        return True
    return None


def _holder(path: Path) -> str | None:
    """The pid a claim names (None: unreadable, or still being written: held)."""
    try:
        pid = path.read_text()
    except OSError:
        return None
    return pid if pid.isdecimal() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        pass
    return True
