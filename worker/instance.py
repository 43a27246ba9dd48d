"""One instance's life on this node: start its workload, watch it and its checks, restart it
in place as its restart policy says, and end it once. Whatever runs it (a process, a
container) is its driver's (`worker.drivers`): nothing here asks which.

Rules:
1. A process that ends as its restart policy says it should be restarted
   (`worker.restarts`), or that its checks (`worker.probes`) find unhealthy, is started
   again in the same directory with the same ports after the policy's back-off. Each
   restart is counted in ``agent.json`` and reported (``restarted``, with the exit status
   and the count) before the wait begins, so neither the count nor a wait under way is lost
   with the worker: the next one resumes it.
2. Past the policy the instance ends ``failed`` with `Reason.RESTARTS_EXHAUSTED`, the last
   exit status (or the failing check and its output) and the tail of its ``stderr.log``:
   the broker places it elsewhere.
3. A stop (cancel, timeout, fence, worker shutdown) is never followed by a restart, and ends
   a back-off at once. The timeout counts from the first start of the attempt, restarts
   included, as the broker's backstop does.
4. Health: each run of the process is `checking` until its checks pass (healthy at once
   with none); ``healthy`` and ``unhealthy`` are reported as they happen, and every event
   of the instance carries its restarts so far.
5. Secret values live in memory only; an instance re-adopted after a worker restart asks
   the broker for them again when it needs them (to restart, or to run an exec check).
6. Where the node enforces resources (`worker.cgroups`), every run of the process enters
   the instance's one cgroup (made at its first start, or when a re-adopted instance's is
   gone), its OOM kills counted from that run's start. A run the kernel killed for its
   memory is `Reason.MEMORY_EXCEEDED`: restarted like any non-zero exit (the reason on the
   ``restarted`` event), and past the policy handed back with that reason in the detail.
7. Every ``restarted`` event names why the run ended with a fixed reason - the kernel's
   memory kill, a failing check, a non-zero exit, an exit - and its detail, so status and
   events say it while the instance restarts.
   The cgroup stays between restarts; `Host.end` removes it.
8. Every run of a process, and every exec check beside it, is confined as `Host.confine`
   says (`worker.isolation`; the exec driver, `worker.drivers`, asks it):
   a spec asking for root on a node that does not allow it ends `Reason.ROOT_REFUSED`; an
   instance whose process was found outside its cgroup ends `Reason.ESCAPED_CGROUP`. One
   running as a uid of its own has its directory as HOME (the worker's is not its to use).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gavel.shared.messages import EventType, Health, InstanceState
from gavel.shared.reasons import Reason
from gavel.shared.spec import Spec, restart_policy
from gavel.shared.timing import Timing
from gavel.worker.cgroups import Cgroup
from gavel.worker.checks import Change
from gavel.worker.driver import SecretsUnavailable, instance_env, stderr_tail
from gavel.worker.drivers import Driver, Run, StartFailed
from gavel.worker.localstate import LocalInstance
from gavel.worker.probes import Prober
from gavel.worker.restarts import describe_exit, plan, restarts_on_exit

__all__ = ["Begin", "Held", "Host", "Life", "Report", "Secrets"]

log = logging.getLogger("gavel.worker")


class Report(Protocol):
    """One event out: ``report(instance_id, attempt, type, reason, detail, exit_code)``,
    with the instance's real ports and the awarded ports found taken, when there are any,
    the check that decided a change of health, and the restarts of the attempt so far."""

    async def __call__(self, instance_id: str, attempt: int, type_: str, reason: str,
                      detail: str, exit_code: int | None, *,
                      ports: dict[str, int] | None = None,
                      taken: list[int] | None = None, check: str = "",
                      restarts: int = 0) -> None: ...


#: The secret values of an instance's award, asked of the broker again: (instance, attempt)
#: -> the values, or None when the broker did not give them.
Secrets = Callable[[str, int], Awaitable[dict[str, str] | None]]


class Begin(enum.Enum):
    """Where an instance's life begins."""

    SPAWN = "spawn"  # a new award: start the process
    WATCH = "watch"  # a re-adopted process: watch it
    ENDED = "ended"  # a service's process ended while no worker watched it
    BACKOFF = "backoff"  # a restart's back-off was under way when the worker stopped
    STOPPED = "stopped"  # stopped while its driver could not tell whether it still ran


@dataclass(eq=False)
class Held:
    """An instance this node holds, and what its life needs in memory."""

    local: LocalInstance
    #: The current run of its workload (`worker.drivers.Run`): a process, a container.
    proc: Run | None = None
    task: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None
    #: Reason.CANCELLED, TIMEOUT, WORKER_STOPPED or FENCED once the stop has begun.
    stopping: str | None = None
    #: Ports of the award found taken outside gavel (reported with provisioning, running).
    taken: list[int] = field(default_factory=list)
    #: The award's secret values (rule 5); None after a worker restart until needed.
    secret_env: dict[str, str] | None = None
    #: Set when a stop begins: it ends a restart's back-off at once (rule 3).
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    #: The checks of the current run of the process (None: no checks, or not running).
    prober: Prober | None = None
    health: Health = Health.UNKNOWN
    #: The instance's cgroup, when the node enforces resources (rule 6).
    cgroup: Cgroup | None = None

    @property
    def id(self) -> str:
        return self.local.placement.instance_id

    @property
    def attempt(self) -> int:
        return self.local.placement.attempt


class Host(Protocol):
    """What an instance's life uses of the supervisor that holds it."""

    node_id: str
    timing: Timing

    def driver(self, spec: Spec) -> Driver: ...

    def instance_dir(self, instance_id: str) -> Path: ...

    def persist(self) -> None: ...

    def arm_timeout(self, held: Held) -> None: ...

    async def end(self, held: Held, type_: str, reason: str, detail: str,
                  exit_code: int | None = None, *, report: bool = True,
                  remember: bool = True) -> None: ...

    async def emit(self, held: Held, type_: str, reason: str, detail: str,
                   exit_code: int | None, *, ports: dict[str, int] | None = None,
                   taken: list[int] | None = None, check: str = "") -> None: ...

    async def secrets(self, instance_id: str, attempt: int) -> dict[str, str] | None: ...

    def confine(self, held: Held, *, join: int | None = None) -> Callable[[], None] | None:
        """What a child of `held` runs before its command (rule 7; `join`: an exec check
        beside that process). Raises RootRefused, or OSError when it cannot be isolated."""

    def home(self, held: Held) -> str | None:
        """The instance's HOME when it is not the worker's (rule 7)."""


class Life:
    """The life of `held` on `host`, from `run(begin)` until it has ended."""

    def __init__(self, host: Host, held: Held) -> None:
        self.host = host
        self.held = held

    async def run(self, begin: Begin) -> None:
        """Run the instance until it ends, restarting its process in place as its policy
        says; it ends exactly once, through `Host.end`."""
        held = self.held
        if begin is Begin.STOPPED:
            await self._stopped(None)
            return
        if begin is Begin.WATCH:
            self._start_checks()
        elif begin is not Begin.SPAWN:  # no process runs: it is to be started again
            held.health = Health.CHECKING
        if begin is Begin.SPAWN and not await self._start(first=True):
            return
        if begin is Begin.BACKOFF and not await self._back_off():
            return
        if begin is Begin.ENDED and not await self._again(None, None):
            return
        while True:
            code, unhealthy = await self._watch()
            if held.stopping is not None:
                await self._stopped(code)
                return
            if not await self._again(code, unhealthy):
                return

    # -- one run of the process -------------------------------------------------------------

    async def _start(self, *, first: bool) -> bool:
        """Start the process (again); False when the instance ended instead."""
        held, host = self.held, self.host
        if held.stopping is not None:  # stopped before it started
            await self._stopped(None)
            return False
        placement = held.local.placement
        try:
            env = await self.env()
            if held.stopping is not None:
                await self._stopped(None)
                return False
        except (OSError, ValueError, SecretsUnavailable) as exc:
            await host.end(held, EventType.FAILED, Reason.DRIVER_FAILED, str(exc))
            return False
        try:
            held.proc = await host.driver(placement.spec).start(held, env,
                                                                host.instance_dir(held.id))
        except StartFailed as exc:
            await host.end(held, EventType.FAILED, exc.reason, exc.detail)
            return False
        if held.stopping is not None:  # stopped while the driver was starting it
            await self._stopped(await held.proc.stop(host.timing.kill_grace_s))
            return False
        local = held.local
        held.proc.record(local)
        local.restart_at = 0.0
        if first:
            local.started_at, local.state = time.time(), InstanceState.RUNNING
        host.persist()
        if first:
            host.arm_timeout(held)
            await host.emit(held, EventType.RUNNING, "", held.proc.describe(), None,
                            ports=dict(placement.ports), taken=list(held.taken))
        self._start_checks()
        return True

    async def _watch(self) -> tuple[int | None, Change | None]:
        """Wait for the process to end, or its checks to find it unhealthy (then stop it);
        its exit status, and the change to unhealthy if that is what ended it."""
        held = self.held
        proc, prober = held.proc, held.prober
        assert proc is not None
        exited = asyncio.ensure_future(proc.wait())
        try:
            if prober is None:
                return await exited, None
            await asyncio.wait((exited, prober.verdict), return_when=asyncio.FIRST_COMPLETED)
            if exited.done():
                return exited.result(), None
            unhealthy = prober.verdict.result()
            if held.stopping is None:
                log.info("instance %s is unhealthy (%s): stopping its process", held.id,
                         unhealthy.check)
                return await proc.stop(self.host.timing.kill_grace_s), unhealthy
            return await exited, unhealthy
        finally:
            exited.cancel()
            if prober is not None:
                held.prober = None
                await prober.aclose(self.host.timing.close_s)  # none outlives this run

    # -- after a run ------------------------------------------------------------------------

    async def _again(self, code: int | None, unhealthy: Change | None) -> bool:
        """The process ended (`code`) or was found unhealthy: restart it after the policy's
        back-off (True once it runs again), or end the instance (False)."""
        held, host = self.held, self.host
        local = held.local
        spec = local.placement.spec
        policy = restart_policy(spec)
        oom = unhealthy is None and held.proc is not None and held.proc.exceeded(code)
        if unhealthy is None and (not restarts_on_exit(spec, code) or not policy.attempts):
            await self._exited(code, oom)
            return False
        if held.proc is not None:
            await held.proc.cleanup(unhealthy is not None)  # what the run left behind
        now = time.time()
        delay, window = plan(policy, local.restart_times, now)
        if unhealthy is not None:
            why = f"unhealthy: {unhealthy.check}: {unhealthy.output}"
        else:
            why = _killed(spec.memory_mb) if oom else describe_exit(code)
        if delay is None:  # rule 2 (and rule 6: the memory named)
            tail = stderr_tail(host.instance_dir(held.id))
            n = len(window)
            await host.end(held, EventType.FAILED, Reason.RESTARTS_EXHAUSTED,
                           (f"{Reason.MEMORY_EXCEEDED}: " if oom else "")
                           + f"{why}, after {n} restart{'' if n == 1 else 's'} within "
                           f"{policy.interval_s:g}s" + (f"; stderr:\n{tail}" if tail else ""),
                           code)
            return False
        local.restarts += 1
        local.restart_times = [*window, now]
        local.restart_at = now + delay
        local.pid, local.create_time = 0, 0.0
        held.proc, held.health = None, Health.CHECKING
        host.persist()  # rule 1: counted before the wait begins
        await host.emit(held, EventType.RESTARTED, _restart_reason(code, unhealthy, oom),
                        f"{why}; restart {len(window) + 1} of {policy.attempts} within "
                        f"{policy.interval_s:g}s, in {delay:g}s", code)
        return await self._back_off()

    async def _back_off(self) -> bool:
        """Wait until the restart is due (a stop ends the wait), then start the process."""
        held = self.held
        wait = held.local.restart_at - time.time()
        if wait > 0 and held.stopping is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await held.stopped.wait()
        return await self._start(first=False)

    async def _exited(self, code: int | None, oom: bool) -> None:
        """The process ended and is not restarted: the instance ends as its exit says (or
        the kernel, when it was killed for its memory: rule 6)."""
        held, end = self.held, self.host.end
        if oom:
            await end(held, EventType.FAILED, Reason.MEMORY_EXCEEDED,
                      _killed(held.local.placement.spec.memory_mb), code)
        elif code is None:
            await end(held, EventType.EXITED, "",
                      "exit status unknown: re-adopted process" if held.proc is not None
                      else "exit status unknown: process ended while the worker was down")
        elif code == 0:
            await end(held, EventType.EXITED, "", "", 0)
        else:
            await end(held, EventType.FAILED, Reason.EXITED_NONZERO, "", code)

    async def _stopped(self, code: int | None) -> None:
        """The instance ends as the stop that began says."""
        held, end = self.held, self.host.end
        why, spec = held.stopping, held.local.placement.spec
        if why == Reason.CANCELLED:
            await end(held, EventType.CANCELLED, Reason.CANCELLED, "", code)
        elif why == Reason.TIMEOUT:
            await end(held, EventType.FAILED, Reason.TIMEOUT,
                      f"ran longer than {spec.timeout_s:g}s", code)
        elif why == Reason.ESCAPED_CGROUP:  # rule 7
            await end(held, EventType.FAILED, Reason.ESCAPED_CGROUP, "", code)
        elif why == Reason.WORKER_STOPPED:  # not the instance's end: not remembered as run
            await end(held, EventType.FAILED, Reason.WORKER_STOPPED, "the worker shut down",
                      code, remember=False)
        else:
            await end(held, EventType.FAILED, Reason.FENCED, "", code, report=False)

    # -- health and environment -------------------------------------------------------------

    def _start_checks(self) -> None:
        """Rule 4: the run that just began is healthy if it has no checks, else checking
        until its checks say otherwise."""
        held, host = self.held, self.host
        placement = held.local.placement
        if not placement.spec.checks:
            held.health = Health.HEALTHY
            return
        assert held.proc is not None
        held.health = Health.CHECKING

        async def changed(change: Change) -> None:
            held.health = change.health
            if change.health is Health.HEALTHY:
                await host.emit(held, EventType.HEALTHY, "", "", None)
            else:
                await host.emit(held, EventType.UNHEALTHY, Reason.UNHEALTHY, change.output,
                                None, check=change.check)

        held.prober = Prober(placement.spec.checks, started=held.proc.started,
                             ports=placement.ports, env=self.env,
                             cwd=host.instance_dir(held.id), on_change=changed,
                             execute=held.proc.execute, explain_s=host.timing.explain_s)
        held.prober.start()

    async def env(self) -> dict[str, str]:
        """The instance's environment (rule 5 for its secret values)."""
        held = self.held
        placement = held.local.placement
        if held.secret_env is None:
            if placement.spec.secrets:
                got = await self.host.secrets(held.id, held.attempt)
                if got is None:
                    raise SecretsUnavailable("the secret values are not on this node since "
                                             "the worker restarted, and the broker did not "
                                             "give them")
                held.secret_env = got
            else:
                held.secret_env = {}
        home = self.host.home(held)
        return instance_env(
            base=os.environ if home is None else {**os.environ, "HOME": home},
            spec_env=placement.spec.env, secret_env=held.secret_env,
            instance_id=held.id, node_id=self.host.node_id, attempt=held.attempt,
            ports=placement.ports, port_order=placement.spec.ports)


def _killed(memory_mb: int) -> str:
    """How a run the kernel killed for its memory ended (rule 6)."""
    return f"killed by the kernel at its {memory_mb} MB limit"


def _restart_reason(code: int | None, unhealthy: Change | None, oom: bool) -> Reason:
    """Rule 7: why a run that is restarted ended."""
    if oom:
        return Reason.MEMORY_EXCEEDED
    if unhealthy is not None:
        return Reason.UNHEALTHY
    return Reason.EXITED_ZERO if code == 0 else Reason.EXITED_NONZERO
