"""Enforced resources on this host's real kernel, through a real worker and broker: a process
that allocates past its memory is killed and reported with the fixed reason, one within its
limit runs, its cgroup holds the limits of its award (cpu in proportion) and goes when it
ends, a re-adopted process keeps its cgroup; a service's process killed for its memory is
restarted in place in the same cgroup (each run judged by its own end) and, past its policy,
handed back naming its memory; a host without a usable hierarchy says so at start and in a
metric. Tests that need a writable hierarchy skip with the reason elsewhere."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from gavel.shared.api import CancelReply, CancelRequest
from gavel.shared.messages import Event, EventType, InstanceReport, InstanceState, Spec
from gavel.shared.reasons import Reason
from gavel.shared.spec import Restart
from gavel.worker.cgroups import Enforcement, Hierarchy, Unavailable, detect
from gavel.worker.metrics import WorkerMetrics
from tests.integration.harness import Cluster, wait_for

MB = 1024 * 1024


def node_id() -> str:
    """A node id of its own: cgroups are host-wide, and tests may run side by side."""
    return f"cg-{uuid.uuid4().hex[:10]}"


def enforced(node: str, **kw: str) -> Enforcement:
    got = detect("auto", node, **kw)  # type: ignore[arg-type]
    if got.hierarchy is None:
        pytest.skip(got.summary)
    return got


def allocating(name: str, mb: int, memory_mb: int, **kw: object) -> Spec:
    """Touches `mb` MB (every page), says so on stdout, then sleeps; never restarted in
    place (its first end is the instance's)."""
    code = (f"b = bytearray({mb} * 1024 * 1024); b[::4096] = b'x' * len(range(0, len(b), 4096))"
            "; print('allocated', flush=True); import time; time.sleep(60)")
    return Spec(name=name, command=[sys.executable, "-c", code], memory_mb=memory_mb,
                attempts=1, restart=Restart(attempts=0), **kw)  # type: ignore[arg-type]


def cgroup_of(pid: int, controller: str) -> Path:
    """The directory of `pid`'s cgroup, read from the kernel (v1: that controller's)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(",") or (names == "" and controller == "unified"):
            mount = Path("/sys/fs/cgroup") / (controller if names else "")
            return mount / path.lstrip("/")
    raise AssertionError(f"pid {pid} is in no {controller} cgroup")


async def running_pid(cluster: Cluster, node: str, iid: str) -> int:
    agent = cluster.agents[node]

    def pid() -> int:
        return next((r.pid for r in agent.instances()
                     if r.instance_id == iid and r.state == InstanceState.RUNNING), 0)

    await wait_for(lambda: pid() > 0, 30, what=f"{iid} running")
    return pid()


async def test_a_process_past_its_memory_is_killed_and_reported(cluster: Cluster) -> None:
    node = node_id()
    enforcement = enforced(node)
    await cluster.start_broker()
    await cluster.start_agent(node, cgroups=enforcement)
    await cluster.wait_nodes(1)
    iid = await cluster.submit(allocating("hog", mb=64, memory_mb=32))  # 2x its memory

    async def failed() -> bool:
        return bool((await cluster.status(iid)).state == InstanceState.FAILED)

    await wait_for(failed, 60, what="the hog failed")
    st = await cluster.status(iid)
    assert st.reason == Reason.MEMORY_EXCEEDED
    assert "killed by the kernel at its 32 MB limit" in st.detail
    hierarchy = enforcement.hierarchy
    assert hierarchy is not None
    assert not (hierarchy.parents["memory"] / iid).exists()  # removed once it ended


async def test_a_process_within_its_limit_runs_in_a_cgroup_holding_its_award(
        cluster: Cluster) -> None:
    node = node_id()
    enforcement = enforced(node, cpu_limit="quota")
    await cluster.start_broker()
    await cluster.start_agent(node, cgroups=enforcement)
    await cluster.wait_nodes(1)
    iid = await cluster.submit(allocating("fits", mb=16, memory_mb=64, cpu=0.5))
    pid = await running_pid(cluster, node, iid)
    out = cluster.root / "workers" / node / "instances" / iid / "stdout.log"
    await wait_for(lambda: "allocated" in out.read_text(), 30, what="its memory allocated")
    hierarchy = enforcement.hierarchy
    assert hierarchy is not None
    if hierarchy.version == "v1":
        mem, cpu = cgroup_of(pid, "memory"), cgroup_of(pid, "cpu")
        assert mem == hierarchy.parents["memory"] / iid
        assert (mem / "memory.limit_in_bytes").read_text().strip() == str(64 * MB)
        if (mem / "memory.memsw.limit_in_bytes").exists():
            assert (mem / "memory.memsw.limit_in_bytes").read_text().strip() == str(64 * MB)
        assert (cpu / "cpu.shares").read_text().strip() == "512"  # 1024 a cpu
        assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "50000"
        assert (cpu / "cpu.cfs_period_us").read_text().strip() == "100000"
    else:
        cg = cgroup_of(pid, "unified")
        assert (cg / "memory.max").read_text().strip() == str(64 * MB)
        assert (cg / "cpu.weight").read_text().strip() == "50"
        assert (cg / "cpu.max").read_text().strip() == "50000 100000"
    assert (await cluster.status(iid)).state == InstanceState.RUNNING
    await cluster.call("cancel", CancelRequest(instance_id=iid), CancelReply)

    async def cancelled() -> bool:
        return bool((await cluster.status(iid)).state == InstanceState.CANCELLED)

    await wait_for(cancelled, 30, what="cancelled")
    await wait_for(lambda: not any((p / iid).exists() for p in hierarchy.parents.values()),
                   10, what="its cgroup removed")


async def test_a_readopted_process_keeps_its_cgroup(cluster: Cluster) -> None:
    node = node_id()
    enforcement = enforced(node)
    await cluster.start_broker()
    await cluster.start_agent(node, cgroups=enforcement)
    await cluster.wait_nodes(1)
    iid = await cluster.submit(allocating("kept", mb=1, memory_mb=48))
    pid = await running_pid(cluster, node, iid)
    hierarchy = enforcement.hierarchy
    assert hierarchy is not None
    where = hierarchy.parents["memory"] / iid
    await cluster.stop_agent(node, kill_children=False)
    assert cgroup_of(pid, "memory" if hierarchy.version == "v1" else "unified") == where
    again = enforced(node)
    await cluster.start_agent(node, cgroups=again)
    assert await running_pid(cluster, node, iid) == pid  # adopted, not started again
    assert cgroup_of(pid, "memory" if hierarchy.version == "v1" else "unified") == where
    await cluster.stop_agent(node)  # kills its instances: the cgroup goes with them
    assert not where.exists()
    assert not hierarchy.parents["memory"].exists()  # and the node's parent, left empty


async def test_the_worker_says_what_it_enforces_at_start_and_in_a_metric(
        cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    await cluster.start_broker()
    nowhere = tmp_path / "no-cgroups"
    nowhere.mkdir()
    missing = detect("auto", "bare", root=nowhere)
    with caplog.at_level(logging.INFO, logger="gavel.worker"):
        agent = await cluster.start_agent("bare", cgroups=missing)
        await cluster.wait_nodes(1)
    lines = [r for r in caplog.records if "resources not enforced" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "bookkeeping only" in lines[0].getMessage()
    metrics = WorkerMetrics()
    metrics.attach(agent)
    assert metrics.registry.get_sample_value("gavel_worker_cgroups", {"version": "none"}) == 1
    node = node_id()
    enforcement = enforced(node)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gavel.worker"):
        real = await cluster.start_agent(node, cgroups=enforcement)
        await cluster.wait_nodes(2)
    said = [r.getMessage() for r in caplog.records if "resources enforced" in r.getMessage()]
    assert said == [f"node {node}: {enforcement.summary}"]
    metrics = WorkerMetrics()
    metrics.attach(real)
    assert metrics.registry.get_sample_value(
        "gavel_worker_cgroups", {"version": enforcement.version}) == 1


def test_a_worker_asked_for_a_hierarchy_it_cannot_use_refuses_to_start(
        tmp_path: Path) -> None:
    node = node_id()
    try:
        v2 = detect("v2", node)
    except Unavailable:
        pass
    else:
        assert v2.hierarchy is not None
        v2.hierarchy.close()
        pytest.skip("this host runs cgroup v2: asking for it starts the worker")
    done = subprocess.run([sys.executable, "-m", "gavel", "worker", "--node-id", node,
                           "--cgroups", "v2", "--state", str(tmp_path / "w")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "field `cgroups`: cgroup v2: no unified hierarchy with the memory and cpu " \
           "controllers at /sys/fs/cgroup" in done.stderr


FAST = Restart(attempts=2, delay_s=0.2, interval_s=60.0)


def runs(log: Path, *plan: int) -> list[str]:
    """A service's command whose k-th run (counted in `log`) does ``plan[k]``, the last
    entry for every later run: a positive number touches that many MB, says so on stdout
    ("allocated <mb> <pid>") and sleeps; zero or less exits with that status negated."""
    code = (f"import os, sys, time\nplan = {list(plan)!r}\n"
            f"with open({str(log)!r}, 'a+') as f:\n"
            "    f.seek(0); k = len(f.read().splitlines()); f.write(f'{os.getpid()}\\n')\n"
            "mb = plan[min(k, len(plan) - 1)]\n"
            "if mb <= 0:\n    sys.exit(-mb)\n"
            "b = bytearray(mb * 1024 * 1024); b[::4096] = b'x' * len(range(0, len(b), 4096))\n"
            "print('allocated', mb, os.getpid(), flush=True)\ntime.sleep(60)\n")
    return [sys.executable, "-c", code]


async def cgroup_cluster(cluster: Cluster) -> tuple[str, Hierarchy]:
    node = node_id()
    enforcement = enforced(node)
    assert enforcement.hierarchy is not None
    await cluster.start_broker()
    await cluster.start_agent(node, cgroups=enforcement)
    await cluster.wait_nodes(1)
    return node, enforcement.hierarchy


def events_of(cluster: Cluster, iid: str, type_: str) -> list[Event]:
    assert cluster.broker is not None
    return [e for e in cluster.broker.events if e.instance_id == iid and e.type == type_]


async def test_a_service_past_its_memory_is_restarted_in_place_in_its_cgroup(
        cluster: Cluster, tmp_path: Path) -> None:
    node, hierarchy = await cgroup_cluster(cluster)
    spec = Spec(name="greedy", type="service", restart=FAST, memory_mb=32,
                command=runs(tmp_path / "runs", 64, 1))  # 2x its memory, then 1 MB
    iid = await cluster.submit(spec)
    agent = cluster.agents[node]

    def again() -> InstanceReport | None:
        return next((r for r in agent.instances() if r.instance_id == iid
                     and r.state == InstanceState.RUNNING and r.restarts == 1), None)

    await wait_for(lambda: bool(events_of(cluster, iid, EventType.RESTARTED)), 60,
                   what="the broker told of the restart")
    await wait_for(lambda: again() is not None, 60, what="restarted once and running")
    restarted = events_of(cluster, iid, EventType.RESTARTED)
    assert [(e.node_id, e.attempt, e.restarts, e.reason) for e in restarted] == [
        (node, 1, 1, Reason.MEMORY_EXCEEDED)]
    assert restarted[0].detail.startswith(
        "killed by the kernel at its 32 MB limit; restart 1 of 2 within 60s")
    out = cluster.root / "workers" / node / "instances" / iid / "stdout.log"
    await wait_for(lambda: "allocated 1 " in out.read_text(), 30, what="the second run")
    assert "allocated 64" not in out.read_text()  # the first run never got its 64 MB
    report = again()
    assert report is not None
    where = hierarchy.parents["memory"] / iid
    assert cgroup_of(report.pid, "memory" if hierarchy.version == "v1" else "unified") == where
    assert f"allocated 1 {report.pid}" in out.read_text()  # that process is the one running
    st = await cluster.status(iid)
    assert st.state == InstanceState.RUNNING and st.attempt == 1  # in place, not re-placed
    # While it runs again, status says why its last run ended (issue 30 item 10).
    assert (st.restarts, st.reason) == (1, Reason.MEMORY_EXCEEDED)
    assert st.detail.startswith("killed by the kernel at its 32 MB limit; restart 1 of 2")
    await cluster.call("cancel", CancelRequest(instance_id=iid), CancelReply)

    async def cancelled() -> bool:
        return bool((await cluster.status(iid)).state == InstanceState.CANCELLED)

    await wait_for(cancelled, 30, what="cancelled")
    await wait_for(lambda: not any((p / iid).exists() for p in hierarchy.parents.values()),
                   10, what="its cgroup removed once it ended")


async def test_a_run_after_a_memory_kill_is_judged_by_its_own_end(
        cluster: Cluster, tmp_path: Path) -> None:
    node, _hierarchy = await cgroup_cluster(cluster)
    spec = Spec(name="greedy-then-broken", type="service", restart=FAST, memory_mb=32,
                command=runs(tmp_path / "runs", 64, -3, 1))
    iid = await cluster.submit(spec)
    await wait_for(lambda: len(events_of(cluster, iid, EventType.RESTARTED)) == 2, 60,
                   what="restarted twice")
    restarted = events_of(cluster, iid, EventType.RESTARTED)
    assert [(e.reason, e.exit_code) for e in restarted] == [
        (Reason.MEMORY_EXCEEDED, -signal.SIGKILL), (Reason.EXITED_NONZERO, 3)]
    assert restarted[1].detail.startswith("exit status 3; restart 2 of 2 within 60s")
    out = cluster.root / "workers" / node / "instances" / iid / "stdout.log"
    await wait_for(lambda: "allocated 1 " in out.read_text(), 30, what="the third run")


async def test_a_service_always_past_its_memory_is_handed_back_naming_it(
        cluster: Cluster, tmp_path: Path) -> None:
    node, hierarchy = await cgroup_cluster(cluster)
    spec = Spec(name="greedier", type="service", restart=FAST, memory_mb=32, attempts=1,
                command=runs(tmp_path / "runs", 64))

    iid = await cluster.submit(spec)

    def handed_back() -> list[Event]:
        return [e for e in events_of(cluster, iid, EventType.FAILED) if e.node_id == node]

    await wait_for(lambda: bool(handed_back()), 60, what="handed back past its policy")
    ev = handed_back()[0]
    assert ev.reason == Reason.RESTARTS_EXHAUSTED and ev.restarts == 2
    assert ev.detail.startswith(f"{Reason.MEMORY_EXCEEDED}: killed by the kernel at its 32 MB "
                                "limit, after 2 restarts within 60s")
    assert [e.reason for e in events_of(cluster, iid, EventType.RESTARTED)] == [
        Reason.MEMORY_EXCEEDED] * 2
    await wait_for(lambda: not any((p / iid).exists() for p in hierarchy.parents.values()),
                   10, what="its cgroup removed once it ended")
