"""The bench's child processes: the agent processes as `gavel bench` starts them, how each
is started and stopped, and what it used.

Rules:
1. Agents are numbered from 0 across the processes, each process a run of consecutive
   numbers, and node k is `node_id(k)`: whoever addresses them (the broker learns them from
   heartbeats; `bench.bare` asks them directly) names them this way.
2. A process is started once every agent in it is subscribed: it says ``ready``, or the
   start is an error naming the logs.
3. Each agent process also listens, on one connection of its own, to the harness's control
   subjects, which no gavel process uses: `FORGET` (every agent drops the instances whose id
   begins with `BARE_PREFIX`, those `bench.bare` awarded, and the process answers how many
   to the subject the message carries) and `BEAT` (every agent heartbeats now, so a broker
   started after the agents hears them at once rather than within a heartbeat interval).
   `FORGET` comes on the control connection, the awards on each agent's own, and NATS
   orders nothing across connections: an agent behind on its awards (a loaded machine)
   would take some after forgetting, hold them for good, and send heartbeats no broker
   admits (`broker.heartbeats` rule 1: more than git placed there). So the process first
   settles each agent's connection (a PING whose PONG the server sends after every message
   it already queued for it, the awards sent before the `FORGET` among them), then
   forgets; behind on a backlog it answers late, so its asker waits `FORGET_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from pathlib import Path

import psutil

__all__ = ["BARE_PREFIX", "BEAT", "FORGET", "FORGET_S", "cpu_s", "node_id", "peak_rss_mb",
           "spawn", "start_agents", "stop"]

#: Rule 3.
FORGET = "gavel-bench.forget"
BEAT = "gavel-bench.beat"
BARE_PREFIX = "bare-"
#: Rule 3: the most an agent process is given to settle its connections and answer.
FORGET_S = 60.0


def node_id(k: int) -> str:
    """Rule 1."""
    return f"n{k:05d}"


def spawn(module: str, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """`python -m module args`, its stdout a pipe, its stderr appended to `log`."""
    out = open(log, "ab")  # noqa: SIM115
    try:
        return subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE,
                                stderr=out, stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        out.close()


async def start_agents(url: str, agents: int, processes: int, logs: Path, *,
                       lifetime_s: float = 0.0, client: str = "lite",
                       heartbeat_s: float = 10.0,
                       started: list[subprocess.Popen[bytes]] | None = None,
                       ) -> list[subprocess.Popen[bytes]]:
    """`agents` agents in up to `processes` processes (`bench.agents`), once all are ready
    (rule 2); each is appended to `started` as it is spawned, so a caller stops them however
    the start ends."""
    logs.mkdir(parents=True, exist_ok=True)
    procs = started if started is not None else []
    per = -(-agents // processes)
    mine = []
    for k in range(processes):
        first, count = k * per, min(per, agents - k * per)
        if count <= 0:
            break
        p = spawn("gavel.bench.agents",
                  ["--url", url, "--first", str(first), "--count", str(count), "--mix",
                   "--lifetime-s", str(lifetime_s), "--client", client,
                   "--heartbeat-s", str(heartbeat_s)], logs / f"agents-{k}.log")
        procs.append(p)
        mine.append(p)
    for p in mine:
        line = await asyncio.to_thread(p.stdout.readline)  # type: ignore[union-attr]
        if line.strip() != b"ready":
            raise RuntimeError(f"an agent process failed to start; see {logs}")
    return mine


def stop(procs: list[subprocess.Popen[bytes]], wait_s: float = 10.0) -> None:
    """Terminate each, then kill what has not ended within `wait_s`."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(wait_s)
        except subprocess.TimeoutExpired:
            p.kill()


def cpu_s(proc: subprocess.Popen[bytes] | int, children: bool = False) -> float:
    """CPU seconds a child has used so far (its threads; with `children`, only theirs)."""
    p = psutil.Process(proc if isinstance(proc, int) else proc.pid)
    if not children:
        t = p.cpu_times()
        return float(t.user + t.system)
    total = 0.0
    for child in p.children(recursive=True):  # the broker's git writer process
        with contextlib.suppress(psutil.Error):
            c = child.cpu_times()
            total += c.user + c.system
    return total


def peak_rss_mb(pid: int) -> float:
    """The most resident memory process `pid` has held, in MB (``VmHWM`` in
    /proc/<pid>/status; where there is no /proc, what it holds now)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float(psutil.Process(pid).memory_info().rss) / 2**20
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"/proc/{pid}/status has no VmHWM line")
