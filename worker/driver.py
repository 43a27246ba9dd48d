"""The exec driver: an instance is a real child process, leader of its own process group.

Rules: the child gets a minimal environment (PATH, HOME, LANG from the worker, then the spec's
env, then secrets, then the GAVEL_* variables, which nothing can override), its own
directory as cwd, and its own session, so a signal to the group reaches everything it forked.
Stopping is SIGTERM to the group, SIGKILL after the grace period. A process adopted from an
earlier worker is watched by polling (it is no longer our child) and is only ever signalled
after its pid and start time are checked again, so a recycled pid is never hit.

A child given a cgroup (`worker.cgroups`) enters it between fork and exec, so its command
runs under its limits from the first instruction; one that cannot enter never runs. Then it
is confined (`worker.isolation`: its own uid, mount namespace, no new privileges), again
before its command runs. Its log files are opened by the worker without following a link
and only if they are regular files: the directory is the instance's own, and a link it
planted there must not make the worker write elsewhere.

Children are `subprocess.Popen` objects watched through a pidfd, not asyncio subprocess
transports: a transport kills its child when it is closed or garbage-collected, and an
instance must outlive the worker that started it (``Agent.stop(kill_children=False)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from gavel.transport.tasks import Tasks
from gavel.worker.cgroups import Cgroup
from gavel.worker.localstate import process_alive, process_start_time
from gavel.worker.logfiles import open_regular

__all__ = ["BASE_ENV_KEYS", "STDERR_TAIL", "Process", "SecretsUnavailable", "instance_env",
           "stderr_tail", "terminate"]

log = logging.getLogger("gavel.worker.driver")

BASE_ENV_KEYS = ("PATH", "HOME", "LANG")
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
#: How much of the end of ``stderr.log`` a failure's detail quotes.
STDERR_TAIL = 1024


class SecretsUnavailable(Exception):
    """The secret values an instance's environment needs are not known here (a re-adopted
    instance: secrets are never written to disk) and the broker did not give them."""


def instance_env(
    *,
    base: Mapping[str, str],
    spec_env: Mapping[str, str],
    secret_env: Mapping[str, str],
    instance_id: str,
    node_id: str,
    attempt: int,
    ports: Mapping[str, int],
    port_order: Sequence[str],
) -> dict[str, str]:
    """The complete environment of one instance; `port_order` decides which port is PORT."""
    env = {key: base[key] for key in BASE_ENV_KEYS if key in base}
    env.setdefault("PATH", _DEFAULT_PATH)
    env.update(spec_env)
    env.update(secret_env)
    env["GAVEL_INSTANCE_ID"] = instance_id
    env["GAVEL_NODE_ID"] = node_id
    env["GAVEL_ATTEMPT"] = str(attempt)
    for name, port in ports.items():
        env[f"GAVEL_PORT_{name.upper()}"] = str(port)
    first = next((ports[n] for n in port_order if n in ports), None)
    if first is None and ports:
        first = next(iter(ports.values()))
    if first is not None:
        env["PORT"] = str(first)
    return env


def unrecorded(instance_id: str, attempt: int, node_id: str) -> tuple[int, float] | None:
    """The run of `instance_id`'s `attempt` that a worker of `node_id` started and was killed
    before it recorded: the oldest live session leader (each run leads its own session)
    whose environment names all three (`instance_env`'s GAVEL_* variables, which nothing
    overrides); its pid and start time, or None."""
    want = {f"GAVEL_INSTANCE_ID={instance_id}".encode(), f"GAVEL_ATTEMPT={attempt}".encode(),
            f"GAVEL_NODE_ID={node_id}".encode()}
    found: list[tuple[float, int]] = []
    with contextlib.suppress(OSError), os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                if os.getsid(pid) != pid:
                    continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = set(f.read().split(b"\0"))
            except OSError:  # gone, or not ours to read
                continue
            started = process_start_time(pid) if want <= env else None
            if started is not None and process_alive(pid, started):
                found.append((started, pid))
    if not found:
        return None
    started, pid = min(found)
    return pid, started


def stderr_tail(cwd: Path, limit: int = STDERR_TAIL) -> str:
    """The last lines of ``stderr.log`` in `cwd`, at most `limit` bytes of them (a line cut
    by the limit is left out unless it is the only one); "" when there is none."""
    try:
        with open_regular(cwd / "stderr.log") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - limit))
            data = f.read(limit)
    except OSError:
        return ""
    text = data.decode("utf-8", "replace").rstrip()
    if size > limit and "\n" in text:
        text = text.split("\n", 1)[1]
    return text


class Process:
    """One running instance: a child this worker spawned, or one it adopted after a restart.

    `wait` gives the exit status of our own children and None for adopted processes, whose
    status went to whoever reaped them.
    """

    def __init__(self, pid: int, create_time: float, *, popen: subprocess.Popen[bytes] | None,
                 group: bool, poll_s: float) -> None:
        self.pid = pid
        self.create_time = create_time
        self.group = group
        self._popen = popen
        self._poll_s = poll_s
        self._exited: asyncio.Future[int | None] | None = None
        self._pidfd: int | None = None
        #: The exit poller, where no pidfd tells of the exit (`transport.tasks`: a crash in
        #: it is said as it happens).
        self._pollers = Tasks("process", log)
        self._poller: asyncio.Task[None] | None = None

    @property
    def adopted(self) -> bool:
        return self._popen is None

    @classmethod
    def spawn(cls, command: Sequence[str], *, env: Mapping[str, str], cwd: Path,
              poll_s: float, cgroup: Cgroup | None = None,
              confine: Callable[[], None] | None = None) -> Process:
        """Start `command` (in `cgroup`, then `confine`-d, when given); raises OSError (or
        ValueError, or SubprocessError when the child cannot enter its cgroup or be
        confined) when it cannot be executed.

        stdout and stderr are appended to ``stdout.log`` / ``stderr.log`` in `cwd`.
        """
        cwd.mkdir(parents=True, exist_ok=True)
        with _log(cwd / "stdout.log") as out, _log(cwd / "stderr.log") as err, \
                (cgroup.entry() if cgroup is not None else contextlib.nullcontext()) as enter:
            popen = subprocess.Popen(
                list(command), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
                stdout=out, stderr=err, start_new_session=True, close_fds=True,
                preexec_fn=_both(enter, confine),
            )
        create_time = process_start_time(popen.pid)
        return cls(popen.pid, create_time if create_time is not None else time.time(),
                   popen=popen, group=True, poll_s=poll_s)

    @classmethod
    def adopt(cls, pid: int, create_time: float, *, poll_s: float) -> Process | None:
        """The process `pid` if it still runs with that start time, else None."""
        if not process_alive(pid, create_time):
            return None
        try:
            group = os.getpgid(pid) == pid
        except ProcessLookupError:
            return None
        return cls(pid, create_time, popen=None, group=group, poll_s=poll_s)

    async def wait(self) -> int | None:
        """The exit status once the process has ended (negative: killed by that signal)."""
        if self._exited is None:
            self._exited = asyncio.get_running_loop().create_future()
            self._watch()
        return await asyncio.shield(self._exited)

    def signal(self, sig: signal.Signals) -> None:
        """Send `sig` to the process group (or the process alone if it leads no group)."""
        if self._popen is None and not process_alive(self.pid, self.create_time):
            return  # an adopted process that ended: its pid may already belong to another
        try:
            if self.group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError as exc:
            log.warning("cannot signal pid %d with %s: %s", self.pid, sig.name, exc)

    def detach(self) -> None:
        """Stop watching without touching the process: it keeps running on its own."""
        self._unwatch()
        if self._exited is not None and not self._exited.done():
            self._exited.cancel()

    # -- watching ---------------------------------------------------------------------------

    def _watch(self) -> None:
        if self._popen is not None and hasattr(os, "pidfd_open"):
            try:
                self._pidfd = os.pidfd_open(self.pid)
            except OSError:  # old kernel, or the child is already reaped
                self._pidfd = None
            if self._pidfd is not None:
                asyncio.get_running_loop().add_reader(self._pidfd, self._on_pidfd)
                return
        self._poller = self._pollers.spawn(self._poll(), name=f"poll {self.pid}")

    def _on_pidfd(self) -> None:
        assert self._popen is not None
        code = self._popen.poll()
        if code is not None:
            self._settle(code)

    async def _poll(self) -> None:
        while True:
            if self._popen is not None:
                code = self._popen.poll()
                if code is not None:
                    self._settle(code)
                    return
            elif not process_alive(self.pid, self.create_time):
                self._settle(None)
                return
            await asyncio.sleep(self._poll_s)

    def _settle(self, code: int | None) -> None:
        self._unwatch(from_poller=True)
        if self._exited is not None and not self._exited.done():
            self._exited.set_result(code)

    def _unwatch(self, from_poller: bool = False) -> None:
        if self._pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        if self._poller is not None and not from_poller:
            self._poller.cancel()
        self._poller = None


def _both(first: Callable[[], None] | None, then: Callable[[], None] | None
          ) -> Callable[[], None] | None:
    if first is None or then is None:
        return first or then

    def both() -> None:
        first()
        then()

    return both


@contextlib.contextmanager
def _log(path: Path) -> Iterator[int]:
    """`path` opened for appending: never through a link, never anything but a regular file
    (a FIFO would block the worker), so a planted name cannot redirect the worker's write."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                 | os.O_CLOEXEC, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{path.name} in the instance's directory is not a "
                                        "regular file")
        os.set_blocking(fd, True)
        yield fd
    finally:
        os.close(fd)


async def terminate(proc: Process, grace_s: float) -> int | None:
    """SIGTERM the group, SIGKILL it if the leader is still there after `grace_s`."""
    proc.signal(signal.SIGTERM)
    try:
        code = await asyncio.wait_for(proc.wait(), grace_s)
    except TimeoutError:
        log.info("pid %d ignored SIGTERM for %.1fs: SIGKILL", proc.pid, grace_s)
        proc.signal(signal.SIGKILL)
        code = await proc.wait()
    if not proc.adopted:
        proc.signal(signal.SIGKILL)  # whatever the leader left behind in its group
    return code
