"""Enforced resources: each instance's process runs in a cgroup of its own holding the cpu and
memory it was awarded.

Rules:
1. One hierarchy per worker, found at start (`detect`) as its ``cgroups`` setting says:
   ``v2`` (the unified hierarchy, with its memory and cpu controllers), ``v1`` (a hierarchy
   per controller: memory, cpu), ``auto`` (v2 when the host runs it with both controllers,
   else v1, else none) or ``off``. A hierarchy asked for by name that is not usable is a
   sentence naming why (`Unavailable`); ``auto`` falls back to enforcing nothing.
2. An instance's cgroup is ``gavel/<node-id>/<instance-id>`` under the hierarchy's root (each
   v1 controller's). Gavel owns ``gavel/<node-id>`` and nothing above or beside it; the
   parent keeps the default weight, so a node's instances share cpu by their awards among
   themselves and as one group against everything else on the host.
3. Limits: memory at the award's memory_mb, swap included where the kernel accounts it (a
   process is killed at its limit, not paged out past it); cpu a weight in proportion to the
   award's cpu (v1 ``cpu.shares`` 1024 a cpu, v2 ``cpu.weight`` 100 a cpu), and with
   ``cpu = "quota"`` also a hard cap of that many cpus a period (``cpu.cfs_quota_us``,
   ``cpu.max``).
4. The process enters its cgroup before it runs its command: the child writes itself into
   ``cgroup.procs`` between fork and exec (`entry`, descriptors opened before the fork), so
   not one instruction of the command runs unlimited; a child that cannot enter never runs.
5. An OOM kill is read from the kernel's counter (v2 ``memory.events`` oom_kill, v1
   ``memory.oom_control`` oom_kill; a v1 kernel without it: ``memory.failcnt`` rose and
   ``memory.max_usage_in_bytes`` reached the limit), against a reading taken when the process
   started, so a cgroup kept across restarts in place reports each run's own.
6. A cgroup is removed once its process has ended, whatever it left behind killed first; a
   process re-adopted after a worker restart keeps the cgroup it runs in.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["MODES", "Cgroup", "Enforcement", "Hierarchy", "Unavailable", "detect", "release"]

log = logging.getLogger("gavel.worker.cgroups")

Mode = Literal["auto", "v1", "v2", "off"]
MODES: tuple[Mode, ...] = ("auto", "v1", "v2", "off")
CpuLimit = Literal["weight", "quota"]
ROOT = Path("/sys/fs/cgroup")
#: The CFS period a quota is a share of (the kernel's default), in microseconds.
PERIOD_US = 100_000
_MB = 1024 * 1024


class Unavailable(Exception):
    """The hierarchy asked for cannot be used here: one sentence saying why."""


def _read(path: Path) -> str:
    return path.read_text()


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _counter(text: str, key: str) -> int | None:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return None


class Cgroup:
    """One instance's cgroup: a directory (v2) or one per controller (v1)."""

    def __init__(self, version: str, dirs: tuple[Path, ...], memory_dir: Path,
                 memory_mb: int) -> None:
        self.version = version
        self.dirs = dirs
        self.memory_dir = memory_dir
        self.memory_mb = memory_mb
        #: The OOM kills counted when the process started (rule 5).
        self.baseline = self.oom_kills()

    @contextlib.contextmanager
    def entry(self) -> Iterator[Callable[[], None]]:
        """A `preexec_fn` that moves the calling (child) process into this cgroup (rule 4);
        the descriptors it writes to are opened here, before the fork, and closed after."""
        fds = [os.open(d / "cgroup.procs", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
               for d in self.dirs]

        def enter() -> None:
            for fd in fds:
                os.write(fd, b"0")  # 0: the writing process itself

        try:
            yield enter
        finally:
            for fd in fds:
                os.close(fd)

    def started(self) -> None:
        """A new process runs in the cgroup: its OOM kills count from now (rule 5)."""
        self.baseline = self.oom_kills()

    def oom_kills(self) -> int:
        """How many processes the kernel killed here for memory so far (an old v1 kernel
        counts no kills: there, how often the limit was hit once usage reached it)."""
        return self._kills()[0]

    def _kills(self) -> tuple[int, bool]:
        """(the count, whether it counts kills) - rule 5."""
        try:
            if self.version == "v2":
                return _counter(_read(self.memory_dir / "memory.events"), "oom_kill") or 0, True
            got = _counter(_read(self.memory_dir / "memory.oom_control"), "oom_kill")
            if got is not None:
                return got, True
            if int(_read(self.memory_dir / "memory.max_usage_in_bytes")) >= \
                    self.memory_mb * _MB:
                return int(_read(self.memory_dir / "memory.failcnt")), False
            return 0, False
        except (OSError, ValueError):
            return 0, True

    def exceeded(self, code: int | None) -> bool:
        """Whether the run that ended with `code` (None: unknown, a re-adopted process) ended
        for its memory: the kernel killed in it since it started, and it did not succeed.
        Where the kernel counts no kills, only a SIGKILL after the limit was hit counts."""
        count, kills = self._kills()
        if count <= self.baseline or code == 0:
            return False
        return kills or code == -signal.SIGKILL

    def pids(self) -> list[int]:
        """The processes in the cgroup (never 0 or this worker, whatever the file says)."""
        out: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                out.update(int(p) for p in _read(d / "cgroup.procs").split())
        return sorted(p for p in out if p > 0 and p != os.getpid())

    def remove(self) -> bool:
        """Remove the cgroup; False while something still runs in it."""
        done = True
        for d in self.dirs:
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                    raise
                done = False
        return done

    def kill(self) -> None:
        """SIGKILL whatever still runs in the cgroup."""
        kill_file = self.dirs[0] / "cgroup.kill"
        if self.version == "v2" and kill_file.exists():
            with contextlib.suppress(OSError):
                _write(kill_file, "1")
                return
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


async def release(cgroup: Cgroup, tries: int = 50, every_s: float = 0.02) -> bool:
    """Remove `cgroup` once its process ended (rule 6): whatever it left behind is killed,
    the removal retried while the kernel lets go of them. False if it never let go."""
    for k in range(tries):
        try:
            if cgroup.remove():
                return True
        except OSError as exc:
            log.warning("cannot remove cgroup %s: %s", cgroup.dirs[0], exc)
            return False
        if k == 0:
            cgroup.kill()
        await asyncio.sleep(every_s)
    log.warning("cgroup %s still holds processes %s; left in place", cgroup.dirs[0],
                cgroup.pids())
    return False


class Hierarchy:
    """Where a worker's instance cgroups live, and how their limits are written."""

    def __init__(self, version: Literal["v1", "v2"], parents: dict[str, Path],
                 cpu_limit: CpuLimit) -> None:
        self.version = version
        #: The node's own parent cgroup, per controller ("memory", "cpu"; v2: one for both).
        self.parents = parents
        self.cpu_limit = cpu_limit

    def describe(self) -> str:
        where = ", ".join(sorted({str(p) for p in self.parents.values()}))
        cpu = "weight and quota" if self.cpu_limit == "quota" else "weight"
        return f"cgroup {self.version} at {where}: memory limit and cpu {cpu} per instance"

    def _dirs(self, instance_id: str) -> tuple[tuple[Path, ...], Path]:
        memory = self.parents["memory"] / instance_id
        cpu = self.parents["cpu"] / instance_id
        return (memory,) if cpu == memory else (memory, cpu), memory

    def create(self, instance_id: str, cpu: float, memory_mb: int) -> Cgroup:
        """The instance's cgroup with its limits written (rule 3); an existing one (left by
        an earlier run) is reused with the limits written again. Raises OSError."""
        dirs, memory_dir = self._dirs(instance_id)
        for d in dirs:
            d.mkdir(exist_ok=True)
        limit = memory_mb * _MB
        if self.version == "v2":
            d = dirs[0]
            _write(d / "memory.max", str(limit))
            for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                if (d / name).exists():
                    _write(d / name, value)
            _write(d / "cpu.weight", str(weight_v2(cpu)))
            _write(d / "cpu.max", f"{quota_us(cpu) if self.cpu_limit == 'quota' else 'max'} "
                                  f"{PERIOD_US}")
        else:
            mem, cpu_dir = memory_dir, dirs[-1]
            _limit_v1(mem, limit)
            _write(cpu_dir / "cpu.shares", str(shares_v1(cpu)))
            if self.cpu_limit == "quota":
                _write(cpu_dir / "cpu.cfs_period_us", str(PERIOD_US))
                _write(cpu_dir / "cpu.cfs_quota_us", str(quota_us(cpu)))
        return Cgroup(self.version, dirs, memory_dir, memory_mb)

    def find(self, instance_id: str, memory_mb: int) -> Cgroup | None:
        """The cgroup a re-adopted instance runs in, if it is there (rule 6)."""
        dirs, memory_dir = self._dirs(instance_id)
        if not all(d.is_dir() for d in dirs):
            return None
        return Cgroup(self.version, dirs, memory_dir, memory_mb)

    def close(self) -> None:
        """Remove the node's parent cgroups if nothing is left in them (instances left
        running for the next worker keep theirs, and so the parent)."""
        for parent in {*self.parents.values()}:
            with contextlib.suppress(OSError):
                parent.rmdir()
            with contextlib.suppress(OSError):
                parent.parent.rmdir()  # gavel/ itself, when no other node uses it


def shares_v1(cpu: float) -> int:
    return max(2, min(262_144, round(1024 * cpu)))


def weight_v2(cpu: float) -> int:
    return max(1, min(10_000, round(100 * cpu)))


def quota_us(cpu: float) -> int:
    return max(1_000, round(cpu * PERIOD_US))


def _limit_v1(mem: Path, limit: int) -> None:
    """memory.limit_in_bytes, and memory.memsw.limit_in_bytes (memory plus swap) at the same
    value where the kernel accounts swap; the kernel wants memsw >= limit at every step."""
    memsw = mem / "memory.memsw.limit_in_bytes"
    try:
        _write(mem / "memory.limit_in_bytes", str(limit))
    except OSError as exc:  # lowering below a larger memsw is fine; raising above it is not
        if exc.errno != errno.EINVAL or not memsw.exists():
            raise
        _write(memsw, str(limit))
        _write(mem / "memory.limit_in_bytes", str(limit))
    if memsw.exists():
        _write(memsw, str(limit))


@dataclass(frozen=True)
class Enforcement:
    """What a worker enforces: a hierarchy, or none and why (said once at start and in the
    ``gavel_worker_cgroups`` metric)."""

    hierarchy: Hierarchy | None
    summary: str
    #: Nothing is enforced though the setting asked for it (``auto`` found nothing usable).
    missing: bool = False

    @property
    def version(self) -> str:
        return self.hierarchy.version if self.hierarchy is not None else "none"

    @classmethod
    def off(cls, why: str = "cgroups = \"off\"", missing: bool = False) -> Enforcement:
        return cls(None, f"resources not enforced ({why}): cpu and memory reservations are "
                         "bookkeeping only", missing)


def detect(mode: Mode, node_id: str, *, root: Path = ROOT,
           cpu_limit: CpuLimit = "weight") -> Enforcement:
    """The hierarchy `mode` names, made ready for `node_id` (rule 1). Raises `Unavailable`
    when `mode` names one that is not usable."""
    if mode == "off":
        return Enforcement.off()
    problems: list[str] = []
    for version, find in (("v2", _v2), ("v1", _v1)):
        if mode not in ("auto", version):
            continue
        try:
            hierarchy = find(root, node_id, cpu_limit)
        except Unavailable as exc:
            if mode != "auto":
                raise
            problems.append(str(exc))
            continue
        return Enforcement(hierarchy, f"resources enforced: {hierarchy.describe()}")
    return Enforcement.off("; ".join(problems), missing=True)


def _v2(root: Path, node_id: str, cpu_limit: CpuLimit) -> Hierarchy:
    """The unified hierarchy at `root` (or, on a hybrid host, `root`/unified) with memory
    and cpu, each level from the root down to the node's parent delegating both."""
    mount = next((m for m in (root, root / "unified") if _controllers(m) >= {"memory", "cpu"}),
                 None)
    if mount is None:
        raise Unavailable(f"cgroup v2: no unified hierarchy with the memory and cpu "
                          f"controllers at {root}")
    parent = mount
    try:
        for name in ("gavel", node_id):
            _delegate(parent)
            parent = parent / name
            parent.mkdir(exist_ok=True)
        _delegate(parent)
    except OSError as exc:
        raise Unavailable(f"cgroup v2 at {mount} is not writable: {_why(exc)} ({parent})"
                          ) from None
    return Hierarchy("v2", {"memory": parent, "cpu": parent}, cpu_limit)


def _controllers(path: Path) -> set[str]:
    try:
        return set(_read(path / "cgroup.controllers").split())
    except OSError:
        return set()


def _delegate(cgroup: Path) -> None:
    """Let `cgroup`'s children use memory and cpu (cgroup.subtree_control)."""
    control = cgroup / "cgroup.subtree_control"
    enabled = set(_read(control).split()) if control.exists() else set()
    if not {"memory", "cpu"} <= enabled:
        _write(control, "+memory +cpu")


def _v1(root: Path, node_id: str, cpu_limit: CpuLimit) -> Hierarchy:
    """The v1 memory and cpu hierarchies under `root`, each with the node's parent made."""
    parents: dict[str, Path] = {}
    for controller, probe in (("memory", "memory.limit_in_bytes"), ("cpu", "cpu.shares")):
        mount = next((m for m in (root / controller, root / "cpu,cpuacct")
                      if (m / probe).exists()), None)
        if mount is None:
            raise Unavailable(f"cgroup v1: no {controller} hierarchy at {root}")
        parent = mount / "gavel" / node_id
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise Unavailable(f"cgroup v1 {controller} at {mount} is not writable: "
                              f"{_why(exc)}") from None
        parents[controller] = parent
    return Hierarchy("v1", parents, cpu_limit)


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)
