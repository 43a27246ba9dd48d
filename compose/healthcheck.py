#!/usr/bin/python3
"""The gavel image's health check (installed as ``gavel-healthcheck``).

Rules:
1. With a URL argument (and optionally the Host header to send), healthy is that URL
   answering 200: the compose files give nats-server (its ``/healthz``) and Caddy (its admin
   API, which admits only the host name ``caddy:2019``) a check of this kind.
2. Without one it asks the role running as PID 1 (``gavel broker|worker|gateway``, behind
   tini): healthy is its metrics endpoint answering 200 on loopback, the port taken from the
   role's own settings in their order (``--metrics-port``, ``GAVEL_METRICS_PORT``, the
   ``--config`` file's ``metrics_port``). A role with no metrics port is healthy while it
   runs: there is nothing else to ask.
Only the standard library: it runs under Debian's python3, not the venv.
"""

from __future__ import annotations

import sys
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

TIMEOUT_S = 3.0


def _pid1() -> tuple[list[str], dict[str, str]]:
    argv = Path("/proc/1/cmdline").read_bytes().split(b"\0")
    args = [a.decode() for a in argv if a]
    if "--" in args:  # tini -- gavel ...
        args = args[args.index("--") + 1:]
    env: dict[str, str] = {}
    try:
        for item in Path("/proc/1/environ").read_bytes().split(b"\0"):
            key, _, value = item.decode(errors="replace").partition("=")
            env[key] = value
    except OSError:
        pass
    return args, env


def _flag(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def metrics_port(args: list[str], env: dict[str, str]) -> int | None:
    """The role's metrics port, by the same precedence as its settings (rule 2)."""
    port = _flag(args, "--metrics-port") or env.get("GAVEL_METRICS_PORT")
    if port:
        return int(port)
    config = _flag(args, "--config") or env.get("GAVEL_CONFIG")
    if config:
        value = tomllib.loads(Path(config).read_text()).get("metrics_port")
        return int(value) if value else None
    return None


def answers(url: str, host: str | None = None) -> bool:
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError) as exc:
        print(f"{url}: {exc}")
        return False


def main(argv: list[str]) -> int:
    if argv:
        return 0 if answers(argv[0], argv[1] if len(argv) > 1 else None) else 1
    args, env = _pid1()
    port = metrics_port(args, env)
    if port is None:
        print(f"{' '.join(args[:2])}: no metrics port to ask; running")
        return 0
    return 0 if answers(f"http://127.0.0.1:{port}/metrics") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
