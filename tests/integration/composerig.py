"""One docker-compose project for a compose test: the repository's compose/ directory copied
to the test's own directory, set up with compose/setup, brought up on free loopback ports
under a project name no one else uses, and torn down (containers, volumes, network) on every
way out.

Rules:
1. The files are compose/'s own, run as compose/README.md says; a copy only so that the keys
   `compose/setup` writes and the secrets it reads stay in the test's directory. What differs
   is what the files leave to the environment: the published ports (GAVEL_PUBLISH_*, each a
   free one) and the image (GAVEL_IMAGE, default gavel:local).
2. Nothing here builds or pulls: the image is compose/build-image's (`make compose-test`
   builds it). Without docker-compose, an engine that answers, or the image, the test skips
   with a sentence saying which.
3. `down --volumes --remove-orphans` runs whatever happened in between, a SIGTERM or SIGHUP
   to the test run included (each becomes SystemExit while a project is up, so the teardown
   runs); `leftovers` says what of the project the engine still holds, so a test can check
   the teardown itself. Only SIGKILL leaves a project behind: its name says whose it was.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from gavel.transport.natsserver import free_port

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("GAVEL_IMAGE", "gavel:local")
#: The published ports compose.yaml and compose.ha.yaml leave to the environment.
PUBLISH = ("NATS", "NATS_2", "NATS_3", "BROKER", "BROKER_2", "BROKER_3", "WORKER_1",
           "WORKER_2", "WORKER_3", "GATEWAY", "HTTP")


def _run(argv: list[str], timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False, **kw)


def require_engine() -> None:
    """Skip, with the reason, where a compose project cannot come up (rule 2)."""
    if shutil.which("docker-compose") is None or shutil.which("docker") is None:
        pytest.skip("docker-compose and docker are not installed (apt-get install docker.io "
                    "docker-compose): the compose tests bring the compose files up for real")
    try:
        ping = _run(["docker", "version", "--format", "{{.Server.Version}}"], timeout=30)
    except subprocess.TimeoutExpired:
        pytest.skip("no Docker Engine answers within 30 s (.ci/dockerd start starts one)")
    if ping.returncode != 0:
        pytest.skip("no Docker Engine answers (.ci/dockerd start starts one): "
                    + " ".join(ping.stderr.split())[:200])
    if _run(["docker", "image", "inspect", IMAGE]).returncode != 0:
        pytest.skip(f"the image {IMAGE} is not built: compose/build-image builds it "
                    "(make compose-test builds it, then runs these tests)")


class Project:
    """A compose project from one of compose/'s files, in `tmp`; a context manager whose exit
    takes it down."""

    def __init__(self, file: str, tmp: Path) -> None:
        self.file = file
        self.dir = tmp / "compose"
        shutil.copytree(ROOT / "compose", self.dir,
                        ignore=shutil.ignore_patterns("auth", ".env", "secrets.toml"))
        self.name = f"gavel-test-{os.getpid()}-{secrets.token_hex(3)}"
        self.ports = {key: free_port() for key in PUBLISH}
        self.all_services: list[str] = []
        self.handlers: dict[int, Any] = {}
        self.env = {**{k: v for k, v in os.environ.items()
                       if not k.startswith(("GAVEL_", "COMPOSE_"))},
                    "GAVEL_IMAGE": IMAGE,
                    **{f"GAVEL_PUBLISH_{k}": str(v) for k, v in self.ports.items()}}

    def __enter__(self) -> Project:
        def leave(signum: int, _frame: Any) -> None:
            for sig in self.handlers:  # a second one must not cut the teardown short
                signal.signal(sig, signal.SIG_IGN)
            raise SystemExit(128 + signum)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            self.handlers[sig] = signal.signal(sig, leave)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc is not None:
                print(self.logs())  # pytest shows it with the failure
            self.down()
        finally:
            for sig, handler in self.handlers.items():
                signal.signal(sig, handler)

    def compose(self, *args: str, timeout: float = 300) -> str:
        """`docker-compose -p NAME -f FILE ARGS` in the project's directory; its output, or an
        AssertionError with it."""
        done = _run(["docker-compose", "--no-ansi", "-p", self.name, "-f", self.file, *args],
                    timeout=timeout, cwd=self.dir, env=self.env)
        assert done.returncode == 0, f"docker-compose {' '.join(args)}: {done.stderr}"
        return done.stdout

    def setup(self) -> None:
        self.all_services = self.compose("config", "--services").split()
        done = _run([str(self.dir / "setup")], timeout=120, cwd=self.dir, env=self.env)
        assert done.returncode == 0, f"compose/setup: {done.stderr}{done.stdout}"

    def up(self) -> None:
        self.compose("up", "--detach")

    def down(self) -> None:
        _run(["docker-compose", "--no-ansi", "-p", self.name, "-f", self.file, "down",
              "--volumes", "--remove-orphans", "--timeout", "10"],
             timeout=300, cwd=self.dir, env=self.env)

    def container(self, service: str) -> str:
        """The id of the service's container ("" when it has none)."""
        return self.compose("ps", "-q", service).strip()

    def inspect(self, service: str) -> dict[str, Any]:
        out = _run(["docker", "inspect", self.container(service)])
        assert out.returncode == 0, out.stderr
        data: list[dict[str, Any]] = json.loads(out.stdout)
        return data[0]

    def unhealthy(self) -> list[str]:
        """The services whose container is not running and healthy yet."""
        label = f"label=com.docker.compose.project={self.name}"
        ids = _run(["docker", "ps", "-a", "--quiet", "--filter", label]).stdout.split()
        ready = set()
        if ids:
            out = _run(["docker", "inspect", *ids])
            for c in json.loads(out.stdout) if out.returncode == 0 else []:
                state = c["State"]
                if state["Running"] and state.get("Health", {}).get("Status") == "healthy":
                    ready.add(c["Config"]["Labels"]["com.docker.compose.service"])
        return [s for s in self.all_services if s not in ready]

    def exec(self, service: str, *argv: str) -> str:
        return self.compose("exec", "-T", service, *argv)

    def logs(self) -> str:
        done = _run(["docker-compose", "--no-ansi", "-p", self.name, "-f", self.file, "logs",
                     "--no-color", "--tail", "60"], cwd=self.dir, env=self.env)
        return done.stdout[-20000:]

    def leftovers(self) -> list[str]:
        """Containers, volumes and networks of this project the engine still holds."""
        label = f"label=com.docker.compose.project={self.name}"
        found = []
        for kind in (["ps", "-a"], ["volume", "ls"], ["network", "ls"]):
            out = _run(["docker", *kind, "--quiet", "--filter", label])
            found += [f"{kind[0]} {line}" for line in out.stdout.split()]
        return found


def project(file: str, tmp: Path) -> Iterator[Project]:
    """The project, set up; down on every way out (a fixture's body)."""
    require_engine()
    with Project(file, tmp) as p:
        p.setup()
        yield p
