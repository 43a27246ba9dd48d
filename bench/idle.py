"""One real `gavel worker` process, idle: how much CPU and memory does an agent cost?

Rules:
1. The worker is the production command line (real psutil sampling, real heartbeats, real
   local state), connected to the run's nats-server while the run's broker listens.
2. Nothing is measured of a worker nobody has heard: before the window the broker's `nodes`
   API must list it healthy (its heartbeat reached a listening broker); through the window
   it must keep running; when the window ends it must still run and the broker must still
   list it healthy. Otherwise `IdleWorkerFailed` says which, in one sentence - never the
   figures of a process that is not there (a dead one reads 0% of a core and 0 MB).
3. It is measured after a settling period, over a fixed window, from the kernel's own
   accounting.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from gavel.shared.api import NodesReply, NodesRequest
from gavel.transport.client import ClientError, call

__all__ = ["NODE_ID", "IdleWorkerFailed", "idle_worker"]

NODE_ID = "idle-1"
#: How often the worker's process is looked at while the bench waits on it.
_LOOK_S = 0.2


class IdleWorkerFailed(Exception):
    """The idle worker died, or the broker never heard it: there is nothing to measure."""


async def idle_worker(nc: Any, url: str, state: Path, log: Path, seconds: float = 10.0,
                      settle_s: float = 3.0, heard_within_s: float = 60.0
                      ) -> tuple[float, float]:
    """(percent of one core, RSS in MB) of an idle worker over `seconds`. `nc` asks the
    listening broker; the worker keeps its state in `state` and writes its log to `log`."""
    out = open(log, "ab")  # noqa: SIM115 - the child holds it; ours closes at once
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gavel", "worker", "--nats", url, "--node-id", NODE_ID,
             "--state", str(state), "--cpu", "4", "--memory-mb", "4096"],
            stdout=subprocess.DEVNULL, stderr=out, stdin=subprocess.DEVNULL)
    finally:
        out.close()
    try:
        await _heard(nc, proc, heard_within_s, log)
        await _running(proc, settle_s, log)
        p = psutil.Process(proc.pid)
        before = p.cpu_times()
        started = time.monotonic()
        await _running(proc, seconds, log)
        after = p.cpu_times()
        elapsed = time.monotonic() - started
        rss = p.memory_info().rss / 2**20
        _alive(proc, log)  # the readings above are of a running process
        if not await _listed_healthy(nc):
            raise IdleWorkerFailed(f"the broker no longer lists the idle worker healthy when "
                                   f"its measurement ends (see {log})")
        used = (after.user - before.user) + (after.system - before.system)
        return 100.0 * used / elapsed, rss
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _alive(proc: subprocess.Popen[bytes], log: Path) -> None:
    code = proc.poll()
    if code is None:
        try:
            if psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            pass
        code = proc.wait()
    raise IdleWorkerFailed(f"the idle worker exited with status {code} during its "
                           f"measurement (see {log})")


async def _running(proc: subprocess.Popen[bytes], seconds: float, log: Path) -> None:
    """Wait `seconds`, failing as soon as the worker is gone."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        _alive(proc, log)
        await asyncio.sleep(min(_LOOK_S, left))
    _alive(proc, log)


async def _listed_healthy(nc: Any) -> bool:
    try:
        reply = await call(nc, "nodes", NodesRequest(), NodesReply, timeout=10)
    except ClientError:
        return False
    return any(n.node_id == NODE_ID and n.health == "healthy" for n in reply.nodes)


async def _heard(nc: Any, proc: subprocess.Popen[bytes], within_s: float, log: Path) -> None:
    """Rule 2: the broker lists the worker healthy, or the worker is gone, or time is up."""
    deadline = time.monotonic() + within_s
    while not await _listed_healthy(nc):
        code = proc.poll()
        if code is not None:
            raise IdleWorkerFailed(f"the idle worker exited with status {code} before the "
                                   f"broker heard its heartbeat (see {log})")
        if time.monotonic() > deadline:
            raise IdleWorkerFailed(f"the broker did not hear the idle worker's heartbeat "
                                   f"within {within_s:g}s (see {log})")
        await asyncio.sleep(_LOOK_S)
