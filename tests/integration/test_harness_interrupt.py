"""A harness stopped by a signal stops what it started (`gavel.bench.interrupt`): SIGTERM
used to end `make chaos` at once, leaving its nats-server, broker, workers and every
instance running."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
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


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_chaos_stopped_by_a_signal_stops_its_cluster(tmp_path: Path,
                                                           sig: signal.Signals) -> None:
    root = tmp_path / "chaos"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gavel.bench.chaos", "--duration", "120", "--workers", "2",
         "--seed", "5", "--state", str(root), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
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


async def test_bench_stopped_by_sigterm_stops_its_processes(tmp_path: Path) -> None:
    root = tmp_path / "bench"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gavel", "bench", "--agents", "20", "--placements", "100000",
         "--state", str(root)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    started: list[psutil.Process] = []
    try:
        def agents_up() -> bool:
            assert proc.poll() is None
            started[:] = psutil.Process(proc.pid).children(recursive=True)
            return any("gavel.bench.agents" in " ".join(cmdline(p)) for p in started)
        await wait_for(agents_up, 120, every=0.2, what="the bench's agents")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err.decode()
    assert "stopped by SIGTERM" in err.decode()
    assert still_running(started) == []
    assert leftovers(root) == []
