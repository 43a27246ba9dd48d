"""A real network partition: three hosts, each a network namespace holding one nats-server
and the broker beside it (connected to that server alone), joined by veth pairs to a bridge
in the root namespace, where the workers and the test's clients live and reach all three
servers. The routes between the servers run over the hosts' addresses.

The leader's host is cut off (its link brought down) while submissions stream in, then
healed. What must hold:
1. The isolated leader stops leading: its server is a minority, so no renewal of the R3
   lease lands, and by its own clock the lease runs out. Nothing it committed after that
   lands on the remote (the remote is a path every host reaches: only fencing keeps it out),
   and no worker acts on anything the remote does not hold.
2. A broker on the majority side takes over, and placements go on.
3. Healed, the old leader follows the lease again (stands by under the new leader, or leads
   a leadership it won afresh after the heal, never its old one); every instance submitted
   before, during and after is placed exactly once, on the remote and on the workers; the
   KV mirror is the one the remote's head leadership put.

Times are printed (takeover), never asserted. Skips, saying why, where namespaces cannot be
made (not root, no iproute2).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
import nats
import pygit2
import pytest

from gavel.broker.ledger.takeover import epoch_of
from gavel.shared.strategies import make_strategy
from gavel.transport.creds import connect_options
from gavel.transport.natsserver import find_binary
from gavel.worker.agent import Agent
from tests.integration.ha_rig import (
    RENEW_S,
    SPEC,
    TTL_S,
    BrokerProc,
    HaRig,
    Heard,
    Placements,
    Stream,
    check_once,
    kv_epochs,
)
from tests.integration.harness import TIMING, wait_for
from tests.integration.netns import Hosts, unavailable

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

_WHY = unavailable()
if _WHY:
    pytestmark.append(pytest.mark.skip(reason=f"no network partition here: {_WHY}"))

CLIENT_PORT, ROUTE_PORT, METRICS_PORT = 4222, 6222, 9464
#: The test's own clients notice a dead server within seconds (nats-py's default: minutes).
QUICK = {"ping_interval": 1, "max_outstanding_pings": 2}


class HostServer:
    """One nats-server inside host k, listening on every address of its namespace."""

    def __init__(self, hosts: Hosts, k: int, root: Path, name: str, extra: str) -> None:
        self.hosts, self.k, self.root = hosts, k, root
        self.store = root / "jetstream"
        self.store.mkdir(parents=True, exist_ok=True)
        self.log = root / "nats.log"
        routes = ", ".join(f'"nats-route://{hosts.addr(j)}:{ROUTE_PORT}"'
                           for j in range(1, hosts.count + 1))
        self.config = root / "nats.conf"
        self.config.write_text(
            f'server_name: "{name}-{k}"\ncluster {{\n  name: "{name}"\n'
            f'  listen: "0.0.0.0:{ROUTE_PORT}"\n  routes: [{routes}]\n}}\n{extra}\n')
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.hosts.addr(self.k)}:{CLIENT_PORT}"

    def start(self, timeout: float = 20.0) -> None:
        ports = Path(tempfile.mkdtemp(prefix="gavel-ns-ports-"))
        argv = [find_binary(), "-a", "0.0.0.0", "-p", str(CLIENT_PORT), "-js", "-sd",
                str(self.store), "--ports_file_dir", str(ports), "-c", str(self.config)]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.hosts.command(self.k, argv), stdout=out,
                                         stderr=out, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        try:
            deadline = time.monotonic() + timeout
            while not any(ports.glob(f"*_{self.proc.pid}.ports")):
                assert self.proc.poll() is None, self.log.read_text()[-2000:]
                assert time.monotonic() < deadline, f"nats-server in host {self.k} is not up"
                time.sleep(0.05)
        finally:
            shutil.rmtree(ports, ignore_errors=True)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class HostCluster:
    """What `HaRig` uses of a `NatsCluster`, over the hosts' addresses."""

    def __init__(self, hosts: Hosts, root: Path, extra: str, name: str = "gavel") -> None:
        self.name = name
        self.servers = [HostServer(hosts, k, root / f"n{k}", name, extra)
                        for k in range(1, hosts.count + 1)]

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    @property
    def url(self) -> str:
        return ",".join(self.urls)

    def start(self) -> None:
        for server in self.servers:
            server.start()

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


class PartitionRig(HaRig):
    """`HaRig` with broker bK and server K inside host K."""

    hosts: Hosts

    def place(self, hosts: Hosts) -> None:
        self.hosts = hosts
        self.cluster = HostCluster(hosts, self.root / "nats-hosts", self.cluster.extra)  # type: ignore[assignment]

    def host_of(self, broker_id: str) -> int:
        return int(broker_id.removeprefix("b"))

    def start_broker(self, broker_id: str) -> BrokerProc:
        k = self.host_of(broker_id)
        log = self.root / f"{broker_id}.log"
        argv = [sys.executable, "-m", "gavel", "broker", "--state", str(self.root / broker_id),
                "--push", str(self.remote), "--nats", f"nats://127.0.0.1:{CLIENT_PORT}",
                "--creds", str(self.ids.broker), "--ha", "--broker-id", broker_id,
                "--lease-ttl-s", str(TTL_S), "--lease-renew-s", str(RENEW_S),
                "--ha-replicas", "3", "--metrics-port", str(METRICS_PORT)]
        with open(log, "ab") as out:
            proc = subprocess.Popen(self.hosts.command(k, argv), stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=dict(os.environ), start_new_session=True)
        self.brokers[broker_id] = BrokerProc(broker_id, proc, METRICS_PORT, log)
        return self.brokers[broker_id]

    def metrics(self, broker_id: str) -> dict[str, float]:
        """A broker's metrics, read from inside its host (reachable while it is cut off)."""
        code = ("import urllib.request, sys; sys.stdout.write(urllib.request.urlopen("
                f"'http://127.0.0.1:{METRICS_PORT}/metrics', timeout=3).read().decode())")
        out = subprocess.run(self.hosts.command(self.host_of(broker_id),
                                                [sys.executable, "-c", code]),
                             capture_output=True, text=True, timeout=30)
        got: dict[str, float] = {}
        for line in out.stdout.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                got[name] = float(value)
        return got

    def start_agent_on(self, node: str, k: int) -> Agent:
        """A worker in the root namespace given every server, host k's listed first and the
        list kept in order: it starts out attached to that server."""
        urls = [self.cluster.urls[k - 1], *(u for u in self.cluster.urls
                                            if u != self.cluster.urls[k - 1])]
        agent = Agent(nats_url=",".join(urls), node_id=node,
                      strategy=make_strategy("least-loaded"), labels={},
                      state_dir=self.root / "workers" / node, timing=TIMING, cpu=8.0,
                      memory_mb=8192, nats_options={
                          **connect_options(str(self.ids.nodes[node])), "dont_randomize": True})
        self.agents[node] = agent
        self._agent_tasks.append(asyncio.create_task(agent.run()))
        return agent

    def attached(self, node: str) -> int:
        """The host whose server the worker is connected to now (0: none)."""
        nc = self.agents[node]._nc
        url = nc.connected_url if nc is not None and nc.is_connected else None
        if url is None:
            return 0
        hosts = [self.hosts.addr(j) for j in range(1, self.hosts.count + 1)]
        return hosts.index(url.hostname) + 1 if url.hostname in hosts else 0

    def submit_inside(self, k: int, iid: str) -> str:
        """`gavel submit` run inside host k, against its own server: what a client on that
        side of a partition gets (its output, or why it gave up)."""
        spec = self.root / "spec.json"
        spec.write_bytes(msgspec.json.encode(SPEC))
        argv = [sys.executable, "-m", "gavel", "submit", str(spec), "--id", iid, "--key",
                f"key-{iid}", "--nats", f"nats://127.0.0.1:{CLIENT_PORT}", "--creds",
                str(self.ids.operator)]
        try:
            out = subprocess.run(self.hosts.command(k, argv), capture_output=True, text=True,
                                 timeout=20)
        except subprocess.TimeoutExpired:
            return "no answer within 20s"
        return (out.stdout + out.stderr).strip().splitlines()[-1] if out.stdout + out.stderr \
            else f"exit {out.returncode}"

    async def connect(self, seed: Path, **kw: Any) -> Any:
        return await super().connect(seed, **{**QUICK, **kw})

    async def pinned(self, seed: Path, k: int) -> Any:
        """A connection to server k alone: a witness of what is said on that side."""
        nc = await nats.connect([self.cluster.urls[k - 1]], nkeys_seed=str(seed),
                                max_reconnect_attempts=-1, reconnect_time_wait=0.2,
                                dont_randomize=True, **QUICK)
        self.conns.append(nc)
        return nc


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[PartitionRig]:
    hosts = Hosts(3)
    r = PartitionRig(tmp_path)
    try:
        hosts.open()
        r.place(hosts)
        yield r
    finally:
        try:
            await r.close()
        finally:
            hosts.close()


def _placed_all(rig: HaRig, ids: dict[str, str]) -> bool:
    st = rig.remote_state()
    return all(iid in st.where for iid in ids)


def _local_only(rig: HaRig, broker_id: str) -> int:
    """How many commits the broker's own copy holds that the remote never got."""
    remote = {str(c.id) for c in rig.remote_history()}
    repo = pygit2.Repository(str(rig.root / broker_id / "state.git"))
    ref = repo.references.get("refs/heads/main")
    if ref is None:
        return 0
    return sum(1 for c in repo.walk(ref.target) if str(c.id) not in remote)


def _first_of_epoch(rig: HaRig, placements: Placements, after: float, epoch: int
                    ) -> float | None:
    """When the first placement of leadership `epoch` after `after` reached the remote."""
    repo = pygit2.Repository(str(rig.remote))
    return min((when for when, sha, _ in list(placements.seen)
                if when > after and epoch_of(repo, sha) == epoch), default=None)


def _logged(log: str, words: str) -> float:
    """The wall-clock time of the last log line holding `words` (the broker's local time)."""
    line = [line for line in log.splitlines() if words in line][-1]
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


async def test_a_leader_cut_off_from_the_majority_stops_and_a_standby_takes_over(
        rig: PartitionRig) -> None:
    rig.cluster.start()
    for j in (1, 2, 3):
        rig.start_broker(f"b{j}")
    op = await rig.operator()
    first = await rig.wait_leader(op, timeout=90)
    isolated = first.leader
    k = rig.host_of(isolated)
    # w1 starts out on the leader's server (the one to be cut off), the others anywhere.
    rig.start_agent_on("w1", k)
    for node in ("w2", "w3"):
        rig.start_agent(node)
    await wait_for(lambda: rig.attached("w1") == k, 60, what="w1 on the leader's server")
    first = await rig.wait_leader(op, healthy=3, timeout=90)
    assert first.leader == isolated
    heard = Heard()
    for j in (1, 2, 3):  # one witness per server: what each side says, in or out of reach
        await heard.start(await rig.pinned(rig.witness_seed, j))
    placements = Placements(rig)
    before = Stream(op, "np", pause_s=0.05).start(90)
    await wait_for(lambda: len(before.answered) >= 20, 60, what="submissions flowing")

    cut_at, cut_wall = time.monotonic(), time.time()
    rig.hosts.cut(k)
    # A client on the minority side asks the isolated leader (while it still believes it
    # leads, and after): whatever it was told must end on the remote exactly once.
    inside = asyncio.gather(*(asyncio.to_thread(rig.submit_inside, k, f"iso-{n:04d}")
                              for n in range(3)))

    def stopped() -> bool:
        return rig.metrics(isolated).get("gavel_broker_leading") == 0.0
    await wait_for(stopped, 60, every=0.3, what="the isolated leader to stop leading")
    second = await rig.wait_leader(op, not_=isolated, timeout=90)
    assert second.epoch > first.epoch
    await wait_for(lambda: _first_of_epoch(rig, placements, cut_at, second.epoch) is not None,
                   60, what="a placement by the majority's leader")
    took = _first_of_epoch(rig, placements, cut_at, second.epoch)
    assert took is not None
    # The worker cut off with its server finds the rest of the cluster, and is heard there.
    await wait_for(lambda: rig.attached("w1") not in (0, k), 60,
                   what="w1 to leave the cut-off server for the majority's")
    await rig.wait_leader(op, not_=isolated, healthy=3, timeout=60)
    # Work submitted now, the majority settled and the partition still there, is answered:
    # a stream of its own (the first one's submissions may all be answered by now: on a
    # loaded machine the waits above outlast it).
    during = Stream(op, "dp", pause_s=0.05).start(15)
    await wait_for(lambda: len(during.answered) >= 15, 90,
                   what="submissions placed while the partition lasts")
    told_inside = await inside

    healed_at = time.monotonic()
    rig.hosts.heal(k)

    def rejoined() -> bool:
        """The healed old leader follows the lease again: it names a leadership at least as
        new as the majority's and stands by under it - or leads one it won afresh, of a
        higher epoch (the heal may cost the lease stream its quorum for longer than a TTL,
        and then whoever takes the lease leads, the old leader too). Never its old one."""
        m = rig.metrics(isolated)
        epoch = m.get("gavel_broker_leader_epoch", 0.0)
        named = [name for name, v in m.items()
                 if name.startswith("gavel_broker_leader{") and v == 1.0]
        itself = f'gavel_broker_leader{{leader="{isolated}"}}'
        if m.get("gavel_broker_leading") == 1.0:
            return epoch > second.epoch and named == [itself]
        return m.get("gavel_broker_leading") == 0.0 and epoch >= second.epoch and \
            len(named) == 1 and named != [itself]
    await wait_for(rejoined, 90, every=0.5, what="the old leader to follow the lease, healed")
    # The minority's client asks again with the same keys, now through the majority: all
    # three (one the isolated leader pushed before its lease ran out is on the remote).
    again = Stream(op, "iso", pause_s=0.05).start(3)
    # And new work after the heal (the first stream may have ended before it, and all three
    # minority keys may already be on the remote: then nothing else would be placed).
    after = Stream(op, "ah", pause_s=0.05).start(5)
    await before.stop()
    await again.finish()
    await after.finish()
    assert not (before.refused or during.refused or again.refused or after.refused), \
        (before.refused, during.refused, again.refused, after.refused)
    assert sorted(again.answered) == [f"iso-{n:04d}" for n in range(3)], again.answered
    submitted = {**before.answered, **during.answered, **again.answered, **after.answered}
    await wait_for(lambda: _placed_all(rig, submitted), 90, what="everything placed")
    await wait_for(lambda: placements.first_after(healed_at) is not None, 60,
                   what="placements after the heal")
    placements.stop()

    # 0 lost, 0 duplicated on the remote...
    check_once(rig, submitted)
    # ...one leadership after the other, never merged: nothing of the isolated one after
    # the majority's epoch commit. (The heal may cost the lease stream its quorum for longer
    # than a TTL, so a later leadership - a higher epoch, by whoever wins it - may follow.)
    history = rig.remote_history()
    assert all(len(c.parent_ids) <= 1 for c in history)
    repo = pygit2.Repository(str(rig.remote))
    by_commit = [epoch_of(repo, str(c.id)) for c in history]  # newest first
    assert by_commit == sorted(by_commit, reverse=True), by_commit
    epochs = [line for line in (c.message.splitlines()[0] for c in history)
              if " leads from epoch " in line]
    majority = f"gavel: broker {second.leader} leads from epoch {second.epoch}"
    assert majority in epochs, epochs
    later = epochs[:epochs.index(majority)]
    assert all(int(line.rsplit(" ", 1)[1]) > second.epoch for line in later), epochs
    head_epoch = by_commit[0]
    shas = {str(c.id) for c in history}
    # ...no worker acted on, and no award named, a commit the remote does not hold...
    acted = [(n, i, sha) for n, i, sha in heard.provisioning if sha not in shas]
    assert not acted, acted
    told = [(a.instance_id, a.epoch, a.commit) for a in heard.awards if a.commit not in shas]
    assert not told, told
    # ...the KV mirror is the leader's that the remote's head names (asked until its puts
    # landed: a leadership the heal started may have begun a moment ago)...
    witness, kv, head = await rig.witness(), dict[str, int](), [head_epoch]

    async def mirror_of_head() -> bool:
        got = await kv_epochs(witness, rig.nodes)
        kv.clear()
        kv.update(got)
        head[0] = rig.remote_epoch()
        return bool(kv) and set(kv.values()) == {head[0]}
    try:
        await wait_for(mirror_of_head, 60, every=0.5, what="the KV mirror of the head's epoch")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: KV {kv}, remote head epoch {head[0]}, leaderships "
                             f"{epochs}") from None
    # ...and on the workers every instance runs, once, where the remote says.
    where = rig.remote_state().where

    def workers_agree() -> bool:
        held = {n: set(a._supervisor.held()) for n, a in rig.agents.items()}
        return all(iid in held.get(where[iid], set()) for iid in submitted) and \
            sum(len(h) for h in held.values()) == len(set().union(*held.values()))
    await wait_for(workers_agree, 60, every=0.3, what="the workers to run what the remote says")
    assert not any(a.converger.self_fenced for a in rig.agents.values())
    log = rig.brokers[isolated].log.read_text()
    stopped_after = _logged(log, "no longer leads") - cut_wall
    print(f"\npartition of the leader {isolated} (host {k}): it stopped leading "
          f"{stopped_after:.2f}s after the cut (by its log); the next committed placement came "
          f"{took - cut_at:.2f}s after it, by {second.leader} (epoch {first.epoch} -> "
          f"{second.epoch}; {len(later)} leaderships after it); {len(submitted)} submitted, "
          f"{before.retries + during.retries + again.retries + after.retries} client retries; "
          f"{_local_only(rig, isolated)} commits of the isolated broker never landed; the "
          f"minority side's client was told: {told_inside}; its log:\n" + "\n".join(
              line for line in log.splitlines()
              if "lead" in line or "fenced" in line or "refused" in line)[-3000:])
