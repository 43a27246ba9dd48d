"""Several brokers against a real cluster, for the HA tests: three nats-servers on loopback
(routes between them, JetStream on, each with its own store, identities from `gavel auth
init` on every one), a bare git repository as the remote every broker pushes to, `gavel
broker --ha` child processes, and in-process workers - plus a witness credential (every
subject) to read what no gavel credential may: the KV buckets, every report and award.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import nats
import nats.errors
import nats.js.errors
import nkeys
import pygit2

from gavel.broker.ledger.repository import Ledger, State
from gavel.broker.ledger.takeover import epoch_of
from gavel.shared import subjects
from gavel.shared.api import NodesReply, NodesRequest, SubmitReply, SubmitRequest
from gavel.shared.messages import Award, Event, Spec
from gavel.shared.strategies import make_strategy
from gavel.transport import identity as auth
from gavel.transport.client import ClientError, call
from gavel.transport.creds import connect_options
from gavel.transport.natscluster import NatsCluster
from gavel.transport.natsserver import free_port
from gavel.worker.agent import Agent
from tests.integration.authed import _with_witness
from tests.integration.harness import TIMING, gavel_process, wait_for

__all__ = ["REF", "HaRig", "Placements", "Stream"]

REF = "refs/heads/main"
#: The lease in these tests: short, so a failover is seconds, yet renewed well inside it.
TTL_S, RENEW_S = 3.0, 0.5
SPEC = Spec(name="s", command=["sleep", "600"], cpu=0.05, memory_mb=8)


@dataclass
class BrokerProc:
    broker_id: str
    proc: subprocess.Popen[bytes]
    metrics_port: int
    log: Path

    def metrics(self) -> dict[str, float]:
        """The broker's gauges and counters, by name with labels (`name{labels}`)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=3) as resp:
            text = resp.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out


@dataclass
class HaRig:
    root: Path
    nodes: list[str] = field(default_factory=lambda: ["w1", "w2", "w3"])

    def __post_init__(self) -> None:
        self.ids = auth.init(self.root, self.nodes)
        self.witness_seed = self.root / "witness.nk"
        self.witness_seed.write_text(
            nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER).decode())
        extra = _with_witness(self.ids.config, self.witness_seed).read_text()
        self.cluster = NatsCluster(self.root / "nats", 3, extra=extra)
        self.remote = self.root / "remote.git"
        repo = pygit2.init_repository(str(self.remote), bare=True, initial_head="main")
        repo.config["receive.denyNonFastForwards"] = True
        self.brokers: dict[str, BrokerProc] = {}
        self.agents: dict[str, Agent] = {}
        self._agent_tasks: list[asyncio.Task[None]] = []
        self.conns: list[Any] = []

    async def start(self, brokers: int = 3) -> HaRig:
        self.cluster.start()
        for k in range(1, brokers + 1):
            self.start_broker(f"b{k}")
        for node in self.nodes:
            self.start_agent(node)
        return self

    def start_broker(self, broker_id: str) -> BrokerProc:
        port = free_port()
        log = self.root / f"{broker_id}.log"
        proc = gavel_process(
            ["broker", "--state", str(self.root / broker_id), "--push", str(self.remote),
             "--nats", self.cluster.url, "--creds", str(self.ids.broker), "--ha",
             "--broker-id", broker_id, "--lease-ttl-s", str(TTL_S), "--lease-renew-s",
             str(RENEW_S), "--ha-replicas", "3", "--metrics-port", str(port)], log)
        self.brokers[broker_id] = BrokerProc(broker_id, proc, port, log)
        return self.brokers[broker_id]

    def start_agent(self, node: str) -> Agent:
        agent = Agent(nats_url=self.cluster.url, node_id=node,
                      strategy=make_strategy("least-loaded"), labels={},
                      state_dir=self.root / "workers" / node, timing=TIMING, cpu=8.0,
                      memory_mb=8192, nats_options=connect_options(str(self.ids.nodes[node])))
        self.agents[node] = agent
        self._agent_tasks.append(asyncio.create_task(agent.run()))
        return agent

    async def connect(self, seed: Path, **kw: Any) -> Any:
        nc = await nats.connect(self.cluster.urls, nkeys_seed=str(seed),
                                max_reconnect_attempts=-1, reconnect_time_wait=0.2, **kw)
        self.conns.append(nc)
        return nc

    async def operator(self) -> Any:
        return await self.connect(self.ids.operator)

    async def witness(self) -> Any:
        return await self.connect(self.witness_seed)

    async def leader(self, nc: Any) -> NodesReply | None:
        try:
            return await call(nc, "nodes", NodesRequest(), NodesReply, timeout=2)
        except ClientError:
            return None

    async def wait_leader(self, nc: Any, healthy: int = 0, not_: str = "",
                          timeout: float = 60) -> NodesReply:
        """Until a broker other than `not_` answers as leader, seeing `healthy` nodes."""
        got: list[NodesReply] = []

        async def ready() -> bool:
            reply = await self.leader(nc)
            if reply is None or not reply.leader or reply.leader == not_:
                return False
            got[:] = [reply]
            return sum(n.health == "healthy" for n in reply.nodes) >= healthy

        await wait_for(ready, timeout, every=0.2, what=f"a leader other than {not_!r}")
        return got[0]

    def signal(self, broker_id: str, sig: int) -> None:
        """`sig` to the broker's whole process group (its writer too: one host)."""
        os.killpg(self.brokers[broker_id].proc.pid, sig)

    def remote_state(self) -> State:
        return Ledger(self.remote, REF).state()

    def remote_history(self) -> list[pygit2.Commit]:
        repo = pygit2.Repository(str(self.remote))
        ref = repo.references.get(REF)
        return [] if ref is None else list(repo.walk(ref.target))

    def remote_epoch(self) -> int:
        repo = pygit2.Repository(str(self.remote))
        return epoch_of(repo, str(repo.references[REF].target))

    async def close(self) -> None:
        for agent in self.agents.values():
            with contextlib.suppress(Exception):
                await agent.stop()
        for task in self._agent_tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 15)
        for b in self.brokers.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(b.proc.pid, signal.SIGCONT)
                b.proc.terminate()
        for b in self.brokers.values():
            try:
                b.proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(b.proc.pid, signal.SIGKILL)
                b.proc.wait()
        for nc in self.conns:
            with contextlib.suppress(Exception):
                await nc.close()
        self.cluster.stop()


class Stream:
    """Submissions one after another, each with its own key, asked again with that key until
    answered: what a careful client does through a failover."""

    def __init__(self, nc: Any, prefix: str, pause_s: float = 0.05) -> None:
        self.nc = nc
        self.prefix = prefix
        self.pause_s = pause_s
        self.answered: dict[str, str] = {}
        self.retries = 0
        self.refused: list[str] = []
        self._stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def start(self, count: int) -> Stream:
        self.task = asyncio.create_task(self._run(count))
        return self

    async def _run(self, count: int) -> None:
        for k in range(count):
            if self._stop.is_set():
                return
            iid = f"{self.prefix}-{k:04d}"
            req = SubmitRequest(spec=SPEC, instance_id=iid, key=f"key-{iid}")
            while True:
                try:
                    reply = await call(self.nc, "submit", req, SubmitReply, timeout=3)
                except ClientError as exc:
                    if "already" in str(exc) or "key" in str(exc):
                        self.refused.append(f"{iid}: {exc}")
                        break
                    self.retries += 1
                    await asyncio.sleep(0.2)
                    continue
                self.answered[iid] = reply.instance_id
                break
            await asyncio.sleep(self.pause_s)

    async def stop(self) -> None:
        """No new submission after the one under way (answered before this returns)."""
        self._stop.set()
        await self.finish()

    async def finish(self) -> None:
        """Until every one of the `count` submissions is answered."""
        if self.task is not None:
            await asyncio.wait_for(self.task, 120)


class Placements:
    """Watches the remote's branch: when each commit that places something first appears."""

    def __init__(self, rig: HaRig) -> None:
        self.rig = rig
        self.seen: list[tuple[float, str, str]] = []  # (when, sha, first line)
        self._known: set[str] = set()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            now = time.monotonic()
            for c in self.rig.remote_history():
                sha = str(c.id)
                if sha in self._known:
                    break
                self._known.add(sha)
                if any(line.startswith("place ") for line in c.message.splitlines()):
                    self.seen.append((now, sha, c.message.splitlines()[0]))
            await asyncio.sleep(0.05)

    def first_after(self, t: float) -> float | None:
        later = [when for when, _, _ in self.seen if when > t]
        return min(later) if later else None

    def stop(self) -> None:
        self.task.cancel()


class Heard:
    """What the witness heard nodes told and report: awards (their epoch and commit) and
    the provisioning reports, whose detail names the commit of the award they act on."""

    def __init__(self) -> None:
        self.awards: list[Award] = []
        self.provisioning: list[tuple[str, str, str]] = []  # (node, instance, commit)

    async def start(self, nc: Any) -> Heard:
        award_dec = msgspec.msgpack.Decoder(Award)
        event_dec = msgspec.msgpack.Decoder(Event)

        async def on_award(msg: Any) -> None:
            self.awards.append(award_dec.decode(msg.data))

        async def on_report(msg: Any) -> None:
            ev = event_dec.decode(msg.data)
            if ev.type == "provisioning" and ev.detail.startswith("commit "):
                self.provisioning.append((ev.node_id, ev.instance_id, ev.detail.split()[1]))

        await nc.subscribe(subjects.AWARD.format(node="*"), cb=on_award)
        await nc.subscribe(subjects.REPORT_ALL, cb=on_report)
        return self


def check_once(rig: HaRig, submitted: dict[str, str]) -> State:
    """0 lost, 0 duplicated, from the remote: every submitted id exactly once, with its own
    key, in exactly one node.json; nothing else placed."""
    st = rig.remote_state()
    extra, missing = sorted(set(st.instances) - set(submitted)), \
        sorted(set(submitted) - set(st.instances))
    assert not extra and not missing, {"extra": extra, "missing": missing}
    for iid in submitted:
        assert st.instances[iid].key == f"key-{iid}"
        holders = [n for n, nf in st.nodes.items() if iid in nf.instances]
        assert len(holders) == 1, (iid, holders)
    for key in (f"key-{iid}" for iid in submitted):
        assert len(st.submitted(key)) == 1, key
    return st


async def kv_epochs(nc: Any, nodes: list[str], timeout: float = 60) -> dict[str, int]:
    """The epoch each node's KV entry carries, for the nodes that have one (the witness may
    read the bucket). Right after a heal JetStream may answer 503 (temporarily unavailable),
    or not at all, while its streams elect leaders: asked again until it answers, as an
    operator would."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await _kv_epochs(nc, nodes)
        except (nats.js.errors.ServiceUnavailableError, nats.errors.TimeoutError):
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.5)


async def _kv_epochs(nc: Any, nodes: list[str]) -> dict[str, int]:
    kv = await nc.jetstream().key_value(subjects.NODES_BUCKET)
    out = {}
    for node in nodes:
        try:
            entry = await kv.get(node)
        except nats.js.errors.KeyNotFoundError:
            continue  # a node that never held anything
        out[node] = int(json.loads(entry.value or b"{}").get("epoch", 0))
    return out
