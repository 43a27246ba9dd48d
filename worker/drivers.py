"""The driver interface: how an instance's workload starts, ends, stops and is found again,
whatever runs it (STYLE rule 18, after Nomad's driver plugins).

Rules:
1. A `Driver` starts one run of an instance's workload (`start`) and finds a run an earlier
   worker left behind (`adopt`); a `Run` is waited on, stopped with a grace period,
   detached (left running for the next worker), and cleaned up once it has ended. The
   lifecycle (`worker.instance`, `worker.supervisor`) only ever talks to these two.
2. `start` raises `StartFailed` with the fixed reason and the sentence the operator reads
   ("driver failed to start" and why, unless another reason says it); nothing else escapes
   it.
3. `Run.record` writes what finds the run again into the instance's local record (a pid and
   its start time, a container id); `Driver.adopt` reads it back, and trusts it only after
   checking the run is still the one recorded. It gives None only when it knows the run is
   gone (or not the one recorded); when it cannot tell (its engine did not answer) it
   raises `CannotTell`, and the supervisor asks again later rather than end a run that
   may be healthy.
4. `Run.exceeded(code)` says whether the kernel killed that run for its memory: the same
   fixed reason (`Reason.MEMORY_EXCEEDED`) whatever ran it.
5. The process driver (`ProcessDriver`) is the exec driver of `worker.driver`, unchanged;
   with a cgroup hierarchy every run enters the instance's one cgroup (`worker.cgroups`),
   and every run and exec check is confined as the supervisor's `confine` says
   (`worker.isolation`).
6. A worker killed after a process started and before it recorded the pid (a first run,
   or a restart's) leaves the award's record only: the next one finds the run by the
   GAVEL_* variables of its environment (`worker.driver.unrecorded`) and adopts it, as a
   container is found by its labels - never a second copy beside it.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from gavel.shared.reasons import Reason
from gavel.shared.spec import Spec
from gavel.worker.cgroups import Cgroup, Hierarchy
from gavel.worker.driver import Process, terminate, unrecorded
from gavel.worker.execsession import ProcessSession, Session
from gavel.worker.isolation import RootRefused
from gavel.worker.localstate import LocalInstance
from gavel.worker.probes import exec_on_host

__all__ = ["CannotTell", "Confine", "Driver", "Held", "ProcessDriver", "ProcessRun", "Run",
           "StartFailed", "Target", "Unavailable", "volume_env"]


class Confine(Protocol):
    """What a child of a held instance runs before its command (`join`: an exec check
    beside that process): `worker.supervisor.Supervisor.confine`. Raises RootRefused, or
    OSError when it cannot be isolated."""

    def __call__(self, held: Any, *, join: int | None = None
                 ) -> Callable[[], None] | None: ...


class Held(Protocol):
    """What a driver reads of a held instance (`worker.instance.Held`)."""

    local: LocalInstance
    #: The award's secret values (None until asked of the broker again).
    secret_env: dict[str, str] | None
    #: The instance's cgroup, which the exec driver makes or finds.
    cgroup: Cgroup | None

    @property
    def id(self) -> str: ...

    @property
    def attempt(self) -> int: ...


class CannotTell(Exception):
    """`Driver.adopt` could not learn whether the recorded run still runs (rule 3): the
    sentence says why (the engine's error, in its words)."""


class StartFailed(Exception):
    """The workload could not be started: `reason` (a fixed one, `Reason.DRIVER_FAILED`
    unless said) and `detail` (rule 2)."""

    def __init__(self, detail: str, reason: str = Reason.DRIVER_FAILED) -> None:
        super().__init__(detail)
        self.detail = detail
        self.reason = reason


class Run(Protocol):
    """One run of an instance's workload (rule 1)."""

    @property
    def started(self) -> float:
        """Wall-clock time the run began (a check's grace period counts from it)."""
        ...

    @property
    def adopted(self) -> bool:
        """Found again after a worker restart (its exit status may be unknown)."""
        ...

    def describe(self) -> str:
        """How the ``running`` event names it: ``pid 123``, ``container 0123456789ab``."""
        ...

    def record(self, local: LocalInstance) -> None:
        """Rule 3."""
        ...

    async def wait(self) -> int | None:
        """The exit status once the run has ended (None: unknown)."""
        ...

    async def stop(self, grace_s: float) -> int | None:
        """Ask it to stop, kill it after `grace_s`; its exit status."""
        ...

    def detach(self) -> None:
        """Stop watching it without touching it: it keeps running for the next worker."""
        ...

    async def cleanup(self, stopped: bool) -> None:
        """It ended (`stopped`: by `stop`) and runs again: remove what it left behind (a
        process group's strays, the exited container)."""
        ...

    async def release(self) -> None:
        """The instance has ended: let go of what outlives a run (an exited container)."""
        ...

    def exceeded(self, code: int | None) -> bool:
        """Rule 4."""
        ...

    async def execute(self, command: Sequence[str], env: Mapping[str, str],
                      cwd: Path) -> tuple[bool, str]:
        """An exec check's command where the run is (`worker.probes.Execute`)."""
        ...

    async def open(self, command: Sequence[str], env: Mapping[str, str], cwd: Path, *,
                   tty: bool = False, rows: int = 0, cols: int = 0) -> Session:
        """A `gavel exec` command where the run is, confined as its exec checks are
        (`worker.execsession`); raises OSError, or the engine's error, when it cannot
        start."""
        ...


class Target(NamedTuple):
    """Where a `gavel exec` command runs (`worker.execsession` rule 1): the instance's
    current run and attempt, its environment less its secret values, its directory."""

    run: Run
    attempt: int
    env: dict[str, str]
    cwd: Path


class Driver(Protocol):
    """Starts and re-adopts runs of one kind of workload (rule 1)."""

    async def start(self, held: Held, env: Mapping[str, str], cwd: Path) -> Run:
        """A new run of `held`'s workload with environment `env`, its directory `cwd`."""
        ...

    async def adopt(self, held: Held) -> Run | None:
        """The run an earlier worker recorded for `held` if it still runs, else None; raises
        `CannotTell` when it cannot tell (rule 3)."""
        ...


class ProcessRun:
    """A run of the exec driver: `worker.driver.Process`, in its cgroup when it has one."""

    def __init__(self, proc: Process, cgroup: Cgroup | None,
                 check_confine: Callable[[], Callable[[], None] | None] | None = None) -> None:
        self.proc = proc
        self.cgroup = cgroup
        #: What an exec check beside it runs before its command: asked once, at the first.
        self._check_confine = check_confine
        self._confined: tuple[Callable[[], None] | None] | None = None

    @property
    def started(self) -> float:
        return self.proc.create_time

    @property
    def adopted(self) -> bool:
        return self.proc.adopted

    def describe(self) -> str:
        return f"pid {self.proc.pid}"

    def record(self, local: LocalInstance) -> None:
        local.pid, local.create_time = self.proc.pid, self.proc.create_time

    async def wait(self) -> int | None:
        return await self.proc.wait()

    async def stop(self, grace_s: float) -> int | None:
        return await terminate(self.proc, grace_s)

    def detach(self) -> None:
        self.proc.detach()

    async def cleanup(self, stopped: bool) -> None:
        if not stopped and not self.proc.adopted:  # `stop` already killed the group
            self.proc.signal(signal.SIGKILL)  # what the leader left in its group

    async def release(self) -> None:
        """Nothing: the instance's cgroup, if it has one, goes with the instance
        (`worker.supervisor`), and with it whatever its processes left."""

    def exceeded(self, code: int | None) -> bool:
        return self.cgroup is not None and self.cgroup.exceeded(code)

    async def execute(self, command: Sequence[str], env: Mapping[str, str],
                      cwd: Path) -> tuple[bool, str]:
        if self._confined is None:
            self._confined = (self._check_confine() if self._check_confine else None,)
        return await exec_on_host(command, env, cwd, self._confined[0])

    async def open(self, command: Sequence[str], env: Mapping[str, str], cwd: Path, *,
                   tty: bool = False, rows: int = 0, cols: int = 0) -> Session:
        if self._confined is None:
            self._confined = (self._check_confine() if self._check_confine else None,)
        return await ProcessSession.spawn(command, env, cwd, confine=self._confined[0],
                                          tty=tty, rows=rows, cols=cols)


class ProcessDriver:
    """The exec driver behind the interface (rule 5)."""

    def __init__(self, *, poll_s: float, cgroups: Hierarchy | None,
                 volumes: Mapping[str, str] | None = None, confine: Confine | None = None,
                 node_id: str = "") -> None:
        self.poll_s = poll_s
        #: Whose runs these are: a run never recorded is found by it (rule 6).
        self.node_id = node_id
        self.cgroups = cgroups
        self.volumes = dict(volumes or {})
        self.confine = confine

    async def start(self, held: Held, env: Mapping[str, str], cwd: Path) -> ProcessRun:
        spec: Spec = held.local.placement.spec
        try:
            confine = self.confine(held) if self.confine is not None else None
        except RootRefused as exc:
            raise StartFailed("", Reason.ROOT_REFUSED) from exc
        except OSError as exc:
            raise StartFailed(f"cannot isolate it: {exc.strerror or exc}") from exc
        cgroup = held.cgroup
        if cgroup is None and self.cgroups is not None:
            try:
                cgroup = held.cgroup = self.cgroups.create(held.id, spec.cpu, spec.memory_mb,
                                                           spec.pids)
            except OSError as exc:
                raise StartFailed(f"cannot make its cgroup: {exc.strerror or exc}") from exc
        if cgroup is not None:
            cgroup.started()  # this run's OOM kills count from here
        if spec.volumes:
            env = {**env, **volume_env(spec, self.volumes)}
        try:
            proc = Process.spawn(spec.command, env=env, cwd=cwd, poll_s=self.poll_s,
                                 cgroup=cgroup, confine=confine)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            # missing binary, not executable, NUL byte, could not enter its cgroup
            raise StartFailed(str(exc)) from exc
        return ProcessRun(proc, cgroup, self._check(held, proc))

    def _check(self, held: Held, proc: Process
               ) -> Callable[[], Callable[[], None] | None] | None:
        """What an exec check beside `proc` runs first (asked at the first check)."""
        confine = self.confine
        return None if confine is None else (lambda: confine(held, join=proc.pid))

    async def adopt(self, held: Held) -> ProcessRun | None:
        local = held.local
        if self.cgroups is not None and held.cgroup is None:
            # it keeps its cgroup; an ended one's goes when the instance ends
            spec = local.placement.spec
            held.cgroup = self.cgroups.find(held.id, spec.memory_mb, spec.pids)
        if not local.pid and self.node_id:  # rule 6: started, and its worker killed then
            found = unrecorded(held.id, held.attempt, self.node_id)
            if found is not None:
                local.pid, local.create_time = found
                local.restart_at = 0.0  # a restart's run, started: no longer waiting
        if not local.pid or local.restart_at:  # never started, or waiting to start again
            return None
        proc = Process.adopt(local.pid, local.create_time, poll_s=self.poll_s)
        return None if proc is None else ProcessRun(proc, held.cgroup, self._check(held, proc))


def volume_env(spec: Spec, volumes: Mapping[str, str]) -> dict[str, str]:
    """A process's host volumes: ``GAVEL_VOLUME_<NAME>`` is the host path of each (a name's
    '-' and '.' read as '_')."""
    out = {}
    for v in spec.volumes:
        if v.name not in volumes:
            raise StartFailed(f"this node holds no host volume {v.name!r}")
        key = v.name.upper().replace("-", "_").replace(".", "_")
        out[f"GAVEL_VOLUME_{key}"] = volumes[v.name]
    return out


class Unavailable:
    """The driver of a kind of workload this node cannot run: every start fails with
    `reason` (an award that bypassed the node's decline, a worker restarted without its
    engine). With `unsure`, what runs it may still come (an engine asked again,
    `worker.engine` rule 5): `adopt` cannot tell, and says `unsure`."""

    def __init__(self, reason: str, unsure: str = "") -> None:
        self.reason = reason
        self.unsure = unsure

    async def start(self, held: Held, env: Mapping[str, str], cwd: Path) -> Run:
        raise StartFailed(self.reason)

    async def adopt(self, held: Held) -> Run | None:
        if self.unsure:
            raise CannotTell(self.unsure)
        return None
