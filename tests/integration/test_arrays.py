"""Batch arrays against a real broker, real workers, real processes and the real `gavel`
command: never more than `parallelism` tasks started at once (seen from the tasks' own files
and from the broker's events), every task completing, `gavel status ID`'s tally, `submit
--wait` waiting for the array's end; a failing array ending non-zero with the count and
the first failure's reason, its held tasks cancelled."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from gavel.shared.api import StatusReply, StatusRequest, SubmitReply, SubmitRequest
from gavel.shared.messages import EventType, Spec
from gavel.shared.reasons import Reason
from tests.integration.harness import Cluster, wait_for

pytestmark = pytest.mark.integration

PY = sys.executable


async def gavel(*args: str) -> subprocess.CompletedProcess[str]:
    """The `gavel` command, run off the event loop the broker and workers serve on."""
    return await asyncio.to_thread(
        subprocess.run, [PY, "-m", "gavel", *args], capture_output=True, text=True,
        timeout=150, env={**os.environ, "GAVEL_LOG_LEVEL": "WARNING"})


def started(box: Path) -> set[str]:
    return {p.name.removeprefix("start-") for p in box.glob("start-*")}


def most_at_once(cluster: Cluster, ids: set[str]) -> int:
    """The most tasks running at once, by the broker's events in the order it heard them: a
    task counts from its running event until its end (exited, failed, lost, cancelled)."""
    assert cluster.broker is not None
    running: set[str] = set()
    most = 0
    ends = {EventType.EXITED, EventType.FAILED, EventType.LOST, EventType.CANCELLED}
    for e in cluster.broker.events:
        if e.instance_id not in ids:
            continue
        if e.type == EventType.RUNNING:
            running.add(e.instance_id)
        elif e.type in ends:
            running.discard(e.instance_id)
        most = max(most, len(running))
    return most


async def test_an_array_runs_count_tasks_never_more_than_parallelism_at_once(
        cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    for node in ("node-a", "node-b"):
        await cluster.start_agent(node, cpu=8.0)
    await cluster.wait_nodes(2)
    box = tmp_path / "box"
    box.mkdir()
    # Each task says it started, then waits for its own gate: the test lets them end.
    script = (f'touch "{box}/start-$GAVEL_INSTANCE_ID"; '
              f'while [ ! -e "{box}/go-$GAVEL_INSTANCE_ID" ]; do sleep 0.02; done')
    spec = tmp_path / "arr.toml"
    spec.write_text('name = "arr"\ncount = 5\nparallelism = 2\ncpu = 0.5\n'
                    f"command = ['sh', '-c', '''{script}''']\n")
    waiting = asyncio.ensure_future(gavel("submit", str(spec), "--id", "arr", "--wait",
                                          "--nats", cluster.url))
    ids = {f"arr-{k}" for k in range(1, 6)}
    opened: list[str] = []
    while len(opened) < 5:
        await wait_for(lambda: len(started(box)) >= min(5, len(opened) + 2), timeout=60,
                       what=f"{min(5, len(opened) + 2)} tasks started")
        now = started(box)
        assert len(now) <= len(opened) + 2, f"more than 2 at once: {sorted(now)}"
        if len(opened) == 0:  # two run, three held: status shows the tally
            st = await cluster.call("status", StatusRequest(instance_id="arr"), StatusReply)
            assert st.array is not None
            assert (st.array.running, st.array.pending, st.array.succeeded) == (2, 3, 0)
            held = [i for i in st.instances if i.reason == Reason.ARRAY_HELD]
            assert len(held) == 3 and all(i.state == "queued" for i in held)
            text = await gavel("status", "arr", "--nats", cluster.url)
            assert "done 0  running 2  failed 0  pending 3" in text.stdout, text.stdout
        nxt = sorted(now - set(opened), key=lambda i: int(i.rpartition("-")[2]))[0]
        (box / f"go-{nxt}").touch()
        opened.append(nxt)
    proc = await waiting
    assert proc.returncode == 0, proc.stderr
    assert "arr: 5/5 succeeded" in proc.stdout
    assert started(box) == ids
    assert most_at_once(cluster, ids) == 2
    assert cluster.broker is not None
    assert any(e.instance_id == "arr" and e.type == EventType.ARRAY_ENDED
               for e in cluster.broker.events)
    scraped = generate_latest(cluster.broker.metrics.registry).decode()
    assert 'gavel_array_tasks{state="succeeded"} 5.0' in scraped
    assert 'gavel_array_tasks{state="pending"} 0.0' in scraped


async def test_a_broker_started_again_carries_the_array_on_from_git(
        cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a", cpu=8.0)
    await cluster.wait_nodes(1)
    box = tmp_path / "box"
    box.mkdir()
    script = (f'touch "{box}/start-$GAVEL_INSTANCE_ID"; '
              f'while [ ! -e "{box}/go-$GAVEL_INSTANCE_ID" ]; do sleep 0.02; done')
    await cluster.call("submit", SubmitRequest(
        spec=Spec(name="again", command=["sh", "-c", script], count=3, parallelism=1),
        instance_id="again", count=3), SubmitReply)
    await wait_for(lambda: started(box) == {"again-1"}, 30, what="the first task")
    await cluster.stop_broker()
    await cluster.start_broker()
    for k in (1, 2, 3):
        await wait_for(lambda k=k: f"again-{k}" in started(box), 60, what=f"task {k}")
        assert len(started(box)) == k  # one at a time, across the restart
        (box / f"go-again-{k}").touch()

    async def ended() -> bool:
        st = await cluster.call("status", StatusRequest(instance_id="again", summary=True),
                                StatusReply)
        return st.array is not None and st.array.ok and st.instances == []
    await wait_for(ended, 60, what="the array to succeed")


async def test_a_failing_array_ends_non_zero_naming_how_many_failed_and_why(
        cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a", cpu=8.0)
    await cluster.wait_nodes(1)
    spec = tmp_path / "bad.toml"
    spec.write_text('name = "bad"\ncommand = ["sh", "-c", "exit 1"]\ncount = 4\n'
                    'parallelism = 2\nattempts = 1\n[restart]\nattempts = 0\n')
    proc = await gavel("submit", str(spec), "--id", "bad", "--wait", "--nats", cluster.url)
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "0/4 succeeded, 2 failed (first: bad-" in proc.stderr
    assert f"{Reason.EXITED_NONZERO}" in proc.stderr and "2 cancelled" in proc.stderr
    st = await cluster.call("status", StatusRequest(instance_id="bad"), StatusReply)
    assert st.array is not None and st.array.ended and not st.array.ok
    cancelled = [i for i in st.instances if i.state == "cancelled"]
    assert sorted(i.instance_id for i in cancelled) == ["bad-3", "bad-4"]
    assert all(i.reason == Reason.ARRAY_FAILED for i in cancelled)


async def test_wait_running_still_returns_once_a_job_runs(
        cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    spec = tmp_path / "long.toml"
    spec.write_text(f'name = "long"\ncommand = ["{PY}", "-c", "import time; time.sleep(600)"]\n')
    proc = await gavel("submit", str(spec), "--id", "long-1", "--wait=running",
                       "--nats", cluster.url)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("long-1 healthy on node-a"), proc.stdout


async def test_a_task_that_failed_runs_again_within_max_failures_and_the_array_succeeds(
        cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a", cpu=8.0)
    await cluster.wait_nodes(1)
    box = tmp_path / "box"
    box.mkdir()
    # Task 2's first run fails (it leaves a mark); every other run succeeds.
    script = (f'case "$GAVEL_INSTANCE_ID" in flaky-2) touch "{box}/failed"; exit 1;; esac; '
              "exit 0")
    spec = tmp_path / "flaky.toml"
    spec.write_text('name = "flaky"\ncount = 3\nparallelism = 1\nmax_failures = 1\n'
                    'attempts = 1\n[restart]\nattempts = 0\n'
                    .replace("[restart]", f"command = ['sh', '-c', '''{script}''']\n[restart]"))
    proc = await gavel("submit", str(spec), "--id", "flaky", "--wait", "--nats", cluster.url)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert proc.stdout.strip() == "flaky: 3/3 succeeded"
    assert (box / "failed").exists()
    st = await cluster.call("status", StatusRequest(instance_id="flaky"), StatusReply)
    assert {i.instance_id: i.state for i in st.instances} == {
        "flaky-1": "succeeded", "flaky-2": "failed", "flaky-2-r2": "succeeded",
        "flaky-3": "succeeded"}


async def test_cancelling_an_array_cancels_its_running_and_held_tasks(
        cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a", cpu=8.0)
    await cluster.wait_nodes(1)
    await cluster.call("submit", SubmitRequest(
        spec=Spec(name="long", command=[PY, "-c", "import time; time.sleep(600)"], count=4,
                  parallelism=2), instance_id="long", count=4), SubmitReply)

    async def tally() -> StatusReply:
        return await cluster.call("status", StatusRequest(instance_id="long", summary=True),
                                  StatusReply)
    await wait_for(lambda: _running(cluster, {"long-1", "long-2"}), 30, what="two running")
    proc = await gavel("cancel", "long", "--nats", cluster.url)
    assert proc.returncode == 0, proc.stderr

    async def ended() -> bool:
        a = (await tally()).array
        return a is not None and a.ended
    await wait_for(ended, 60, what="the array to end")
    a = (await tally()).array
    assert a is not None and not a.ok and (a.cancelled, a.succeeded) == (4, 0)


def _running(cluster: Cluster, ids: set[str]) -> bool:
    assert cluster.broker is not None
    state = cluster.broker.ledger.state()
    views = cluster.broker.api.views
    return all(views.instance_status(state.instances[i]).state == "running" for i in ids)
