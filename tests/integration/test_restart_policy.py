"""Restarts in place (a spec's `restart` policy), against a real broker, real workers and
real processes: restarted on the node, counted, handed back past the policy, re-placed
elsewhere while the spec's attempts last, then failed with the exit and its stderr."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from gavel.shared.api import CancelReply, CancelRequest
from gavel.shared.messages import Event, Spec
from gavel.shared.reasons import Reason
from gavel.shared.spec import Restart
from gavel.worker.driver import STDERR_TAIL
from tests.integration.harness import Cluster, wait_for

pytestmark = pytest.mark.integration

FAST = Restart(attempts=2, delay_s=0.2, interval_s=60.0)


def py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def events(cluster: Cluster, iid: str, type_: str = "") -> list[Event]:
    assert cluster.broker is not None
    return [e for e in cluster.broker.events
            if e.instance_id == iid and (not type_ or e.type == type_)]


def record(cluster: Cluster, iid: str) -> object:
    return cluster.ledger().state().instances[iid]


def starts(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def logging_start(log: Path) -> str:
    """Python source that appends "<node> <attempt> <pid>" to `log` as the process starts."""
    return (f"import os, sys\nwith open({str(log)!r}, 'a') as f:\n"
            "    f.write(f\"{os.environ['GAVEL_NODE_ID']} {os.environ['GAVEL_ATTEMPT']} "
            "{os.getpid()}\\n\")\n")


async def test_a_crashing_service_is_restarted_in_place_then_placed_elsewhere(
        cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.start_agent("node-b")
    await cluster.wait_nodes(2)
    log = tmp_path / "starts"
    spec = Spec(name="crashy", type="service", restart=FAST, attempts=2,
                command=py(logging_start(log) + "print('crashed on purpose', file=sys.stderr)\n"
                           "sys.exit(1)\n"))
    iid = await cluster.submit(spec)
    await wait_for(lambda: record(cluster, iid).state == "failed", 60, what="failed")

    runs = starts(log)
    first, second = runs[:3], runs[3:]
    assert len(runs) == 6, runs  # each node: the process and its 2 restarts
    assert len({node for node, _a, _p in first}) == 1 and {a for _n, a, _p in first} == {"1"}
    assert {a for _n, a, _p in second} == {"2"}
    assert {node for node, _a, _p in second} == {"node-a", "node-b"} - {first[0][0]}
    assert len({pid for _n, _a, pid in runs}) == 6  # a new process every time

    restarted = events(cluster, iid, "restarted")
    assert [(e.node_id, e.attempt, e.restarts, e.exit_code) for e in restarted] == [
        (first[0][0], 1, 1, 1), (first[0][0], 1, 2, 1),
        (second[0][0], 2, 1, 1), (second[0][0], 2, 2, 1)]
    assert "exit status 1; restart 1 of 2 within 60s" in restarted[0].detail
    handed_back = [e for e in events(cluster, iid, "failed") if e.node_id]
    assert [e.reason for e in handed_back][:1] == [Reason.RESTARTS_EXHAUSTED]
    assert handed_back[0].restarts == 2

    rec = cluster.ledger().state().instances[iid]
    assert (rec.reason, rec.attempt) == (Reason.RESTARTS_EXHAUSTED, 2)
    assert rec.detail.startswith(f"{Reason.ATTEMPTS_EXHAUSTED} (2/2): exit status 1, after 2 "
                                 "restarts within 60s; stderr:\n")
    assert rec.detail.endswith("crashed on purpose")
    assert set(rec.excluded) == {first[0][0]}
    assert cluster.holders(iid) == []


async def test_a_failing_job_is_retried_in_place_then_elsewhere_then_fails_with_its_stderr(
        cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.start_agent("node-b")
    await cluster.wait_nodes(2)
    log = tmp_path / "starts"
    noise = "".join(f"noise line {k:03d} of a long stderr\n" for k in range(200))
    spec = Spec(name="flaky", restart=Restart(attempts=1, delay_s=0.2, interval_s=60.0),
                attempts=2,
                command=py(logging_start(log) + f"sys.stderr.write({noise!r})\n"
                           "print('the last words', file=sys.stderr)\nsys.exit(3)\n"))
    iid = await cluster.submit(spec)
    await wait_for(lambda: record(cluster, iid).state == "failed", 60, what="failed")

    runs = starts(log)
    assert [a for _n, a, _p in runs] == ["1", "1", "2", "2"]  # in place once, per placement
    assert runs[0][0] == runs[1][0] != runs[2][0] == runs[3][0]
    rec = cluster.ledger().state().instances[iid]
    assert rec.reason == Reason.RESTARTS_EXHAUSTED
    head, _, tail = rec.detail.partition("; stderr:\n")
    assert head == f"{Reason.ATTEMPTS_EXHAUSTED} (2/2): exit status 3, after 1 restart within 60s"
    assert tail.endswith("noise line 199 of a long stderr\nthe last words")
    assert len(tail.encode()) <= STDERR_TAIL and "noise line 000" not in tail  # bounded
    assert tail.startswith("noise line")  # whole lines only


async def test_a_job_that_exits_0_is_not_restarted(cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    log = tmp_path / "starts"
    iid = await cluster.submit(Spec(name="once", restart=FAST, command=py(logging_start(log))))
    await wait_for(lambda: record(cluster, iid).state == "succeeded", 20, what="succeeded")
    assert len(starts(log)) == 1 and events(cluster, iid, "restarted") == []


async def test_a_service_that_exits_0_is_restarted(cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    log = tmp_path / "starts"
    iid = await cluster.submit(Spec(name="blip", type="service", restart=FAST, attempts=1,
                                    command=py(logging_start(log))))
    await wait_for(lambda: record(cluster, iid).state == "failed", 30, what="handed back")
    assert len(starts(log)) == 3
    assert [e.exit_code for e in events(cluster, iid, "restarted")] == [0, 0]
    assert record(cluster, iid).reason == Reason.RESTARTS_EXHAUSTED


async def test_the_restart_count_survives_a_worker_restart(
        cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker(secrets={"TOKEN": "tok-123"})
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    log, die, tokens = tmp_path / "starts", tmp_path / "die", tmp_path / "tokens"
    iid = await cluster.submit(Spec(
        name="keeper", type="service", restart=FAST, attempts=1, secrets=["TOKEN"],
        command=py(logging_start(log) + textwrap.dedent(f"""
            import time, pathlib
            with open({str(tokens)!r}, "a") as f:
                f.write(os.environ.get("TOKEN", "-") + "\\n")
            if len(pathlib.Path({str(log)!r}).read_text().splitlines()) == 1:
                sys.exit(1)  # the first run crashes at once
            while not pathlib.Path({str(die)!r}).exists():
                time.sleep(0.02)
            sys.exit(1)
        """))))
    await wait_for(lambda: len(starts(log)) == 2, 20, what="restarted once")
    await wait_for(lambda: [i.restarts for i in cluster.agents["node-a"].instances()] == [1],
                   10, what="the count in the heartbeat")
    await cluster.stop_agent("node-a", kill_children=False)
    agent = await cluster.start_agent("node-a")  # re-adopts the second run, count and all
    await wait_for(lambda: [i.restarts for i in agent.instances()] == [1], 10,
                   what="re-adopted with its count")
    die.touch()
    await wait_for(lambda: record(cluster, iid).state == "failed", 30, what="handed back")
    assert len(starts(log)) == 3  # one more restart, not two: the first one still counts
    assert [e.restarts for e in events(cluster, iid, "restarted")] == [1, 2]
    rec = cluster.ledger().state().instances[iid]
    assert rec.reason == Reason.RESTARTS_EXHAUSTED and "after 2 restarts" in rec.detail
    # the secret, never on disk, was asked of the broker again for the restart
    assert tokens.read_text().split() == ["tok-123"] * 3


async def test_a_back_off_under_way_when_the_worker_stops_is_resumed(
        cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    log = tmp_path / "starts"
    iid = await cluster.submit(Spec(
        name="resumes", type="service", restart=Restart(attempts=2, delay_s=2.0),
        command=py(logging_start(log) + textwrap.dedent(f"""
            import time, pathlib
            if len(pathlib.Path({str(log)!r}).read_text().splitlines()) == 1:
                sys.exit(1)
            time.sleep(600)
        """))))
    await wait_for(lambda: len(events(cluster, iid, "restarted")) == 1, 20, what="backing off")
    await cluster.stop_agent("node-a", kill_children=False)  # in the middle of the wait
    agent = await cluster.start_agent("node-a")
    await wait_for(lambda: len(starts(log)) == 2, 20, what="started again by the new worker")
    await wait_for(lambda: [(i.state, i.restarts, i.health) for i in agent.instances()]
                   == [("running", 1, "healthy")], 10, what="running, its restart counted")
    assert events(cluster, iid, "failed") == [] and cluster.holders(iid) == ["node-a"]


async def test_cancel_ends_a_back_off_and_is_never_restarted(
        cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    log = tmp_path / "starts"
    slow = Restart(attempts=5, delay_s=3600.0, interval_s=7200.0)  # a back-off of an hour
    iid = await cluster.submit(Spec(name="waits", type="service", restart=slow,
                                    command=py(logging_start(log) + "sys.exit(2)\n")))
    await wait_for(lambda: len(events(cluster, iid, "restarted")) == 1, 20, what="backing off")
    reply = await cluster.call("cancel", CancelRequest(instance_id=iid), CancelReply)
    assert reply.state == "cancelling"
    await wait_for(lambda: record(cluster, iid).state == "cancelled", 20, what="cancelled")
    assert record(cluster, iid).reason == Reason.CANCELLED  # the node said so, at once
    assert len(starts(log)) == 1

    sleeper = await cluster.submit(Spec(name="runs", type="service", restart=FAST,
                                        command=py("import time; time.sleep(600)")))
    await wait_for(lambda: events(cluster, sleeper, "running") != [], 20, what="running")
    await cluster.call("cancel", CancelRequest(instance_id=sleeper), CancelReply)
    await wait_for(lambda: record(cluster, sleeper).state == "cancelled", 20, what="cancelled")
    assert events(cluster, sleeper, "restarted") == []


async def test_a_timed_out_service_is_not_restarted(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    iid = await cluster.submit(Spec(name="slow", type="service", restart=FAST, timeout_s=0.5,
                                    command=py("import time; time.sleep(600)")))
    await wait_for(lambda: record(cluster, iid).state == "failed", 30, what="timed out")
    assert record(cluster, iid).reason == Reason.TIMEOUT
    assert events(cluster, iid, "restarted") == []
