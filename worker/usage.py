"""What each instance measurably uses, read from its cgroup (`worker.cgroups`).

Rules:
1. Memory is the cgroup's own figure (v2 ``memory.current``, v1
   ``memory.usage_in_bytes``): what the kernel charges it, the very figure its limit is held
   against, so it never reads above the award.
2. Cpu is cpus busy on average (1.0: one cpu the whole time) between two readings of the
   cgroup's cumulative time (v2 ``cpu.stat`` usage_usec; a v1 hierarchy without cpuacct: the
   cpu times of the processes in it, which forgets those that ended, so a reading that went
   back starts the count again). A reading within `MIN_INTERVAL_S` of the last gives the
   last figure again: a rate over a few milliseconds says nothing.
3. An instance without a cgroup (the node enforces nothing) measures nothing (zeros); a
   file that cannot be read is a zero too, never an error in a heartbeat.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

import psutil

from gavel.worker.cgroups import Cgroup

__all__ = ["MIN_INTERVAL_S", "Meter", "Usage", "read_cpu_s", "read_memory"]

#: Readings closer than this reuse the last figure (rule 2).
MIN_INTERVAL_S = 1.0
_MB = 1024 * 1024


class Usage(NamedTuple):
    cpu: float = 0.0  # cpus busy on average since the previous reading
    memory_mb: float = 0.0


def _number(text: str, key: str = "") -> int | None:
    if not key:
        return int(text.strip())
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return None


def read_memory(cg: Cgroup) -> int:
    """Rule 1: bytes charged to the cgroup now (0 when unreadable)."""
    name = "memory.current" if cg.version == "v2" else "memory.usage_in_bytes"
    with contextlib.suppress(OSError, ValueError):
        return _number((cg.memory_dir / name).read_text()) or 0
    return 0


def read_cpu_s(cg: Cgroup) -> float | None:
    """Rule 2: cpu seconds the cgroup has used, cumulative (None when unreadable)."""
    with contextlib.suppress(OSError, ValueError):
        if cg.version == "v2":
            usec = _number((cg.dirs[0] / "cpu.stat").read_text(), "usage_usec")
            return None if usec is None else usec / 1e6
        for d in cg.dirs:
            acct = d / "cpuacct.usage"
            if acct.exists():
                return int(acct.read_text()) / 1e9
    total = 0.0
    for pid in cg.pids():
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


class Meter:
    """Rules 1-3 for one node: `measure` each instance at each heartbeat."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._last: dict[str, tuple[float, float, Usage]] = {}  # id -> (at, cpu s, figure)

    def measure(self, instance_id: str, cg: Cgroup | None) -> Usage:
        if cg is None:
            return Usage()
        now = self.clock()
        before = self._last.get(instance_id)
        if before is not None and now - before[0] < MIN_INTERVAL_S:
            return before[2]
        cpu_s = read_cpu_s(cg)
        if cpu_s is None:
            return Usage(memory_mb=read_memory(cg) / _MB)
        cpu = 0.0
        if before is not None and cpu_s >= before[1]:
            cpu = (cpu_s - before[1]) / (now - before[0])
        figure = Usage(cpu=round(cpu, 3), memory_mb=round(read_memory(cg) / _MB, 1))
        self._last[instance_id] = (now, cpu_s, figure)
        return figure

    def keep(self, instance_ids: Iterable[str]) -> None:
        """Forget the instances no longer held."""
        held = set(instance_ids)
        for iid in [i for i in self._last if i not in held]:
            del self._last[iid]
