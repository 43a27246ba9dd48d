"""`gavel up` as a new user runs it: the real command as a child process, and its children.

What must hold: a `--nats-port` another server holds is refused in one sentence (never
joining that other cluster); a broker that exits (its `--metrics-port` taken, or killed
later) stops everything `gavel up` started, exit 1 naming the child and what it said; a
worker that dies is said once and the rest carry on (with `--restart-workers` it comes back
onto its running instances), and its instances stop with `gavel up`; and Ctrl-C then
`gavel up` again on the same state brings running work back on its node at the same
attempt - no re-placement, no cancel claimed in a worker's log, no rejected message counted,
the metrics saying running. It serves the HTTP API and prints its address.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gavel.transport.natsserver import NatsServer, free_port
from tests.integration.harness import wait_for

pytestmark = pytest.mark.integration
SLEEPER = f'command = ["{sys.executable}", "-c", "import time; time.sleep(600)"]\n'


def leftovers(state: Path) -> list[str]:
    """Processes still running whose command line names `state` (gavel up's children)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(state) in cmd:
            out.append(f"{p.pid}: {cmd}")
    return out


class Up:
    """One `gavel up` child process and what it printed."""

    def __init__(self, state: Path, *flags: str) -> None:
        self.state = state
        self.out = state.parent / f"{state.name}-up.out"
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gavel", "up", "--state", str(state), *flags],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.url = ""
        self.creds = ""

    def text(self) -> str:
        return self.out.read_text()

    async def ready(self) -> str:
        def printed() -> bool:
            assert self.proc.poll() is None, self.text()
            return "try: " in self.text()
        await wait_for(printed, 60, every=0.1, what="gavel up to say it is up")
        m = re.search(r"GAVEL_NATS_URL=(\S+)", self.text())
        assert m is not None, self.text()
        self.url = m.group(1)
        creds = re.search(r"GAVEL_CREDS=(\S+)", self.text())  # the local admin's
        self.creds = creds.group(1) if creds else ""
        return self.url

    async def exit(self, sig: signal.Signals | None = None) -> int:
        if sig is not None:
            self.proc.send_signal(sig)
        return await asyncio.to_thread(self.proc.wait, 60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    async def gavel(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "GAVEL_NATS_URL": self.url,
               "GAVEL_CREDS": self.creds or str(self.state / "auth" / "operator.nk")}
        return await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "gavel", *args], capture_output=True,
            text=True, timeout=60, env=env)

    async def status(self, iid: str) -> dict[str, Any]:
        proc = await self.gavel("status", iid, "--json")
        assert proc.returncode == 0, proc.stderr
        got: list[dict[str, Any]] = json.loads(proc.stdout)
        return got[0]


@pytest.fixture
def ups() -> Iterator[list[Up]]:
    started: list[Up] = []
    yield started
    for up in started:
        up.kill()


async def test_a_taken_nats_port_is_refused_in_one_sentence(
        nats_server: NatsServer, tmp_path: Path, ups: list[Up]) -> None:
    state = tmp_path / "s"
    up = Up(state, "--workers", "1", "--nats-port", str(nats_server.port))
    ups.append(up)
    assert await up.exit() == 2
    assert up.text().strip() == (f"gavel up: --nats-port {nats_server.port} is taken by "
                                 "another process; choose another, or leave it out for a "
                                 "free one.")
    assert leftovers(state) == []
    assert not (state / "logs" / "broker.log").exists()  # no broker joined the other server


async def test_a_broker_that_exits_stops_the_cluster_in_one_sentence(
        tmp_path: Path, ups: list[Up]) -> None:
    state = tmp_path / "s"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        up = Up(state, "--workers", "1", "--metrics-port", str(port))
        ups.append(up)
        assert await up.exit() == 1
    line = up.text().strip()
    assert line.startswith("gavel up: the broker exited with status 2 (gavel broker: cannot "
                           f"serve metrics on 127.0.0.1:{port}: "), line
    assert line.endswith(f"its log is {state / 'logs' / 'broker.log'}")
    assert "\n" not in line
    assert leftovers(state) == []


def scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


async def test_ctrl_c_and_up_again_brings_running_work_back(
        tmp_path: Path, ups: list[Up]) -> None:
    state, metrics = tmp_path / "s", free_port()
    spec = tmp_path / "sleepy.toml"
    spec.write_text(f'name = "sleepy"\n{SLEEPER}cpu = 0.5\nports = ["http"]\n')
    first = Up(state, "--workers", "2", "--metrics-port", str(metrics))
    ups.append(first)
    await first.ready()
    proc = await first.gavel("submit", str(spec), "--id", "sleepy-1", "--wait=running")
    assert proc.returncode == 0, proc.stderr

    async def running(up: Up) -> bool:
        return (await up.status("sleepy-1"))["state"] == "running"
    await wait_for(lambda: running(first), 30, what="the instance to run")
    before = await first.status("sleepy-1")
    node = before["node_id"]
    api = re.search(r"^HTTP API: (http://127\.0\.0\.1:\d+/) \(named operators' own "
                    r"tokens: admin\)$", first.text(), re.M)
    assert api is not None, first.text()  # it serves the HTTP API, and says where
    with urllib.request.urlopen(f"{api.group(1)}v1/instances/sleepy-1", timeout=30) as resp:
        served = json.loads(resp.read())["instances"]
    usage = ("cpu_used", "memory_used_mb")  # measured afresh by every heartbeat
    assert [{k: v for k, v in i.items() if k not in usage} for i in served] == [
        {k: v for k, v in before.items() if k not in usage}]
    assert all(k in served[0] for k in usage)
    # The command it prints asks as the local admin, a named operator: the event says so.
    assert first.creds == str(state.resolve() / "auth" / "operators" / "admin.nk")
    with urllib.request.urlopen(f"{api.group(1)}v1/events?instance_id=sleepy-1",
                                timeout=30) as resp:
        said = [e["detail"] for e in json.loads(resp.read())["events"]
                if e["type"] == "requested"]
    assert said == ["submit by operator admin"]
    pid = json.loads((state / "workers" / node / "agent.json").read_text()
                     )["instances"]["sleepy-1"]["pid"]

    assert await first.exit(signal.SIGINT) == 0  # Ctrl-C
    assert leftovers(state) == []
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    history = subprocess.run(["git", "--git-dir", str(state / "state.git"), "log",
                              "--format=%s"], capture_output=True, text=True, check=True)

    again = Up(state, "--workers", "2", "--metrics-port", str(metrics))
    ups.append(again)
    await again.ready()
    await wait_for(lambda: running(again), 30, what="the instance to run again")
    after = await again.status("sleepy-1")
    assert (after["node_id"], after["attempt"]) == (node, before["attempt"]) == (node, 1)
    assert after["ports"] == before["ports"]
    now = subprocess.run(["git", "--git-dir", str(state / "state.git"), "log",
                          "--format=%s"], capture_output=True, text=True, check=True)
    assert now.stdout == history.stdout  # nothing was re-placed, requeued or ended
    for log in (state / "logs").glob("node-*.log"):
        assert "cancelled by operator" not in log.read_text(), log.read_text()
    got = scrape(metrics)
    assert got["gavel_instances"] == {(("state", "running"),): 1.0}
    assert {k: v for k, v in got.get("gavel_messages_rejected_total", {}).items() if v} == {}

    # The broker dying while the cluster runs stops the whole of it, in one sentence.
    child(state, "broker").kill()
    assert await again.exit() == 1
    assert again.text().strip().splitlines()[-1].startswith(
        "gavel up: the broker exited with status -9")
    assert leftovers(state) == []


def child(state: Path, role: str, where: str = "") -> psutil.Process:
    """The `gavel up` child of `role` (its first argument) whose command line names `where`."""
    def role_of(cmd: list[str]) -> str:  # python [-P] -m gavel ROLE ...
        return cmd[cmd.index("gavel") + 1] if "gavel" in cmd[:-1] else ""
    return next(p for p in psutil.process_iter(["cmdline"])
                if role_of(p.info["cmdline"] or []) == role
                and str(state / where) in " ".join(p.info["cmdline"] or []))


async def sleeper_on_a_node(up: Up, tmp_path: Path) -> tuple[str, int]:
    """Submit one sleeping instance; the node it runs on and its pid, once it runs."""
    spec = tmp_path / "sleepy.toml"
    spec.write_text(f'name = "sleepy"\n{SLEEPER}cpu = 0.5\n')
    proc = await up.gavel("submit", str(spec), "--id", "sleepy-1", "--wait=running")
    assert proc.returncode == 0, proc.stderr

    async def running() -> bool:
        return (await up.status("sleepy-1"))["state"] == "running"
    await wait_for(running, 30, what="the instance to run")
    node = (await up.status("sleepy-1"))["node_id"]
    agent = json.loads((up.state / "workers" / node / "agent.json").read_text())
    return node, int(agent["instances"]["sleepy-1"]["pid"])


def alive(pid: int) -> bool:
    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


async def test_a_worker_that_dies_is_said_once_and_its_instances_stop_with_up(
        tmp_path: Path, ups: list[Up]) -> None:
    state = tmp_path / "s"
    up = Up(state, "--workers", "2", "--no-ui", "--no-gateway")
    ups.append(up)
    await up.ready()
    node, pid = await sleeper_on_a_node(up, tmp_path)
    child(state, "worker", f"workers/{node}").kill()
    said = f"gavel up: the worker {node} exited with status -9"
    await wait_for(lambda: said in up.text(), 30, what="gavel up to say the worker died")
    lines = [ln for ln in up.text().splitlines() if ln.startswith(said)]
    assert len(lines) == 1 and lines[0].endswith(
        "the rest carry on (--restart-workers starts a worker that exits again)"), lines
    nodes = await up.gavel("nodes")  # the rest of the cluster still answers
    assert nodes.returncode == 0, nodes.stderr
    assert up.proc.poll() is None
    assert alive(pid)  # a dead node's work runs on, unmanaged, as on a real host
    assert await up.exit(signal.SIGTERM) == 0
    assert leftovers(state) == []
    assert not alive(pid)  # but not past `gavel up`


async def test_restart_workers_brings_a_dead_worker_back_onto_its_instances(
        tmp_path: Path, ups: list[Up]) -> None:
    state = tmp_path / "s"
    up = Up(state, "--workers", "2", "--no-ui", "--no-gateway", "--restart-workers")
    ups.append(up)
    await up.ready()
    node, pid = await sleeper_on_a_node(up, tmp_path)
    child(state, "worker", f"workers/{node}").kill()
    await wait_for(lambda: f"gavel up: the worker {node} started again" in up.text(), 30,
                   what="gavel up to start the worker again")
    assert "exited with status -9 (" in up.text()
    restarted = child(state, "worker", f"workers/{node}")

    async def adopted() -> bool:
        st = await up.status("sleepy-1")
        agent = json.loads((state / "workers" / node / "agent.json").read_text())
        return bool(st["state"] == "running" and restarted.is_running()
                    and agent["instances"]["sleepy-1"]["pid"] == pid)
    await wait_for(adopted, 30, what="the restarted worker to hold its instance again")
    assert (await up.status("sleepy-1"))["attempt"] == 1
    assert await up.exit(signal.SIGINT) == 0
    assert leftovers(state) == []
    assert not alive(pid)
