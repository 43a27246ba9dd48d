"""What a bench run waits for on the broker: every agent healthy, then the placements made.

Rules:
1. The agents start before the broker (`bench.run` rule 6), so until every one is healthy
   the bench asks them once a second to heartbeat (`BEAT`); a broker still starting answers
   nothing, one that exited is said with where its log is, and 60 s is the most it waits.
2. While the placements are awaited, a `stats` the broker does not answer in time is asked
   again: a starved broker (10,000 agents' heartbeats beside a busy machine lost its feed
   for 22 s) is slow, not broken, and the run's own limit (`timeout_s`) bounds the wait; a
   broker that exited is said at once.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gavel.bench.agentprocs import BEAT
from gavel.bench.verify import VerifyError
from gavel.shared.api import StatsReply, StatsRequest
from gavel.transport.client import ClientError, NoAnswer, call

__all__ = ["HEALTHY_S", "until_healthy", "until_placed"]

#: Rule 1: the most a run waits for its agents.
HEALTHY_S = 60.0


async def until_healthy(nc: Any, agents: int, root: Path,
                        broker: subprocess.Popen[bytes]) -> StatsReply:
    """Rule 1: the broker's stats once `agents` are healthy."""
    deadline = time.monotonic() + HEALTHY_S
    beat = 0.0
    while True:
        if time.monotonic() - beat > 1.0:  # the agents started first: heard now
            beat = time.monotonic()
            await nc.publish(BEAT, b"")
        try:
            stats = await call(nc, "stats", StatsRequest(), StatsReply, timeout=10)
        except ClientError:  # the broker is still starting
            if broker.poll() is not None:
                raise RuntimeError(
                    f"the broker exited; see {root / 'logs' / 'broker.log'}") from None
            await asyncio.sleep(0.2)
            continue
        if stats.nodes_healthy >= agents:
            return stats
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {stats.nodes_healthy}/{agents} agents are healthy after "
                               f"{HEALTHY_S:g}s; see {root / 'logs' / 'broker.log'}")
        await asyncio.sleep(0.2)


async def until_placed(nc: Any, n: int, placed: Callable[[StatsReply], int], base: int,
                       broker: subprocess.Popen[bytes], *, timeout_s: float,
                       progress: float | None = None) -> StatsReply:
    """Rule 2: the broker's stats once `n` more are `placed` than `base`, at most
    `timeout_s`; with `progress` (when the placements began) a bar on stderr."""
    limit = time.monotonic() + timeout_s
    done = 0
    while True:
        await asyncio.sleep(0.25)
        try:
            stats = await call(nc, "stats", StatsRequest(), StatsReply, timeout=10)
        except NoAnswer:
            if broker.poll() is not None:
                raise RuntimeError("the broker exited while its placements were awaited; "
                                   "see logs/broker.log") from None
            if time.monotonic() > limit:
                raise VerifyError(f"only {done}/{n} placed in {timeout_s:g}s (the broker "
                                  "stopped answering stats)") from None
            continue
        done = placed(stats) - base
        if progress is not None:
            _bar(done, n, progress)
        if done >= n:
            return stats
        if time.monotonic() > limit:
            raise VerifyError(f"only {done}/{n} placed in {timeout_s:g}s")


def _bar(done: int, total: int, started: float) -> None:
    width = 30
    filled = int(width * done / max(total, 1))
    rate = done / max(time.perf_counter() - started, 1e-9)
    sys.stderr.write(f"\r  [{'#' * filled}{'.' * (width - filled)}] {done}/{total} "
                     f"placed, {rate:,.0f}/s ")
    sys.stderr.flush()
