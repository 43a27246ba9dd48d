"""One real `gavel worker` process, idle: how much CPU and memory does an agent cost?

Rule: the worker is the production command line (real psutil sampling, real heartbeats,
real local state), connected to the run's nats-server with a broker listening; it is
measured after a settling period, over a fixed window, from the kernel's own accounting.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

__all__ = ["idle_worker"]


async def idle_worker(url: str, seconds: float = 10.0,
                      settle_s: float = 3.0) -> tuple[float, float]:
    """(percent of one core, RSS in MB) of an idle worker over `seconds`."""
    with tempfile.TemporaryDirectory(prefix="gavel-idle-") as tmp:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gavel", "worker", "--nats", url, "--node-id", "idle-1",
             "--state", str(Path(tmp) / "w"), "--cpu", "4", "--memory-mb", "4096"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        try:
            await asyncio.sleep(settle_s)
            p = psutil.Process(proc.pid)
            before = p.cpu_times()
            started = time.monotonic()
            await asyncio.sleep(seconds)
            after = p.cpu_times()
            elapsed = time.monotonic() - started
            rss = p.memory_info().rss / 2**20
            used = (after.user - before.user) + (after.system - before.system)
            return 100.0 * used / elapsed, rss
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
