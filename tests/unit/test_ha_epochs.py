"""Epochs in memory: a worker acts on nothing from an older leadership than the newest it
has heard from, and remembers the newest in agent.json; what a leader commits is told only
once it is durable off-host; the KV entry carries the epoch.

A real `Agent` (real supervisor, real state directory, real child processes) that is never
connected: awards, cancels and KV entries are handed to its handlers directly.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import msgspec
import pytest

from gavel.broker.fencedkv import with_epoch
from gavel.broker.ledger.committer import Committer, Item, Planned
from gavel.broker.ledger.plan import View, submit
from gavel.broker.ledger.repository import Ledger
from gavel.broker.ledger.state import Change, compact
from gavel.broker.ledger.takeover import next_epoch
from gavel.shared import subjects
from gavel.shared.messages import Award, Cancel, Spec
from gavel.shared.records import Assignment, InstanceRecord, NodeEntry, NodeFile
from gavel.shared.strategies import make_strategy
from gavel.shared.timing import Timing
from gavel.worker.agent import Agent
from gavel.worker.supervisor import OLDER_AWARD, OLDER_CANCEL, OLDER_NODE
from gavel.worker.watch import Entry
from tests.unit.commitkit import Gate, Then, heard
from tests.unit.fuzzkit import Msg

NODE = "n1"
SLEEPER = Spec(name="s", command=[sys.executable, "-c", "import time; time.sleep(60)"])
_enc = msgspec.msgpack.Encoder()


def agent(state: Path) -> Agent:
    return Agent(nats_url="nats://127.0.0.1:1", node_id=NODE,
                 strategy=make_strategy("least-loaded"), labels={}, state_dir=state,
                 timing=Timing().scaled(10), cpu=4.0, memory_mb=4096)


def award(iid: str, epoch: int) -> Msg:
    return Msg(subjects.AWARD.format(node=NODE), _enc.encode(Award(
        auction_id="a", instance_id=iid, node_id=NODE, spec=SLEEPER, epoch=epoch)))


def cancel(iid: str, epoch: int) -> Msg:
    return Msg(subjects.CANCEL.format(node=NODE), _enc.encode(Cancel(
        instance_id=iid, node_id=NODE, epoch=epoch)))


def saved_epoch(state: Path) -> int:
    return int(json.loads((state / "agent.json").read_bytes())["epoch"])


async def test_an_award_and_a_cancel_of_an_older_epoch_change_nothing(tmp_path: Path) -> None:
    a = agent(tmp_path)
    sup = a._supervisor
    await sup.restore()
    try:
        await a._on_award(award("new", 7))
        assert sup.held() == {"new": 1} and saved_epoch(tmp_path) == 7
        await a._on_award(award("old", 5))  # a deposed leader's award, heard late
        assert "old" not in sup.held() and a.ignored[OLDER_AWARD] == 1
        await a._on_cancel(cancel("new", 5))  # a deposed leader's cancel
        assert sup.held() == {"new": 1} and a.ignored[OLDER_CANCEL] == 1
        await a._on_cancel(cancel("new", 8))  # a newer leadership's is obeyed
        assert sup.held() == {} and saved_epoch(tmp_path) == 8
    finally:
        await sup.shutdown(kill=True)


async def test_the_newest_epoch_outlives_a_worker_restart(tmp_path: Path) -> None:
    first = agent(tmp_path)._supervisor
    await first.restore()
    assert first.admit(4) and first.admit(9) and not first.admit(4)
    again = agent(tmp_path)
    await again._supervisor.restore()  # a new worker process on the same state directory
    try:
        assert again._supervisor.epoch == 9
        await again._on_award(award("late", 4))
        assert again._supervisor.held() == {} and again.ignored[OLDER_AWARD] == 1
    finally:
        await again._supervisor.shutdown(kill=True)


async def test_epoch_zero_is_a_broker_without_ha_and_always_heard(tmp_path: Path) -> None:
    a = agent(tmp_path)
    sup = a._supervisor
    await sup.restore()
    try:
        assert sup.admit(6)
        await a._on_award(award("plain", 0))
        assert sup.held() == {"plain": 1} and sup.epoch == 6
    finally:
        await sup.shutdown(kill=True)


def entry(revision: int, epoch: int, *iids: str) -> Entry:
    nf = NodeFile(node_id=NODE, instances={
        i: Assignment(instance_id=i, auction_id="a") for i in iids})
    return Entry(revision=revision, operation=None, value=with_epoch(compact(nf), epoch))


async def test_a_kv_entry_of_an_older_epoch_is_ignored(tmp_path: Path) -> None:
    a = agent(tmp_path)
    await a._supervisor.restore()
    conv = a.converger
    conv._observe(entry(3, 7, "i1"))
    assert conv.revision == 3 and conv.node is not None and list(conv.node.instances) == ["i1"]
    conv._observe(entry(4, 5))  # a deposed leader's late put, landed after ours
    assert conv.revision == 3 and list(conv.node.instances) == ["i1"]
    assert a.ignored[OLDER_NODE] == 1
    conv._observe(entry(5, 7))
    assert conv.revision == 5 and conv.node.instances == {}


def test_the_kv_entry_is_node_json_with_the_epoch_and_old_readers_still_read_it() -> None:
    nf = NodeFile(node_id=NODE, draining=True, blocked_ports=[20001])
    data = with_epoch(compact(nf), 12)
    got = msgspec.json.decode(data, type=NodeEntry)
    assert (got.epoch, got.node_id, got.draining, got.blocked_ports) == (12, NODE, True, [20001])
    assert msgspec.json.decode(data, type=NodeFile) == nf  # a worker without epochs
    assert msgspec.json.decode(compact(nf), type=NodeEntry).epoch == 0  # a broker without HA


def test_epochs_only_grow() -> None:
    assert next_epoch(5, 0) == 5  # the lease's revision
    assert next_epoch(5, 9) == 10  # a lease bucket made anew counts from 1 again
    assert next_epoch(11, 10) == 11


@pytest.mark.parametrize("durable", [False, True])
async def test_a_commit_is_told_only_once_it_is_durable(tmp_path: Path, durable: bool) -> None:
    ledger = Ledger(tmp_path / "state.git")
    committer = heard(Committer(ledger, writer="thread"))
    gate = Gate()
    told: list[str] = []
    mirrored: list[str] = []
    if durable:
        committer.durable = gate
        committer.on_durable = lambda change, sha: mirrored.append(sha)

    def committed(change: Change, sha: str) -> None:
        gate.notified += 1

    committer.on_commit = committed
    runner = asyncio.create_task(committer.run())

    def make(view: View) -> Planned:
        submit(view, InstanceRecord(instance_id="i1", spec=SLEEPER))
        return Planned(lines=["submit i1"], effects=[Then(told.append)])

    committer.submit(Item(plan=make))
    try:
        for _ in range(200):
            if ledger.state().head is not None and (told or durable):
                break
            await asyncio.sleep(0.01)
        head = ledger.state().head
        assert head is not None  # the commit landed in the local repository
        await asyncio.sleep(0.1)
        if not durable:
            assert told == [head]  # without HA nothing waits
            return
        assert told == [] and mirrored == []  # not durable yet: nobody is told
        gate.land()
        await asyncio.wait_for(committer.idle.wait(), 5)
        assert mirrored == [head] and told == [head]
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        committer.close()
