"""Enforced resources: each instance's process runs in a cgroup of its own holding the cpu,
memory and process count it was awarded.

Rules:
1. One hierarchy per worker, found at start (`detect`) as its ``cgroups`` setting says:
   ``v2`` (the unified hierarchy, with its memory and cpu controllers, and pids where
   offered), ``v1`` (a hierarchy per controller: memory, cpu, and pids where mounted),
   ``auto`` (v2 when the host runs it with both controllers, else v1, else none) or
   ``off``. A hierarchy asked for by name that is not usable is a
   sentence naming why (`Unavailable`); ``auto`` falls back to enforcing nothing.
2. An instance's cgroup is ``gavel/<node-id>/<worker>/<instance-id>`` under the hierarchy's
   root (each v1 controller's), where ``<worker>`` is a key of the worker's state directory
   (`worker_key`; a worker built without one uses ``gavel/<node-id>`` itself):
   two workers on one host under the same node id (tests, a mistaken deploy) each own a
   parent of their own, and one stopping never removes the other's. A parent found missing
   when an instance starts (removed from outside) is made again. Gavel owns
   ``gavel/<node-id>`` and nothing above or beside it; the parents keep the default weight,
   so a node's instances share cpu by their awards among themselves and as one group
   against everything else on the host.
3. Limits: memory at the award's memory_mb, swap included where the kernel accounts it (a
   process is killed at its limit, not paged out past it); cpu a weight in proportion to the
   award's cpu (v1 ``cpu.shares`` 1024 a cpu, v2 ``cpu.weight`` 100 a cpu), and with
   ``cpu = "quota"`` also a hard cap of that many cpus a period (``cpu.cfs_quota_us``,
   ``cpu.max``); the process count at the spec's pids (``pids.max``), threads included, so
   a fork bomb stops at its own limit.
4. The process enters its cgroup before it runs its command: the child writes itself into
   ``cgroup.procs`` between fork and exec (`entry`, descriptors opened before the fork), so
   not one instruction of the command runs unlimited; a child that cannot enter never runs.
5. An OOM kill is read from the kernel's counter (v2 ``memory.events`` oom_kill, v1
   ``memory.oom_control`` oom_kill; a v1 kernel without it: ``memory.failcnt`` rose and
   ``memory.max_usage_in_bytes`` reached the limit), against a reading taken when the process
   started, so a cgroup kept across restarts in place reports each run's own.
6. A cgroup is removed once its process has ended, whatever it left behind killed first; a
   process re-adopted after a worker restart keeps the cgroup it runs in, also one in its
   node's parent (a worker from before per-worker parents): tracked, its pids limit written.
7. Staying in: an unprivileged process cannot write any ``cgroup.procs`` (root owns them all,
   0644), so it cannot leave. The worker still checks (`Cgroup.outside`, each heartbeat): a
   process of the instance that the kernel places elsewhere (an instance allowed root, a
   host admin's mistake) is found and its instance killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import signal
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["MODES", "Cgroup", "Enforcement", "Hierarchy", "Unavailable", "detect", "release",
           "worker_key"]

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
                 memory_mb: int, where: tuple[tuple[str, str], ...] = ()) -> None:
        self.version = version
        self.dirs = dirs
        self.memory_dir = memory_dir
        self.memory_mb = memory_mb
        #: (controller, path as ``/proc/PID/cgroup`` names it) a member is in; v2's
        #: controller is "" (rule 7).
        self.where = where
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

    def outside(self, pids: Iterable[int]) -> list[int]:
        """The processes of `pids` that run outside this cgroup (rule 7); one that ended
        meanwhile is neither in nor out."""
        out = []
        for pid in pids:
            try:
                text = _read(Path(f"/proc/{pid}/cgroup"))
            except OSError:
                continue
            if not _inside(text, self.where):
                out.append(pid)
        return out

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


def _inside(text: str, where: tuple[tuple[str, str], ...]) -> bool:
    """Whether ``/proc/PID/cgroup`` `text` puts the process in (or below) each of `where`."""
    lines = [line.split(":", 2) for line in text.splitlines() if line.count(":") >= 2]
    for controller, path in where:
        got = next((p for _, names, p in lines
                    if (controller in names.split(",") if controller else names == "")), None)
        if got is None or not (got == path or got.startswith(path + "/")):
            return False
    return True


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
                 cpu_limit: CpuLimit, mounts: dict[str, Path] | None = None,
                 pids: bool = False, keyed: bool = False) -> None:
        self.version = version
        #: The worker's own parent cgroup, per controller ("memory", "cpu" and "pids" where
        #: limited; v2: one for all).
        self.parents = parents
        self.cpu_limit = cpu_limit
        #: Where each controller's hierarchy is mounted (rule 7 reads paths against it).
        self.mounts = mounts or {}
        #: Whether each instance's process count is limited (rule 3).
        self.limits_pids = pids
        #: The parents are a worker's own under its node's (`worker_key`, rule 2).
        self.keyed = keyed

    def describe(self) -> str:
        where = ", ".join(sorted({str(p) for p in self.parents.values()}))
        cpu = "weight and quota" if self.cpu_limit == "quota" else "weight"
        pids = ", pids limit" if self.limits_pids else " (no pids controller: no pids limit)"
        return f"cgroup {self.version} at {where}: memory limit and cpu {cpu}{pids} per instance"

    def _dirs(self, instance_id: str) -> tuple[tuple[Path, ...], Path]:
        dirs = tuple(dict.fromkeys(p / instance_id for p in self.parents.values()))
        return dirs, self.parents["memory"] / instance_id

    def _where(self, instance_id: str) -> tuple[tuple[str, str], ...]:
        if self.version == "v2":
            mount = self.mounts.get("memory")
            return () if mount is None else \
                (("", "/" + str((self.parents["memory"] / instance_id).relative_to(mount))),)
        return tuple((c, "/" + str((p / instance_id).relative_to(self.mounts[c])))
                     for c, p in self.parents.items() if c in self.mounts)

    def _remake(self) -> None:
        """Make the parents again (rule 2: removed from outside while this worker ran)."""
        for controller, parent in self.parents.items():
            mount = self.mounts.get(controller)
            if mount is None:
                parent.mkdir(parents=True, exist_ok=True)
                continue
            level = mount
            for name in parent.relative_to(mount).parts:
                if self.version == "v2":
                    _delegate(level)
                level = level / name
                level.mkdir(exist_ok=True)
            if self.version == "v2":
                _delegate(level)
            log.warning("cgroup parent %s was missing: made again", parent)

    def create(self, instance_id: str, cpu: float, memory_mb: int,
               pids: int | None = None) -> Cgroup:
        """The instance's cgroup with its limits written (rule 3); an existing one (left by
        an earlier run) is reused with the limits written again. Raises OSError."""
        dirs, memory_dir = self._dirs(instance_id)
        for d in dirs:
            try:
                d.mkdir(exist_ok=True)
            except FileNotFoundError:
                self._remake()
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
            mem, cpu_dir = memory_dir, self.parents["cpu"] / instance_id
            _limit_v1(mem, limit)
            _write(cpu_dir / "cpu.shares", str(shares_v1(cpu)))
            if self.cpu_limit == "quota":
                _write(cpu_dir / "cpu.cfs_period_us", str(PERIOD_US))
                _write(cpu_dir / "cpu.cfs_quota_us", str(quota_us(cpu)))
        if self.limits_pids and pids is not None:
            _write(self.parents["pids"] / instance_id / "pids.max", str(pids))
        return Cgroup(self.version, dirs, memory_dir, memory_mb, self._where(instance_id))

    def find(self, instance_id: str, memory_mb: int, pids: int | None = None
             ) -> Cgroup | None:
        """The cgroup a re-adopted instance runs in, if it is there (rule 6)."""
        for h in (self, *([Hierarchy(self.version, {c: p.parent for c, p in self.parents
                                                    .items()}, self.cpu_limit, self.mounts,
                                     self.limits_pids)] if self.keyed else [])):
            dirs, memory_dir = h._dirs(instance_id)
            if all(d.is_dir() for d in dirs):
                if h is not self and self.limits_pids and pids is not None:
                    _write(h.parents["pids"] / instance_id / "pids.max", str(pids))
                return Cgroup(self.version, dirs, memory_dir, memory_mb, h._where(instance_id))
        return None

    def close(self) -> None:
        """Remove this worker's parent cgroups if nothing is left in them (instances left
        running for the next worker keep theirs, and so the parent); the node's and
        ``gavel`` above it go only when no other worker uses them (rule 2: rmdir of a cgroup
        with children fails)."""
        for controller, parent in self.parents.items():
            mount = self.mounts.get(controller, parent.parent.parent)
            for level in (parent, *parent.parents):
                if level == mount or mount not in level.parents:
                    break
                try:
                    level.rmdir()
                except FileNotFoundError:
                    continue  # v2: the same directory, removed for another controller
                except OSError:
                    break


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


def worker_key(state_dir: Path | None) -> str:
    """The name of a worker's own parent under its node's (rule 2): the same state directory
    (a restarted worker, re-adopting) gives the same one. Without one (a worker built in a
    test that owns its node id alone) the instances sit in the node's parent itself."""
    if state_dir is None:
        return ""
    return "w" + hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:10]


def detect(mode: Mode, node_id: str, *, root: Path = ROOT, cpu_limit: CpuLimit = "weight",
           state_dir: Path | None = None) -> Enforcement:
    """The hierarchy `mode` names, made ready for `node_id`'s worker keeping its state in
    `state_dir` (rules 1, 2). Raises `Unavailable` when `mode` names one that is not
    usable."""
    if mode == "off":
        return Enforcement.off()
    problems: list[str] = []
    where = "/".join(filter(None, (node_id, worker_key(state_dir))))
    for version, find in (("v2", _v2), ("v1", _v1)):
        if mode not in ("auto", version):
            continue
        try:
            hierarchy = find(root, where, cpu_limit)
            hierarchy.keyed = state_dir is not None
        except Unavailable as exc:
            if mode != "auto":
                raise
            problems.append(str(exc))
            continue
        return Enforcement(hierarchy, f"resources enforced: {hierarchy.describe()}")
    return Enforcement.off("; ".join(problems), missing=True)


def _v2(root: Path, where: str, cpu_limit: CpuLimit) -> Hierarchy:
    """The unified hierarchy at `root` (or, on a hybrid host, `root`/unified) with memory
    and cpu, each level from the root down to the worker's parent delegating both (and
    pids, where the kernel offers it)."""
    mount = next((m for m in (root, root / "unified") if _controllers(m) >= {"memory", "cpu"}),
                 None)
    if mount is None:
        raise Unavailable(f"cgroup v2: no unified hierarchy with the memory and cpu "
                          f"controllers at {root}")
    parent = mount
    try:
        for name in ("gavel", *where.split("/")):
            _delegate(parent)
            parent = parent / name
            parent.mkdir(exist_ok=True)
        _delegate(parent)
    except OSError as exc:
        raise Unavailable(f"cgroup v2 at {mount} is not writable: {_why(exc)} ({parent})"
                          ) from None
    pids = "pids" in _controllers(mount)
    parents = {"memory": parent, "cpu": parent, **({"pids": parent} if pids else {})}
    return Hierarchy("v2", parents, cpu_limit, dict.fromkeys(parents, mount), pids)


def _controllers(path: Path) -> set[str]:
    try:
        return set(_read(path / "cgroup.controllers").split())
    except OSError:
        return set()


def _delegate(cgroup: Path) -> None:
    """Let `cgroup`'s children use memory and cpu, and pids where offered
    (cgroup.subtree_control)."""
    control = cgroup / "cgroup.subtree_control"
    enabled = set(_read(control).split()) if control.exists() else set()
    want = ["memory", "cpu", *(["pids"] if "pids" in _controllers(cgroup) else [])]
    if not set(want) <= enabled:
        _write(control, " ".join(f"+{c}" for c in want))


def _v1(root: Path, where: str, cpu_limit: CpuLimit) -> Hierarchy:
    """The v1 memory and cpu hierarchies under `root` (and pids, where mounted), each with
    the worker's parent made."""
    parents: dict[str, Path] = {}
    mounts: dict[str, Path] = {}
    for controller, probe in (("memory", "memory.limit_in_bytes"), ("cpu", "cpu.shares"),
                              ("pids", "cgroup.procs")):
        mount = next((m for m in (root / controller, root / "cpu,cpuacct")
                      if (m / probe).exists() and controller in m.name.split(",")), None)
        if mount is None:
            if controller == "pids":
                continue
            raise Unavailable(f"cgroup v1: no {controller} hierarchy at {root}")
        parent = mount / "gavel" / where
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            if controller == "pids":
                continue
            raise Unavailable(f"cgroup v1 {controller} at {mount} is not writable: "
                              f"{_why(exc)}") from None
        parents[controller], mounts[controller] = parent, mount
    return Hierarchy("v1", parents, cpu_limit, mounts, "pids" in parents)


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)
