"""What the hour took while a bench run's figures were taken (`bench.run` rule 8).

Rules:
1. A process's CPU run time, its waits for a CPU while runnable and its turns on one are the
   kernel's (/proc/<pid>/task/*/schedstat), summed over its threads; zeros where there is
   none (another kernel, a process gone). A thread that ended took its share with it.
2. `Waits` reads the broker, the agent processes and this driver (the probe's requester and
   echo) when made and again at `per_turn_us`: each one's waits over its turns in between,
   in microseconds - what each time it became runnable cost it on average - and the 1-minute
   load average when it was made.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["Waits", "sched_s"]


def sched_s(pid: int) -> tuple[float, float, int]:
    """Rule 1: seconds process `pid`'s threads have run on a CPU so far, seconds they waited
    for one while runnable, and how many times they were put on one."""
    run = wait = slices = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0.0, 0.0, 0
    for task in tasks:
        with contextlib.suppress(OSError, ValueError):
            ran, waited, times = (task / "schedstat").read_text().split()
            run, wait, slices = run + int(ran), wait + int(waited), slices + int(times)
    return run / 1e9, wait / 1e9, slices


class Waits:
    """Rule 2: the processes' waits for a CPU from now to `per_turn_us`, and the load now."""

    def __init__(self, broker: int, agents: list[int]) -> None:
        self.load = round(os.getloadavg()[0], 2)
        self._pids = {"broker": [broker], "agents": agents, "probe": [os.getpid()]}
        self._first = self._read()

    def _read(self) -> dict[str, tuple[float, int]]:
        got = {}
        for who, pids in self._pids.items():
            read = [sched_s(pid) for pid in pids]
            got[who] = (sum(r[1] for r in read), sum(r[2] for r in read))
        return got

    def per_turn_us(self) -> dict[str, float]:
        """Microseconds waited a turn on a CPU, by process, since this was made (none where
        the kernel keeps no schedstat)."""
        now = self._read()
        out = {}
        for who, (wait, turns) in now.items():
            taken = turns - self._first[who][1]
            if taken > 0:
                out[who] = round(1e6 * (wait - self._first[who][0]) / taken, 1)
        return out
