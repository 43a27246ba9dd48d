"""Every exit of `gavel broker` is a line in its log saying why (`gavel.cli.daemons` rule 8):
a broker that stopped without one left an operator nothing to go on. The signal is said as it
arrives, so a stop cut short (SIGKILL after a grace, as `gavel up` and systemd do) still left
its cause; a hang-up (the terminal closed) stops it as SIGTERM does, said."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pygit2
import pytest

from tests.integration.harness import wait_for

pytestmark = pytest.mark.integration


async def _exit_lines(nats_url: str, tmp_path: Path, sig: signal.Signals, *flags: str,
                      ready: str) -> tuple[int, list[str]]:
    """The broker's exit status and its log's lines after `sig`."""
    log = tmp_path / "broker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gavel", "broker", "--state", str(tmp_path / "b"), *flags],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "GAVEL_NATS_URL": nats_url})
    try:
        await wait_for(lambda: ready in log.read_text(), 60, every=0.1,
                       what=f"the broker to say {ready!r}")
        proc.send_signal(sig)
        code = await asyncio.to_thread(proc.wait, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return code, log.read_text().strip().splitlines()


async def _exit_line(nats_url: str, tmp_path: Path, sig: signal.Signals, *flags: str,
                     ready: str) -> tuple[int, str]:
    code, lines = await _exit_lines(nats_url, tmp_path, sig, *flags, ready=ready)
    return code, lines[-1]


async def test_a_broker_stopped_by_a_signal_says_so(nats_url: str, tmp_path: Path) -> None:
    code, last = await _exit_line(nats_url, tmp_path, signal.SIGTERM, ready="broker up")
    assert code == 0
    assert last.endswith("gavel.cli INFO broker exits with status 0: stopped on SIGTERM"), last


async def test_a_standby_broker_stopped_by_a_signal_says_so(nats_url: str,
                                                             tmp_path: Path) -> None:
    remote = tmp_path / "remote.git"
    pygit2.init_repository(str(remote), bare=True, initial_head="main")
    code, last = await _exit_line(
        nats_url, tmp_path, signal.SIGINT, "--ha", "--broker-id", "b1", "--ha-replicas", "1",
        "--push", str(remote), ready="stands by")
    assert code == 0
    assert last.endswith("gavel.cli INFO broker exits with status 0: stopped on SIGINT"), last


async def test_a_broker_says_a_signal_as_it_arrives_before_its_stop_is_done(
        nats_url: str, tmp_path: Path) -> None:
    """Said before the stop's work, so a SIGKILL that cuts the stop short leaves the cause."""
    code, lines = await _exit_lines(nats_url, tmp_path, signal.SIGTERM, ready="broker up")
    assert code == 0
    said = [k for k, line in enumerate(lines)
            if line.endswith("gavel.cli INFO broker stopping on SIGTERM")]
    assert len(said) == 1 and said[0] < len(lines) - 1, lines[-5:]


async def test_a_standby_broker_hung_up_on_stops_and_says_so(nats_url: str,
                                                             tmp_path: Path) -> None:
    remote = tmp_path / "remote.git"
    pygit2.init_repository(str(remote), bare=True, initial_head="main")
    code, last = await _exit_line(
        nats_url, tmp_path, signal.SIGHUP, "--ha", "--broker-id", "b1", "--ha-replicas", "1",
        "--push", str(remote), ready="stands by")
    assert code == 0
    assert last.endswith("gavel.cli INFO broker exits with status 0: stopped on SIGHUP"), last
