"""A harness stopped by a signal stops what it started (`gavel.bench.interrupt`): SIGTERM
used to end `make chaos` at once, leaving its nats-server, broker, workers and every
instance running. Every harness (`chaos`, `chaos-ha`, `bench`), on a signal while it runs or
while it is still starting its cluster."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gavel.bench.chaoscheck import alive_by_node
from tests.integration.harness import wait_for

pytestmark = pytest.mark.integration


def leftovers(root: Path) -> list[str]:
    """Processes whose command line names `root`, and instances whose directory is in it."""
    out = [f"{p.pid}: {' '.join(p.info['cmdline'] or [])}"
           for p in psutil.process_iter(["cmdline"])
           if str(root) in " ".join(p.info["cmdline"] or [])]
    return out + sorted(alive_by_node(root / "workers"))


CHAOS, CHAOS_HA = "gavel.bench.chaos", "gavel.bench.chaosha"
#: The harness as a terminal starts it: Ctrl-C (SIGINT) at its default, whatever this runner
#: inherited (a job a non-interactive shell sent to the background ignores SIGINT, and a
#: Python started so keeps ignoring it). `exec` keeps the pid the test signals.
PYTHON = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, "
          "signal.SIG_DFL); os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"]


def chaos_run(module: str, root: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*PYTHON, "-m", module, "--duration", "120", "--workers", "2",
         "--seed", "5", "--state", str(root), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("module", "sig"), [(CHAOS, signal.SIGTERM), (CHAOS, signal.SIGINT),
                                             (CHAOS_HA, signal.SIGTERM)],
                         ids=["chaos-SIGTERM", "chaos-SIGINT", "chaos-ha-SIGTERM"])
async def test_chaos_stopped_by_a_signal_stops_its_cluster(tmp_path: Path, module: str,
                                                           sig: signal.Signals) -> None:
    root = tmp_path / "chaos"
    proc = chaos_run(module, root)
    try:
        await wait_for(lambda: bool(alive_by_node(root / "workers")) or proc.poll() is not None,
                       120, every=0.2, what="the chaos run's first instances")
        assert proc.poll() is None
        started = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    summary = json.loads(out.decode().strip().splitlines()[-1])
    assert proc.returncode == 1 and not summary["ok"]
    assert f"stopped by {sig.name}" in summary["errors"][0]
    assert still_running(started) == []
    assert leftovers(root) == []


@pytest.mark.parametrize("module", [CHAOS, CHAOS_HA], ids=["chaos", "chaos-ha"])
async def test_chaos_stopped_while_it_starts_stops_what_it_started(tmp_path: Path,
                                                                   module: str) -> None:
    """SIGTERM as soon as the first process of the cluster exists (a nats-server still
    starting): whatever the start got to, and anything it starts after the signal, is
    stopped."""
    root = tmp_path / "chaos"
    proc = chaos_run(module, root)
    seen: dict[int, psutil.Process] = {}
    try:
        def first_child() -> bool:
            assert proc.poll() is None
            return bool(psutil.Process(proc.pid).children(recursive=True))
        await wait_for(first_child, 120, every=0.02, what="the run's first process")
        proc.send_signal(signal.SIGTERM)
        until = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < until:  # and all it starts now
            with contextlib.suppress(psutil.Error):
                seen.update((p.pid, p) for p in psutil.Process(proc.pid).children(True))
            await asyncio.sleep(0.02)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    summary = json.loads(out.decode().strip().splitlines()[-1])
    assert proc.returncode == 1 and "stopped by SIGTERM" in summary["errors"][0]
    assert still_running(list(seen.values())) == []
    assert leftovers(root) == []


def cmdline(p: psutil.Process) -> list[str]:
    try:
        return list(p.cmdline())
    except psutil.Error:  # gone meanwhile
        return []


def still_running(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p.pid}: {' '.join(p.cmdline())}")
        except psutil.Error:
            pass
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_bench_stopped_by_a_signal_stops_its_processes(tmp_path: Path,
                                                             sig: signal.Signals) -> None:
    root = tmp_path / "bench"
    proc = subprocess.Popen(
        [*PYTHON, "-m", "gavel", "bench", "--agents", "20", "--placements", "100000",
         "--state", str(root)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    started: list[psutil.Process] = []
    try:
        def agents_up() -> bool:
            assert proc.poll() is None
            started[:] = psutil.Process(proc.pid).children(recursive=True)
            return any("gavel.bench.agents" in " ".join(cmdline(p)) for p in started)
        await wait_for(agents_up, 120, every=0.2, what="the bench's agents")
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err.decode()
    assert f"stopped by {sig.name}" in err.decode()
    assert still_running(started) == []
    assert leftovers(root) == []
