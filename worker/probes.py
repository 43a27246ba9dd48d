"""Running health checks next to a process: the probes, and the task that drives a
`worker.checks.CheckMachine` with them.

Rules:
1. ``http``: a GET of the check's path on 127.0.0.1 at the instance's port, over a plain
   HTTP/1.1 connection (``Connection: close``); it passes when the status equals the
   check's `status`. ``tcp``: a connection to that port is accepted. ``exec``: the command
   exits 0, run with the instance's environment and directory, in a session of its own, as
   the instance's own identity and in its mount namespace (`worker.isolation`).
2. Every probe is bounded by the check's `timeout_s`; an exec probe still running then (or
   when the checks stop) is killed with its whole process group, so a check never outlives
   the run it watches.
3. A probe never raises: whatever goes wrong is a failure whose output says what.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from urllib.parse import quote

from gavel.shared.messages import Health
from gavel.shared.spec import Check
from gavel.shared.timing import Timing
from gavel.transport.tasks import Tasks
from gavel.worker.checks import OUTPUT_MAX, Change, CheckMachine
from gavel.worker.driver import SecretsUnavailable

__all__ = ["HOST", "Execute", "Prober", "exec_on_host", "probe"]

log = logging.getLogger("gavel.worker.checks")
#: How long the body of a failed check is read: a machine wait of `Timing` (rule 3).
_TIMING = Timing()

#: Where checks reach the instance: it runs on this host.
HOST = "127.0.0.1"
#: The most of a response's head an http probe reads.
_HEAD_MAX = 16 * 1024
#: The most of a response's body a failed http check quotes.
_BODY_QUOTED = 128
#: Characters of a path sent as they are (RFC 3986 reserved and unreserved, and '%').
_PATH_SAFE = "/?#[]@!$&'()*+,;=:-._~%"

Env = Callable[[], Awaitable[Mapping[str, str]]]
#: How an exec check's command runs: (command, env, cwd) -> (passed, output). On the host by
#: default; a container's runs inside it.
Execute = Callable[[Sequence[str], Mapping[str, str], Path], Awaitable[tuple[bool, str]]]


async def probe(check: Check, *, ports: Mapping[str, int], env: Env, cwd: Path,
                confine: Callable[[], None] | None = None,
                execute: Execute | None = None,
                explain_s: float = _TIMING.explain_s) -> tuple[bool, str]:
    """Run `check` once (rules 1-3): whether it passed, and its output (truncated);
    `explain_s`: how long a failed HTTP check reads the body that says why."""
    try:
        async with asyncio.timeout(check.timeout_s):
            if check.type == "exec":
                ok, out = (await execute(check.command, await env(), cwd) if execute
                           else await exec_on_host(check.command, await env(), cwd, confine))
            else:
                port = ports.get(check.port or "")
                if port is None:
                    return False, f"port {check.port!r} was not assigned to this instance"
                ok, out = (await _http(port, check.path, check.status, explain_s)
                           if check.type == "http" else await _tcp(port))
    except TimeoutError:
        ok, out = False, (f"still running after {check.timeout_s:g}s: killed"
                          if check.type == "exec" else
                          f"no answer within {check.timeout_s:g}s")
    except SecretsUnavailable as exc:
        ok, out = False, str(exc)
    except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        ok, out = False, _describe(exc)
    return ok, out[:OUTPUT_MAX]


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, asyncio.IncompleteReadError):
        return "connection closed before a complete response"
    if isinstance(exc, asyncio.LimitOverrunError):
        return "response head too long"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[:1].lower() + exc.strerror[1:]
    return str(exc) or type(exc).__name__


async def _tcp(port: int) -> tuple[bool, str]:
    _reader, writer = await asyncio.open_connection(HOST, port)
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True, f"connected to {HOST}:{port}"


async def _http(port: int, path: str, want: int, explain_s: float) -> tuple[bool, str]:
    reader, writer = await asyncio.open_connection(HOST, port, limit=_HEAD_MAX)
    try:
        target = quote(path, safe=_PATH_SAFE)
        writer.write((f"GET {target} HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
                      "User-Agent: gavel-check\r\nAccept: */*\r\nConnection: close\r\n\r\n"
                      ).encode("ascii"))
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        version, _, rest = line.partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/") or not (code.isdigit() and len(code) == 3):
            raise ValueError(f"not an HTTP response: {line[:80]!r}")
        status = int(code)
        out = f"HTTP {status} {reason}".rstrip()
        if status == want:
            return True, out
        body = b""
        with contextlib.suppress(TimeoutError, OSError):  # the body only explains the status
            async with asyncio.timeout(explain_s):
                body = await reader.read(_BODY_QUOTED)
        text = " ".join(body.decode("utf-8", "replace").split())
        return False, f"{out} (expected {want})" + (f": {text}" if text else "")
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def exec_on_host(command: Sequence[str], env: Mapping[str, str], cwd: Path,
                       confine: Callable[[], None] | None = None) -> tuple[bool, str]:
    """An exec check's command as a child of the worker (rules 1 and 2), confined as
    `confine` says (`worker.isolation`)."""
    proc = await asyncio.create_subprocess_exec(
        *command, env=dict(env), cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        start_new_session=True, preexec_fn=confine)
    tail = b""
    try:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(4096):
            tail = (tail + chunk)[-OUTPUT_MAX:]
        code = await proc.wait()
    finally:
        if proc.returncode is None:  # timed out or cancelled: the group goes too (rule 2)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                await asyncio.shield(proc.wait())
    text = tail.decode("utf-8", "replace").strip()
    return code == 0, f"exit status {code}" + (f": {text}" if text else "")


class Prober:
    """Runs one run's checks until it is unhealthy or stopped. `on_change` is awaited for
    every change of health; `verdict` resolves with the change to unhealthy.

    The machine's clock is monotonic; `started` (wall clock, as a process's start time is
    known) only places the grace period."""

    def __init__(self, checks: Sequence[Check], *, started: float, ports: Mapping[str, int],
                 env: Env, cwd: Path, on_change: Callable[[Change], Awaitable[None]],
                 confine: Callable[[], None] | None = None,
                 execute: Execute | None = None,
                 explain_s: float = _TIMING.explain_s) -> None:
        self._checks = list(checks)
        #: How long a failed HTTP check reads the body that says why (the worker's `Timing`).
        self._explain_s = explain_s
        #: What an exec check's child runs before its command (`worker.isolation`).
        self._confine = confine
        ago = max(0.0, time.time() - started)
        self.machine = CheckMachine(self._checks, started=time.monotonic() - ago)
        self._ports = dict(ports)
        self._env = env
        self._cwd = cwd
        self._execute = execute
        self._on_change = on_change
        self.verdict: asyncio.Future[Change] = asyncio.get_running_loop().create_future()
        #: Its checking loop (`transport.tasks`): a crash in it is said as it happens.
        self._tasks = Tasks("checks", log)

    def start(self) -> None:
        if self._checks:
            self._tasks.spawn(self._run(), name="checks")

    def stop(self) -> None:
        """Cancel the checks without waiting (an abort; `aclose` awaits them)."""
        self._tasks.cancel()

    async def aclose(self, timeout: float) -> None:
        """End the checks and await them, up to `timeout` (`transport.tasks` rule 3): an exec
        probe under way is killed with its group before this returns (rule 2)."""
        await self._tasks.aclose(timeout)

    async def _run(self) -> None:
        machine = self.machine
        running: dict[asyncio.Task[tuple[bool, str]], int] = {}
        try:
            while not machine.final:
                for i in machine.due(time.monotonic()):
                    task = asyncio.ensure_future(probe(self._checks[i], ports=self._ports,
                                                       env=self._env, cwd=self._cwd,
                                                       confine=self._confine,
                                                       execute=self._execute,
                                                       explain_s=self._explain_s))
                    running[task] = i
                wake = machine.wake_at()
                timeout = None if wake is None else max(0.0, wake - time.monotonic())
                if not running:
                    await asyncio.sleep(timeout or 0.0)
                    continue
                done, _ = await asyncio.wait(running, timeout=timeout,
                                             return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    ok, output = task.result()
                    change = machine.result(running.pop(task), ok, output)
                    if change is not None:
                        await self._on_change(change)
                        if change.health is Health.UNHEALTHY and not self.verdict.done():
                            self.verdict.set_result(change)
                            return
        finally:
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
