"""Group commit: the work promised after a commit does not stall the loop.

A large group commit carries out thousands of effects (awards, events, timers). They run
in slices with the loop's other work between them, so the bid replies of open auctions are
read while a commit's awards go out - in order, and only after the ref has moved.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pygit2
import pytest

from gavel.broker.ledger import state as ledger_state
from gavel.broker.ledger.committer import AFTER_SLICE_S, Committer, Item, Planned
from gavel.broker.ledger.plan import View, submit
from gavel.broker.ledger.repository import Ledger
from gavel.broker.ledger.state import encode
from gavel.shared.messages import Spec
from gavel.shared.records import InstanceRecord, NodeFile, instance_path
from tests.unit.commitkit import Then, heard

SPEC = Spec(name="s", command=["true"])


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


_N = 40


async def _forty_effects(tmp_path: Path, slice_s: float | None
                         ) -> tuple[list[int], list[str | None], list[int], Ledger, Committer]:
    """One group commit of `_N` submits whose effects each spin a quarter slice (ten
    slices' worth in all): the order they ran in, the head each saw, and how many had run
    each time another task got a turn of the loop."""
    ledger = Ledger(tmp_path / "state.git")
    committer = heard(Committer(ledger, writer="thread", slice_s=slice_s))
    runner = asyncio.create_task(committer.run())
    order: list[int] = []
    ticks: list[int] = []
    heads: list[str | None] = []

    def plan(k: int) -> Item:
        def make(view: View) -> Planned:
            submit(view, InstanceRecord(instance_id=f"i{k}", spec=SPEC))

            def after(sha: str) -> None:
                heads.append(ledger.state().head if sha else None)
                order.append(k)
                _spin(AFTER_SLICE_S / 4)
            return Planned(lines=[f"submit i{k}"], effects=[Then(after)])
        return Item(plan=make)

    async def other() -> None:
        while len(order) < _N:
            ticks.append(len(order))
            await asyncio.sleep(0)

    try:
        for k in range(_N):
            committer.submit(plan(k))
        await asyncio.wait_for(other(), 10)
        await asyncio.wait_for(committer.idle.wait(), 10)
    finally:
        runner.cancel()
        committer.close()
    return order, heads, ticks, ledger, committer


async def test_effects_run_in_slices_in_order_after_the_commit(tmp_path: Path) -> None:
    order, heads, ticks, ledger, committer = await _forty_effects(tmp_path, AFTER_SLICE_S)
    assert order == list(range(_N))  # in submission order
    assert committer.commits == 1  # one group commit
    assert heads == [ledger.state().head] * _N  # every callback saw the ref moved
    during = {t for t in ticks if 0 < t < _N}
    assert len(during) >= 3, f"the loop never ran between effects: {sorted(during)}"


async def test_without_slices_a_commits_effects_run_in_one_go_in_order(tmp_path: Path) -> None:
    """`slice_s=None` (the alternative the slices are measured against): every effect of
    the commit runs in order, after the ref moved, with no turn of the loop between them."""
    order, heads, ticks, ledger, committer = await _forty_effects(tmp_path, None)
    assert order == list(range(_N)) and committer.commits == 1
    assert heads == [ledger.state().head] * _N
    assert {t for t in ticks if 0 < t < _N} == set()  # the loop never ran between them


async def test_the_next_commit_is_written_while_the_last_ones_awards_go_out(
        tmp_path: Path) -> None:
    """After-commit work runs on its own task, in commit order; a commit queued meanwhile is
    planned and written without waiting for it, and one failing callback does not stop the
    others."""
    ledger = Ledger(tmp_path / "state.git")
    committer = heard(Committer(ledger, writer="thread"))
    runner = asyncio.create_task(committer.run())
    events: list[str] = []

    def item(name: str, afters: list[Callable[[str], None]]) -> Item:
        def make(view: View) -> Planned:
            events.append(f"plan {name}")
            submit(view, InstanceRecord(instance_id=name, spec=SPEC))
            return Planned(lines=[name], effects=[Then(a) for a in afters])
        return Item(plan=make)

    def queue_second(sha: str) -> None:
        committer.submit(item("second", [lambda sha: events.append("after second")]))

    def broken(sha: str) -> None:
        raise RuntimeError("a bug in one callback")

    def slow(sha: str) -> None:  # the first commit's awards take many slices to send
        _spin(AFTER_SLICE_S / 2)

    def done(sha: str) -> None:
        events.append("after first done")

    try:
        committer.submit(item("first", [queue_second, broken, *[slow] * 60, done]))
        await asyncio.sleep(0)  # let the committer take the first item
        await asyncio.wait_for(committer.idle.wait(), 10)  # idle: both commits, all afters
    finally:
        runner.cancel()
        committer.close()
    assert committer.commits == 2
    # "second" was planned while the first commit's callbacks were still running...
    assert events.index("plan second") < events.index("after first done"), events
    # ...and its own callbacks ran after all of the first's, the broken one notwithstanding.
    assert events[-2:] == ["after first done", "after second"], events
    assert set(Ledger(tmp_path / "state.git").state().instances) == {"first", "second"}


async def test_idle_only_when_nothing_is_queued_written_or_left_to_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = Ledger(tmp_path / "state.git")
    write = ledger.write_files

    def slow_write(*args: Any) -> str:
        time.sleep(0.3)  # in the writer thread: the commit is in flight this long
        return write(*args)

    committer = heard(Committer(ledger, writer="thread"))
    runner = asyncio.create_task(committer.run())
    ran: list[str] = []

    def item(name: str, then: Callable[[], None] = lambda: None) -> Item:
        def make(view: View) -> Planned:
            submit(view, InstanceRecord(instance_id=name, spec=SPEC))

            def after(sha: str) -> None:
                ran.append(name)
                then()
            return Planned(lines=[name],
                           effects=[Then(after), *[Then(lambda sha: _spin(0.001))] * 20])
        return Item(plan=make)

    def queue_b() -> None:  # b is written (slowly) while a's after-work still runs
        monkeypatch.setattr(ledger, "write_files", slow_write)
        committer.submit(item("b"))

    try:
        committer.submit(item("a", queue_b))
        while "a" not in ran:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.1)  # a's after-work is done now; b is still being written
        assert committer.commits == 1
        assert not committer.idle.is_set()
        await asyncio.wait_for(committer.idle.wait(), 10)
        assert ran == ["a", "b"] and committer.commits == 2
    finally:
        runner.cancel()
        committer.close()


async def test_a_commit_gap_gathers_what_comes_meanwhile_into_the_next_commit(
        tmp_path: Path) -> None:
    """Rule 7: after a commit, the next starts no sooner than `gap_s` later and takes all
    that queued meanwhile; after a quiet spell longer than the gap, a change goes at once."""
    gap = 1.0
    ledger = Ledger(tmp_path / "state.git")
    committer = heard(Committer(ledger, writer="thread", gap_s=gap))
    runner = asyncio.create_task(committer.run())
    landed: dict[str, float] = {}
    shas: dict[str, str] = {}

    def item(name: str) -> Item:
        def make(view: View) -> Planned:
            submit(view, InstanceRecord(instance_id=name, spec=SPEC))
            def after(sha: str) -> None:
                landed[name], shas[name] = time.monotonic(), sha
            return Planned(lines=[name], effects=[Then(after)])
        return Item(plan=make)

    try:
        committer.submit(item("a"))
        while "a" not in landed:
            await asyncio.sleep(0.005)
        committer.submit(item("b"))  # within the gap: waits for its end
        await asyncio.sleep(0.1)
        committer.submit(item("c"))  # ...and goes with b
        await asyncio.sleep(0.2)
        assert "b" not in landed and not committer.idle.is_set()
        await asyncio.wait_for(committer.idle.wait(), 10)
        assert committer.commits == 2  # a; then b and c together
        assert shas["b"] == shas["c"] != shas["a"] and landed["b"] - landed["a"] >= gap * 0.9
        await asyncio.sleep(gap + 0.1)  # a quiet spell longer than the gap
        asked = time.monotonic()
        committer.submit(item("d"))
        await asyncio.wait_for(committer.idle.wait(), 10)
        assert landed["d"] - asked < gap * 0.8, "a change after a quiet spell waited a gap"
    finally:
        runner.cancel()
        committer.close()
    assert committer.commits == 3
    assert set(Ledger(tmp_path / "state.git").state().instances) == {"a", "b", "c", "d"}


async def test_records_are_formatted_by_the_writer_not_on_the_event_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 6: the loop encodes compact JSON; git still gets the pretty files."""

    def not_here(data: bytes) -> bytes:
        raise AssertionError("formatted on the event loop")

    ledger = Ledger(tmp_path / "state.git")
    committer = heard(Committer(ledger, writer="thread"))
    runner = asyncio.create_task(committer.run())
    rec = InstanceRecord(instance_id="web-1", spec=SPEC)
    nf = NodeFile(node_id="n1")

    def make(view: View) -> Planned:
        submit(view, rec)
        view.put_node(msgspec.structs.replace(nf, draining=True))
        return Planned(lines=["submit web-1, drain n1"])

    monkeypatch.setattr(ledger_state, "pretty", not_here)
    try:
        committer.submit(Item(plan=make))
        await asyncio.wait_for(committer.idle.wait(), 10)
    finally:
        runner.cancel()
        committer.close()
    monkeypatch.undo()
    assert committer.commits == 1
    tree = ledger.repo[ledger.head()].peel(pygit2.Tree)
    assert (tree / instance_path("web-1")).data == encode(rec)
    assert (tree / "nodes/n1/node.json").data == encode(
        msgspec.structs.replace(nf, draining=True))
