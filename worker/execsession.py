"""One `gavel exec` command where an instance runs: its input, output and exit status, the
same whatever runs the instance (`worker.drivers.Run.open`).

Rules:
1. A process instance's command is a child of the worker confined as the instance's exec
   checks are (`worker.isolation` rule 4 with ``join``): its cgroup, its mount namespace
   (its private /tmp), its uid and gid, no_new_privs; in the instance's directory, with the
   instance's environment less its secret values. A container instance's command runs
   through the engine's exec API inside the container, with the container's environment
   and working directory.
2. Without a terminal, stdout and stderr are two streams; with one (``tty``), the command
   gets a pseudo-terminal of the asked size as its controlling terminal, and its output is
   one stream (``stdout``).
3. `read` gives output as it comes and None once every stream is closed; `kill` ends the
   command and everything it started (its process group; a container exec by its host pid),
   and is safe to call at any time, once it ended too.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import pty
import signal
import socket
import struct
import termios
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from gavel.shared.execstream import CHUNK_MAX, Stream
from gavel.shared.timing import Timing
from gavel.transport.tasks import Tasks

__all__ = ["ContainerSession", "ProcessSession", "Session"]

Chunk = tuple[Stream, bytes]
#: How often an ended exec's code is asked of the engine: `Timing.poll_s` (rule 3 there).
_TIMING = Timing()
log = logging.getLogger("gavel.worker.exec")


class Session(Protocol):
    """A running exec command (rule 3)."""

    async def read(self) -> Chunk | None: ...

    async def write(self, data: bytes) -> None: ...

    async def close_input(self) -> None: ...

    async def wait(self) -> int | None: ...

    def kill(self) -> None: ...

    def close(self) -> None:
        """Let go of what reads and writes it, once it ended."""
        ...


def _winsize(fd: int, rows: int, cols: int) -> None:
    if rows and cols:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class ProcessSession:
    """Rule 1 for a process instance: a confined child of the worker."""

    def __init__(self, proc: asyncio.subprocess.Process, master: int | None) -> None:
        self.proc = proc
        self._master = master
        self._out: asyncio.Queue[Chunk | None] = asyncio.Queue(maxsize=4)
        self._open = 0
        self._pumps = Tasks("exec session", log)  # its output's readers

    @classmethod
    async def spawn(cls, command: Sequence[str], env: Mapping[str, str], cwd: Path, *,
                    confine: Callable[[], None] | None, tty: bool = False, rows: int = 0,
                    cols: int = 0) -> ProcessSession:
        """Start `command` (raises OSError: a missing binary, a step of `confine` failing)."""
        if not tty:
            proc = await asyncio.create_subprocess_exec(
                *command, env=dict(env), cwd=cwd, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True, preexec_fn=confine)
            self = cls(proc, None)
            assert proc.stdout is not None and proc.stderr is not None
            self._pump("stdout", proc.stdout)
            self._pump("stderr", proc.stderr)
            return self
        master, slave = pty.openpty()
        _winsize(slave, rows, cols)

        def child() -> None:  # setsid ran first (start_new_session): take the terminal
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            if confine is not None:
                confine()
        try:
            proc = await asyncio.create_subprocess_exec(
                *command, env={**env, "TERM": env.get("TERM", "xterm")}, cwd=cwd,
                stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                preexec_fn=child)
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        self = cls(proc, master)
        reader = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                     os.fdopen(os.dup(master), "rb", buffering=0))
        self._pump("stdout", reader)
        return self

    def _pump(self, stream: Stream, reader: asyncio.StreamReader) -> None:
        self._open += 1

        async def pump() -> None:
            try:
                while True:
                    try:
                        data = await reader.read(CHUNK_MAX)
                    except OSError:  # a terminal whose last user closed it: EIO
                        data = b""
                    if not data:
                        break
                    await self._out.put((stream, data))
            finally:
                self._open -= 1
                if self._open == 0:
                    await self._out.put(None)
        self._pumps.spawn(pump(), name="exec output")

    async def read(self) -> Chunk | None:
        return await self._out.get()

    async def write(self, data: bytes) -> None:
        if self._master is not None:  # non-blocking (shared with the reader): a full
            while data:                 # terminal is waited out
                try:
                    data = data[os.write(self._master, data):]
                except BlockingIOError:
                    await asyncio.sleep(0.01)
                except OSError:
                    return
            return
        stdin = self.proc.stdin
        if stdin is None or stdin.is_closing():
            return
        with contextlib.suppress(ConnectionError):
            stdin.write(data)
            await stdin.drain()

    async def close_input(self) -> None:
        if self._master is not None:  # a terminal's end of input is its EOF character
            await self.write(b"\x04")
            return
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()

    async def wait(self) -> int | None:
        code = await self.proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):  # what it left behind
            os.killpg(self.proc.pid, signal.SIGKILL)
        return code

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def close(self) -> None:
        self._pumps.cancel()
        if self._master is not None:
            with contextlib.suppress(OSError):
                os.close(self._master)
            self._master = None


class ContainerSession:
    """Rule 1 for a container instance: the engine's exec, its hijacked connection read and
    written on a thread of its own (the engine's frames demultiplexed without a terminal)."""

    def __init__(self, api: Any, exec_id: str, sock: Any, tty: bool,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.api = api
        self.exec_id = exec_id
        self._sock: socket.socket = getattr(sock, "_sock", sock)
        self._keep = sock  # the SDK's wrapper owns the connection: kept while we read
        self._tty = tty
        self._loop = loop
        self._out: asyncio.Queue[Chunk | None] = asyncio.Queue(maxsize=4)
        self._ended = asyncio.Event()
        threading.Thread(target=self._reader, name="gavel-exec", daemon=True).start()

    @classmethod
    async def open(cls, api: Any, container_id: str, command: Sequence[str], *, tty: bool,
                   rows: int = 0, cols: int = 0) -> ContainerSession:
        """Create and start the exec (raises the SDK's errors)."""
        def start() -> tuple[str, Any]:
            exec_id = api.exec_create(container_id, list(command), stdin=True, stdout=True,
                                      stderr=True, tty=tty)["Id"]
            sock = api.exec_start(exec_id, socket=True, tty=tty)
            if tty and rows and cols:
                with contextlib.suppress(Exception):
                    api.exec_resize(exec_id, height=rows, width=cols)
            return exec_id, sock
        exec_id, sock = await asyncio.to_thread(start)
        return cls(api, exec_id, sock, tty, asyncio.get_running_loop())

    def _put(self, item: Chunk | None) -> None:
        fut = asyncio.run_coroutine_threadsafe(self._out.put(item), self._loop)
        with contextlib.suppress(Exception):  # the loop closed under us: nobody reads
            fut.result()

    def _recv(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            part = self._sock.recv(n - len(buf))
            if not part:
                return b""
            buf += part
        return buf

    def _reader(self) -> None:
        try:
            while True:
                if self._tty:
                    data = self._sock.recv(CHUNK_MAX)
                    if not data:
                        break
                    self._put(("stdout", data))
                    continue
                head = self._recv(8)
                if not head:
                    break
                kind, size = head[0], struct.unpack(">I", head[4:8])[0]
                data = self._recv(size)
                if size and not data:
                    break
                self._put(("stderr" if kind == 2 else "stdout", data))
        except OSError:
            pass
        finally:
            self._put(None)
            self._loop.call_soon_threadsafe(self._ended.set)

    async def read(self) -> Chunk | None:
        return await self._out.get()

    async def write(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            await asyncio.to_thread(self._sock.sendall, data)

    async def close_input(self) -> None:
        if self._tty:
            await self.write(b"\x04")
            return
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)

    async def wait(self) -> int | None:
        await self._ended.wait()
        for _ in range(50):  # the stream closes a moment before the engine knows the code
            info = await asyncio.to_thread(self.api.exec_inspect, self.exec_id)
            if not info.get("Running"):
                code = info.get("ExitCode")
                return int(code) if code is not None else None
            await asyncio.sleep(_TIMING.poll_s)
        return None

    def kill(self) -> None:
        """The engine cannot end an exec: its host process is killed (as an exec check's)."""
        def kill() -> None:
            with contextlib.suppress(Exception):
                info = self.api.exec_inspect(self.exec_id)
                if info.get("Running") and info.get("Pid"):
                    os.kill(int(info["Pid"]), signal.SIGKILL)
        threading.Thread(target=kill, daemon=True).start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
        with contextlib.suppress(Exception):
            self._keep.close()
