"""The bench's idle-worker measurement (bench/idle.py) against a real nats-server, a real
broker and a real `gavel worker` child: it measures a worker the broker has heard, and it
refuses - one sentence, no figures - to measure one that died, that nobody heard, or that
died while it was being measured (a dead worker reads 0% of a core and 0 MB: "met")."""

from __future__ import annotations

import asyncio
import re
import signal
from pathlib import Path

import psutil
import pytest

from gavel.bench.idle import NODE_ID, IdleWorkerFailed, idle_worker
from gavel.transport.natsserver import free_port
from tests.integration.harness import Cluster, wait_for

pytestmark = pytest.mark.integration


def _is_idle_worker(process: psutil.Process) -> bool:
    """Other tests in this pytest process leave children behind that may be zombies or gone
    by the time their command line is read: those are not the idle worker."""
    try:
        cmdline = process.cmdline()
    except (psutil.ZombieProcess, psutil.NoSuchProcess):
        return False
    return NODE_ID in cmdline and "worker" in cmdline


def _paths(cluster: Cluster) -> tuple[Path, Path]:
    return cluster.root / "idle-worker", cluster.root / "idle-worker.log"


async def test_a_worker_the_broker_heard_is_measured(cluster: Cluster) -> None:
    await cluster.start_broker()
    state, log = _paths(cluster)
    cpu, rss = await idle_worker(await cluster.client(), cluster.url, state, log,
                                 seconds=0.5, settle_s=0.5)
    assert cpu >= 0 and rss > 0  # a live process holds memory


async def test_a_worker_that_dies_at_start_is_not_measured(cluster: Cluster) -> None:
    """Its state dir is a file: `gavel worker` exits 2 before it ever heartbeats."""
    await cluster.start_broker()
    state, log = _paths(cluster)
    state.write_text("not a directory\n")
    with pytest.raises(IdleWorkerFailed, match=re.escape(
            "the idle worker exited with status 2 before the broker heard its heartbeat "
            f"(see {log})")):
        await idle_worker(await cluster.client(), cluster.url, state, log, seconds=0.5,
                          settle_s=0.5)
    assert "cannot keep the worker's state" in log.read_text()


@pytest.mark.parametrize("case", ["bad nats url", "no broker listening"])
async def test_a_worker_nobody_hears_is_not_measured(cluster: Cluster, case: str) -> None:
    """It runs, but its heartbeats reach no broker: the first never leaves (no NATS at its
    URL), or nobody listens (the bench once measured before its broker started)."""
    url = cluster.url
    if case == "bad nats url":
        await cluster.start_broker()
        url = f"nats://127.0.0.1:{free_port()}"
    state, log = _paths(cluster)
    with pytest.raises(IdleWorkerFailed, match=re.escape(
            "the broker did not hear the idle worker's heartbeat within 3s")):
        await idle_worker(await cluster.client(), url, state, log, seconds=0.5, settle_s=0.5,
                          heard_within_s=3.0)


async def test_a_worker_that_dies_during_the_window_is_not_measured(cluster: Cluster) -> None:
    broker = await cluster.start_broker()
    state, log = _paths(cluster)
    measuring = asyncio.ensure_future(idle_worker(await cluster.client(), cluster.url, state,
                                                  log, seconds=120, settle_s=0.5))
    await wait_for(lambda: NODE_ID in broker.liveness.eligible(broker.now()), 30,
                   what="the broker to hear the idle worker")
    (worker,) = [p for p in psutil.Process().children() if _is_idle_worker(p)]
    worker.send_signal(signal.SIGKILL)
    with pytest.raises(IdleWorkerFailed, match=re.escape(
            f"the idle worker exited with status -9 during its measurement (see {log})")):
        await asyncio.wait_for(measuring, 60)
