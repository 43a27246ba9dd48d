"""The chaos run's processes: nats-server, the broker and the workers as real children, each
killable, freezable and restartable on its own state (`Fleet`: the workers and what every
chaos cluster shares; `Cluster`: one server and one broker; `chaoshacluster`: the HA
shape). A process that exits without being killed by the run is recorded as a crash — a
finding, not noise.

Rules:
1. Every part runs on its own identity, as `gavel up --auth` runs them: nats-server with the
   config `gavel auth init` writes (`transport.identity.init`), each worker with its node's
   seed, the broker with ``broker.nk``; the driver calls the API with ``operator.nk``
   (`operator_creds`). The server's log then counts any permissions violation (`violations`).
2. A process the run holds down (killed, its restart still to come) is not revived by
   `revive`: only what died by itself is, and that is recorded as a crash.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gavel.bench.chaoscheck import kill_instances
from gavel.bench.chaosplan import STRATEGIES, Room
from gavel.transport import identity
from gavel.transport.natsserver import NatsServer

__all__ = ["Cluster", "Fleet", "kill_group", "terminate", "violations"]


class Fleet:
    """The workers, each restartable, and what every chaos cluster shares: the identities,
    the logs, the crashes seen. `url` is the NATS URL (or comma-separated list) they use."""

    def __init__(self, root: Path, nodes: list[str], room: Room | None = None) -> None:
        self.root = root
        self.logs = root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.ids = identity.init(root, nodes)
        self.nodes = nodes
        self.room = room or Room(cpu=8.0, memory_mb=8192)
        #: What the run holds down on purpose (a broker or a node id), until its restart.
        self.down: set[str] = set()
        self.workers: dict[str, subprocess.Popen[bytes] | None] = dict.fromkeys(nodes)
        self.frozen: set[str] = set()
        #: Processes that exited without being killed by us (a crash is a finding).
        self.crashes: list[str] = []
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GAVEL_")}
        self.env["GAVEL_FAST_TIMERS"] = "1"

    @property
    def url(self) -> str:
        raise NotImplementedError

    def _spawn(self, args: list[str], log: str) -> subprocess.Popen[bytes]:
        out = open(self.logs / log, "ab")  # noqa: SIM115 - the child owns it
        try:
            return subprocess.Popen([sys.executable, "-m", "gavel", *args], stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self.env, start_new_session=True)
        finally:
            out.close()

    @property
    def operator_creds(self) -> str:
        return str(self.ids.operator)

    def start_worker(self, node: str) -> None:
        p = self.workers[node]
        if p is not None and p.poll() is None:
            return  # already up (overlapping faults)
        i = self.nodes.index(node)
        self.down.discard(node)
        self.workers[node] = self._spawn(
            ["worker", "--node-id", node, "--strategy", STRATEGIES[i % len(STRATEGIES)],
             "--labels", f"zone={'ab'[i % 2]}", "--cpu", f"{self.room.cpu:g}",
             "--memory-mb", str(self.room.memory_mb),
             "--ports", f"{41000 + 100 * i}-{41000 + 100 * i + 99}",
             "--state", str(self.root / "workers" / node), "--nats", self.url,
             "--creds", str(self.ids.nodes[node])],
            f"{node}.log")

    def kill_worker(self, node: str) -> None:
        """kill -9 of the worker alone: its instances (own sessions) keep running."""
        p = self.workers[node]
        if p is not None:
            p.send_signal(signal.SIGKILL)  # a stopped process dies too
            p.wait()
            self.workers[node] = None
            self.frozen.discard(node)
            self.down.add(node)

    def freeze(self, node: str) -> None:
        p = self.workers[node]
        if p is not None:
            p.send_signal(signal.SIGSTOP)
            self.frozen.add(node)

    def thaw(self, node: str) -> None:
        p = self.workers[node]
        if p is not None and node in self.frozen:
            p.send_signal(signal.SIGCONT)
        self.frozen.discard(node)

    def revive_workers(self) -> None:
        """Rule 2 for the workers."""
        for node, p in self.workers.items():
            if p is not None and p.poll() is not None:
                self.crashes.append(f"{node} exited by itself (status {p.returncode})")
                self.workers[node] = p = None
            if p is None and node not in self.down:
                self.start_worker(node)

    def stop_workers(self) -> None:
        """Every worker thawed and stopped (each stops its instances)."""
        for node in list(self.frozen):
            self.thaw(node)
        terminate([p for p in self.workers.values() if p is not None], 15)


class Cluster(Fleet):
    """One nats-server and one broker beside the workers, each restartable."""

    def __init__(self, root: Path, nodes: list[str], room: Room | None = None) -> None:
        super().__init__(root, nodes, room)
        self.nats = NatsServer(store_dir=root / "nats", config=self.ids.config,
                               log=self.logs / "nats.log")
        self.broker: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.nats.url

    def start_broker(self) -> None:
        if self.broker is not None and self.broker.poll() is None:
            return  # already up (overlapping faults)
        self.down.discard("broker")
        self.broker = self._spawn(["broker", "--state", str(self.root), "--nats",
                                   self.nats.url, "--creds", str(self.ids.broker)],
                                  "broker.log")

    def violations(self) -> int:
        """Permissions violations in nats-server's log (rule 1: there should be none)."""
        return violations(self.nats.log)

    def kill_broker(self) -> None:
        """kill -9 of the broker's process group: the broker and its git writer die at once."""
        if self.broker is not None:
            kill_group(self.broker.pid, signal.SIGKILL)
            self.broker.wait()
            self.broker = None
            self.down.add("broker")

    def revive(self) -> None:
        """Restart anything that is down and not held down (rule 2); note what died without
        being killed."""
        if self.broker is not None and self.broker.poll() is not None:
            self.crashes.append(f"the broker exited by itself (status {self.broker.returncode})")
            self.broker = None
        if self.broker is None and "broker" not in self.down:
            self.start_broker()
        self.revive_workers()

    def stop(self) -> None:
        """The broker first, so stopping workers does not set off a round of re-placements;
        then the workers (they stop their instances), nats-server, and any instance left."""
        if self.broker is not None:
            terminate([self.broker], 10)
        self.stop_workers()
        self.nats.stop()
        kill_instances(self.root / "workers")


def violations(log: Path | None) -> int:
    """Permissions violations in a nats-server's log."""
    try:
        return log.read_text(errors="replace").count("Violation") if log else 0
    except OSError:
        return 0


def kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def terminate(procs: list[subprocess.Popen[bytes]], grace: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_group(p.pid, signal.SIGKILL)
            p.wait()
