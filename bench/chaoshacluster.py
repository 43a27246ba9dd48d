"""The HA chaos run's processes, in the shape `gavel up --ha` runs: three nats-servers routed
to each other (`transport.natscluster`, JetStream on, a store each), a bare git remote that
refuses non-fast-forward pushes, `BROKERS` brokers with ``--ha`` (one leads), and the
workers (`bench.chaoscluster.Fleet`), every part on its own NATS identity.

Rules:
1. Every server holds the ``authorization`` `gavel auth init` writes; every broker runs on
   ``broker.nk`` with its own working copy under ``brokers/<id>``, every worker on its node's
   seed; the lease and the node.json mirror are kept at three replicas, the lease short
   (`TTL_S`, renewed every `RENEW_S`: the tests' fast timers) so a failover takes seconds.
2. What the run kills it holds down until it restarts it (`Fleet.down`): `revive` restarts
   only what died by itself, and records it as a crash.
3. Stopping: the brokers first (SIGTERM: the leader lets the lease go), then the workers,
   the servers, and any instance left.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pygit2

from gavel.bench.chaoscheck import kill_instances
from gavel.bench.chaoscluster import Fleet, kill_group, terminate, violations
from gavel.bench.chaosplan import Room
from gavel.transport.natscluster import NatsCluster

__all__ = ["BROKERS", "RENEW_S", "SERVERS", "TTL_S", "HaCluster"]

SERVERS = 3
BROKERS = 3
TTL_S, RENEW_S = 3.0, 0.5


class HaCluster(Fleet):
    def __init__(self, root: Path, nodes: list[str], room: Room | None = None) -> None:
        super().__init__(root, nodes, room)
        self.servers = NatsCluster(root / "nats", SERVERS, extra=self.ids.config.read_text())
        self.remote = root / "remote.git"
        repo = pygit2.init_repository(str(self.remote), bare=True, initial_head="main")
        repo.config["receive.denyNonFastForwards"] = True
        self.brokers: dict[str, subprocess.Popen[bytes] | None] = {
            f"broker-{k}": None for k in range(1, BROKERS + 1)}

    @property
    def url(self) -> str:
        return self.servers.url

    def start(self) -> None:
        self.servers.start()
        for name in self.brokers:
            self.start_broker(name)
        for node in self.nodes:
            self.start_worker(node)

    def start_broker(self, name: str) -> None:
        p = self.brokers[name]
        if p is not None and p.poll() is None:
            return
        self.down.discard(name)
        self.brokers[name] = self._spawn(
            ["broker", "--state", str(self.root / "brokers" / name), "--push",
             str(self.remote), "--nats", self.url, "--creds", str(self.ids.broker), "--ha",
             "--broker-id", name, "--lease-ttl-s", f"{TTL_S:g}", "--lease-renew-s",
             f"{RENEW_S:g}", "--ha-replicas", str(SERVERS)], f"{name}.log")

    def kill_broker(self, name: str) -> None:
        """kill -9 of the broker's process group (its git writer too: one host lost)."""
        p = self.brokers[name]
        if p is not None:
            kill_group(p.pid, signal.SIGKILL)
            p.wait()
            self.brokers[name] = None
            self.down.add(name)

    def running_brokers(self) -> list[str]:
        return [n for n, p in self.brokers.items() if p is not None and p.poll() is None]

    def kill_server(self, i: int) -> None:
        self.servers.servers[i].kill()
        self.down.add(f"nats-{i + 1}")

    def start_server(self, i: int) -> None:
        self.servers.start_one(i)
        self.down.discard(f"nats-{i + 1}")

    def violations(self) -> int:
        """Permissions violations in every server's log (rule 1: there should be none)."""
        return sum(violations(s.log) for s in self.servers.servers)

    def revive(self) -> None:
        """Rule 2."""
        for name, p in self.brokers.items():
            if p is not None and p.poll() is not None:
                self.crashes.append(f"{name} exited by itself (status {p.returncode})")
                self.brokers[name] = p = None
            if p is None and name not in self.down:
                self.start_broker(name)
        for i, s in enumerate(self.servers.servers):
            name = f"nats-{i + 1}"
            if s.proc is not None and s.proc.poll() is not None:
                self.crashes.append(f"nats-server {i + 1} exited by itself "
                                    f"(status {s.proc.returncode})")
                s.proc = None
            if s.proc is None and name not in self.down:
                s.start()
        self.revive_workers()

    def stop(self) -> None:
        """Rule 3."""
        terminate([p for p in self.brokers.values() if p is not None], 15)
        self.stop_workers()
        self.servers.stop()
        kill_instances(self.root / "workers")
