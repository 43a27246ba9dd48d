"""The chaos verdict (bench/chaoscheck.py `verify`, `alive_by_node`; the summary of
bench/chaos.py) fed known states, built for real: a bare state repository written by the
Ledger, workers' agent.json files written by the worker's own `localstate.save`, and live
child processes where it checks liveness. Each failure it claims to detect is reported -
an instance in two node files, one alive on two nodes (by two agent.json files, or by two
processes), one missing - a clean state is clean, and an instance the broker ended `lost`
is counted on its own, never among the other terminal states."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gavel.bench.chaos import Chaos, Options
from gavel.bench.chaoscheck import Verdict, alive_by_node, verify
from gavel.bench.chaoscluster import Cluster
from gavel.bench.chaosplan import BLIP, SLEEPER
from gavel.broker.ledger.repository import Ledger, encode
from gavel.shared.messages import InstanceState
from gavel.shared.reasons import Reason
from gavel.shared.records import (
    Assignment,
    InstanceRecord,
    NodeFile,
    Placement,
    instance_path,
    node_path,
)
from gavel.worker.localstate import AgentFile, LocalInstance, process_start_time, save

pytestmark = pytest.mark.integration

S = InstanceState
NO_LEASE = "the node's lease expired"


class Scene:
    """A chaos run's end state, for real: what git holds, what the workers' agent.json files
    hold, and which processes run where."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ledger = Ledger(root / "state.git")
        self.workers = root / "workers"
        self.workers.mkdir(parents=True)
        self.submitted: dict[str, bool] = {}
        self.files: dict[str, bytes | None] = {}
        self.nodes: dict[str, list[str]] = {}
        self.held: dict[str, dict[str, LocalInstance]] = {}
        self.procs: list[subprocess.Popen[bytes]] = []

    def submit(self, iid: str, state: S = S.QUEUED, reason: str = "", long: bool = True,
               record: bool = True) -> None:
        self.submitted[iid] = long
        if record:
            rec = InstanceRecord(instance_id=iid, spec=SLEEPER if long else BLIP, state=state,
                                 reason=reason)
            self.files[instance_path(iid)] = encode(rec)

    def place(self, node: str, *iids: str) -> None:
        self.nodes.setdefault(node, []).extend(iids)

    def run(self, iid: str, node: str, *, env: bool = True, listed: bool = False
            ) -> subprocess.Popen[bytes]:
        """A live process for `iid`: carrying its id and node in its environment, with its
        cwd under the node's state dir (`env`), and/or named in the node's agent.json with
        its pid and start time (`listed`)."""
        cwd = self.workers / node / "instances" / iid if env else self.root
        cwd.mkdir(parents=True, exist_ok=True)
        extra = {"GAVEL_INSTANCE_ID": iid, "GAVEL_NODE_ID": node} if env else {}
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                                cwd=cwd, env={**os.environ, **extra},
                                stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        if listed:
            self.list(iid, node, proc.pid)
        return proc

    def list(self, iid: str, node: str, pid: int) -> None:
        started = process_start_time(pid) or 0.0
        self.held.setdefault(node, {})[iid] = LocalInstance(
            placement=Placement(instance_id=iid, spec=SLEEPER, auction_id="a1"),
            state="running", pid=pid, create_time=started)

    def build(self) -> None:
        for node, iids in self.nodes.items():
            self.files[node_path(node)] = encode(NodeFile(node_id=node, instances={
                i: Assignment(instance_id=i, auction_id="a1", cpu=0.05, memory_mb=16)
                for i in iids}))
        self.ledger.write_files(self.files, "the end state", self.ledger.head())
        for node, held in self.held.items():
            (self.workers / node).mkdir(parents=True, exist_ok=True)
            save(self.workers / node / "agent.json", AgentFile(node_id=node, instances=held))

    def verdict(self, accepted: list[str] | None = None) -> Verdict:
        self.build()
        return verify(Ledger(self.root / "state.git").state(), self.submitted,
                      self.submitted if accepted is None else accepted,
                      alive_by_node(self.workers))

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[Scene]:
    s = Scene(tmp_path / "chaos")
    try:
        yield s
    finally:
        s.close()


def _clean(s: Scene) -> None:
    """A sleeper placed on n1 and alive there (process and agent.json), a blip that
    succeeded, one cancelled with its reason."""
    s.submit("s1")
    s.place("n1", "s1")
    s.run("s1", "n1", listed=True)
    s.submit("b1", S.SUCCEEDED, long=False)
    s.submit("c1", S.CANCELLED, reason="cancelled by the operator", long=False)


def test_a_clean_end_state_is_settled_and_clean(scene: Scene) -> None:
    _clean(scene)
    v = scene.verdict()
    assert v.errors == []
    assert (v.placed_once, dict(v.terminal)) == (1, {"succeeded": 1, "cancelled": 1})
    assert (v.missing, v.duplicated, v.ended_lost) == ([], [], [])
    assert v.settled and v.clean


def test_an_instance_in_two_node_files_is_duplicated(scene: Scene) -> None:
    _clean(scene)
    scene.place("n2", "s1")
    v = scene.verdict()
    assert v.duplicated == ["s1"]
    assert v.errors == ["s1: placed in 2 node.json files: ['n1', 'n2']"]
    assert not v.settled


@pytest.mark.parametrize("how", ["agent.json", "processes"])
def test_an_instance_held_by_two_workers_is_duplicated(scene: Scene, how: str) -> None:
    """Git places it once, on n1; two workers hold it: each one's agent.json names a live
    process of its own (no environment to find them by), or two processes carry its id,
    one under each node's state dir (no agent.json at all)."""
    scene.submit("s1")
    scene.place("n1", "s1")
    for node in ("n1", "n2"):
        if how == "agent.json":
            scene.run("s1", node, env=False, listed=True)
        else:
            scene.run("s1", node)
    v = scene.verdict()
    assert v.duplicated == ["s1"]
    assert v.errors == ["s1: alive on 2 nodes: ['n1', 'n2']"]
    assert not v.settled


def test_a_pid_that_no_longer_runs_holds_nothing(scene: Scene) -> None:
    """The other side of liveness: n2's agent.json names a process that has exited, and
    one whose pid is right but whose start time is not (a recycled pid)."""
    _clean(scene)
    gone = scene.run("s1", "n2", env=False)
    gone.kill()
    gone.wait()
    scene.list("s1", "n2", gone.pid)
    other = scene.run("x", "n3", env=False)
    scene.held["n3"] = {"s1": LocalInstance(
        placement=Placement(instance_id="s1", spec=SLEEPER, auction_id="a1"),
        state="running", pid=other.pid, create_time=1.0)}
    v = scene.verdict()
    assert alive_by_node(scene.workers) == {"s1": {"n1"}}
    assert v.errors == [] and v.settled


@pytest.mark.parametrize(("setup", "error"), [
    ("never accepted", "m1: the broker never accepted the submission"),
    ("no record", "m1: accepted, but instances/m1.json is not in git"),
    ("queued nowhere", "m1: queued and in no node.json"),
    ("unschedulable nowhere", "m1: unschedulable and in no node.json (no node has room)"),
])
def test_a_missing_instance_is_reported(scene: Scene, setup: str, error: str) -> None:
    _clean(scene)
    state = S.UNSCHEDULABLE if setup.startswith("unschedulable") else S.QUEUED
    scene.submit("m1", state, reason="no node has room" if state is S.UNSCHEDULABLE else "",
                 record=setup != "no record")
    accepted = [i for i in scene.submitted if setup != "never accepted" or i != "m1"]
    v = scene.verdict(accepted)
    assert v.missing == ["m1"]
    assert [e for e in v.errors if e.startswith("m1")] == [error.replace(
        "instances/m1.json", instance_path("m1"))]
    assert not v.settled


def test_an_instance_the_broker_ended_lost_is_counted_on_its_own(scene: Scene) -> None:
    """`lost` is honest - the broker says so, with its reason - so the run is settled; but it
    is no clean run, and the count is its own, not one more terminal state."""
    _clean(scene)
    scene.submit("l1", S.LOST, reason=NO_LEASE)
    v = scene.verdict()
    assert v.ended_lost == ["l1"]
    assert dict(v.terminal) == {"succeeded": 1, "cancelled": 1}  # no "lost" among them
    assert v.errors == [] and v.settled and not v.clean


def test_a_lost_without_a_reason_is_an_error(scene: Scene) -> None:
    scene.submit("l1", S.LOST)
    v = scene.verdict()
    assert v.ended_lost == ["l1"]
    assert v.errors == ["l1: lost without a reason"]


def test_a_lost_instance_still_alive_is_an_error(scene: Scene) -> None:
    scene.submit("l1", S.LOST, reason=NO_LEASE)
    scene.run("l1", "n1")
    v = scene.verdict()
    assert v.errors == ["l1: lost in git but alive on ['n1']"]


def test_the_summary_carries_the_lost_count(scene: Scene) -> None:
    """The chaos run's JSON summary over the same end state: `ended_lost` counted apart
    from `terminal`, `ok` (honest) but not `clean`."""
    _clean(scene)
    scene.submit("l1", S.LOST, reason=NO_LEASE)
    scene.submit("l2", S.LOST, reason=NO_LEASE)
    scene.build()
    chaos = Chaos(Options(), scene.root, Cluster(scene.root, ["n1"]), nc=None)
    chaos.seen.submitted = dict(scene.submitted)
    chaos.seen.accepted = set(scene.submitted)
    chaos.verdict = chaos.check()
    summary = json.loads(json.dumps(chaos.summary()))
    assert (summary["ended_lost"], summary["lost"], summary["duplicated"]) == (2, 0, 0)
    assert summary["terminal"] == {"cancelled": 1, "succeeded": 1}
    assert summary["placed_once"] + sum(summary["terminal"].values()) \
        + summary["ended_lost"] == summary["submitted"] == 5
    assert summary["ok"] is True and summary["clean"] is False
    assert summary["errors"] == []


@pytest.mark.parametrize("reason", [Reason.ALL_FULL, Reason.NO_ROOM_CPU, Reason.NO_ROOM_MEMORY])
def test_work_waiting_for_room_is_unschedulable_not_lost(scene: Scene, reason: Reason) -> None:
    """An instance the broker keeps unschedulable because every node that bid had no room
    is accounted for - the fleet was too small, gavel lost nothing - and counted on its
    own in the summary, beside the placed, terminal and ended-lost ones."""
    _clean(scene)
    scene.submit("u1", S.UNSCHEDULABLE, reason=str(reason))
    scene.submit("w1", S.UNSCHEDULABLE, reason=str(Reason.NO_BIDS))  # a wait, not want of room
    v = scene.verdict()
    assert v.unschedulable == ["u1"]
    assert v.missing == ["w1"] and not v.settled
    del scene.submitted["w1"]
    scene.files.pop(instance_path("w1"))
    scene.build()
    chaos = Chaos(Options(), scene.root, Cluster(scene.root, ["n1"]), nc=None)
    chaos.seen.submitted = dict(scene.submitted)
    chaos.seen.accepted = set(scene.submitted)
    chaos.verdict = chaos.check()
    assert chaos.verdict.settled
    summary = json.loads(json.dumps(chaos.summary()))
    assert (summary["unschedulable"], summary["lost"], summary["duplicated"]) == (1, 0, 0)
    assert summary["placed_once"] + sum(summary["terminal"].values()) + summary["ended_lost"] \
        + summary["unschedulable"] == summary["submitted"] == 4
    assert summary["ok"] is True and summary["errors"] == []
