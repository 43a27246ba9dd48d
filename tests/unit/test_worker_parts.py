"""The worker's parts on their own: environment, local state, capacity, adoption."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gavel.shared.messages import Spec
from gavel.shared.records import Placement
from gavel.worker.driver import Process, instance_env, terminate
from gavel.worker.hoststats import Sampler, detect_capacity
from gavel.worker.localstate import (
    AgentFile,
    LocalInstance,
    load,
    process_alive,
    process_start_time,
    save,
)


def env(**kw: object) -> dict[str, str]:
    args: dict[str, object] = {
        "base": {"PATH": "/bin", "HOME": "/h", "LANG": "C", "AWS_SECRET": "leak"},
        "spec_env": {}, "secret_env": {}, "instance_id": "i", "node_id": "n", "attempt": 1,
        "ports": {}, "port_order": [],
    }
    args.update(kw)
    return instance_env(**args)  # type: ignore[arg-type]


def test_env_keeps_only_the_minimal_base() -> None:
    assert env() == {"PATH": "/bin", "HOME": "/h", "LANG": "C", "GAVEL_INSTANCE_ID": "i",
                     "GAVEL_NODE_ID": "n", "GAVEL_ATTEMPT": "1"}
    assert env(base={})["PATH"]  # a default PATH, so bare command names resolve


def test_env_precedence_spec_then_secrets_then_gavel() -> None:
    e = env(spec_env={"A": "spec", "B": "spec", "GAVEL_NODE_ID": "spoofed"},
            secret_env={"B": "secret", "GAVEL_INSTANCE_ID": "spoofed"})
    assert (e["A"], e["B"]) == ("spec", "secret")
    assert (e["GAVEL_NODE_ID"], e["GAVEL_INSTANCE_ID"]) == ("n", "i")


def test_env_ports_and_port_follows_spec_order() -> None:
    e = env(ports={"admin": 2, "http": 1}, port_order=["http", "admin"])
    assert (e["GAVEL_PORT_HTTP"], e["GAVEL_PORT_ADMIN"], e["PORT"]) == ("1", "2", "1")
    assert "PORT" not in env()


def test_capacity_overrides_and_detection() -> None:
    cap = detect_capacity(2.5, 1024, (30000, 30099))
    assert (cap.cpu, cap.memory_mb, cap.ports) == (2.5, 1024, 100)
    detected = detect_capacity(None, None, (1, 1))
    assert detected.cpu >= 1 and detected.memory_mb > 0 and detected.ports == 1
    for bad in ((0, 10), (10, 9), (1, 70000)):
        with pytest.raises(ValueError):
            detect_capacity(None, None, bad)
    with pytest.raises(ValueError):
        detect_capacity(0, None, (1, 2))
    stats = Sampler().sample()
    assert 0 <= stats.cpu_ratio <= 1 and 0 < stats.memory_ratio <= 1


def test_state_round_trip_and_corrupt_file_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "agent.json"
    assert load(path) is None
    spec = Spec(name="s", command=["true"], secrets=["TOKEN"])
    state = AgentFile(node_id="n1", finished=["a/1"], instances={"i": LocalInstance(
        placement=Placement(instance_id="i", spec=spec, auction_id="x", ports={"http": 5}),
        state="running", pid=42, create_time=1.5, started_at=2.5)})
    save(path, state)
    assert load(path) == state
    assert [p.name for p in tmp_path.iterdir()] == ["agent.json"]  # no temp file left
    path.write_text("{not json")
    assert load(path) is None
    assert not path.exists() and len(list(tmp_path.glob("agent.json.corrupt-*"))) == 1


def test_process_identity_is_pid_and_start_time() -> None:
    me = os.getpid()
    started = process_start_time(me)
    assert started is not None and process_alive(me, started)
    assert not process_alive(me, started - 5)  # same pid, other start: a recycled pid
    assert not process_alive(0, started)


async def test_adopted_process_is_polled_and_reports_no_status() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             start_new_session=True)
    try:
        started = process_start_time(child.pid)
        assert started is not None
        assert Process.adopt(child.pid, started + 5, poll_s=0.02) is None
        proc = Process.adopt(child.pid, started, poll_s=0.02)
        assert proc is not None and proc.adopted and proc.group
        code = await asyncio.wait_for(terminate(proc, grace_s=2.0), 5)
        assert code is None  # not our child any more: its status is unknown
        assert child.wait(2) == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


async def test_spawned_child_reports_status_and_detach_leaves_it_running(
        tmp_path: Path) -> None:
    quick = Process.spawn([sys.executable, "-c", "print('hi'); raise SystemExit(7)"],
                          env={"PATH": os.defpath}, cwd=tmp_path / "q", poll_s=0.02)
    assert await asyncio.wait_for(quick.wait(), 5) == 7
    assert (tmp_path / "q" / "stdout.log").read_text() == "hi\n"

    slow = Process.spawn([sys.executable, "-c", "import time; time.sleep(30)"],
                         env={}, cwd=tmp_path / "s", poll_s=0.02)
    waiting = asyncio.ensure_future(slow.wait())
    await asyncio.sleep(0)
    slow.detach()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert process_alive(slow.pid, slow.create_time)
    os.killpg(slow.pid, signal.SIGKILL)
