"""A writer process that dies is replaced and the write goes on: the commit it was asked for
lands once, on a fresh writer, and no item hears of the death - also when the writer was
killed holding the ref's lock. (`broker.ledger.committer` rule 11.) A broker that ends joins
its writer process, so none is left to race the interpreter's exit; a hung one is left."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path

import psutil
import pytest

from gavel.broker.ledger import committer as committer_module
from gavel.broker.ledger.committer import Committer, Item, Planned
from gavel.broker.ledger.plan import View, submit
from gavel.broker.ledger.repository import Ledger
from gavel.shared.messages import Spec
from gavel.shared.records import InstanceRecord
from tests.unit.commitkit import Failed, Then, heard

DIED = "the writer process died; a new one takes over"


class Told:
    """What one item (not retried: a failure would be final) heard."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.landed: list[str] = []
        self.failed: list[str] = []

    def item(self) -> Item:
        def plan(view: View) -> Planned:
            submit(view, InstanceRecord(instance_id=self.name,
                                        spec=Spec(name="s", command=["true"])))
            return Planned(lines=[f"submit {self.name}"], effects=[Then(self.landed.append)])
        return Item(plan=plan, retry=False,
                    gave_up=[Failed(lambda reason, _d: self.failed.append(reason))])


async def commit(committer: Committer, told: Told) -> None:
    committer.submit(told.item())
    await asyncio.sleep(0)
    await asyncio.wait_for(committer.idle.wait(), 60)


async def writer_pid(committer: Committer) -> int:
    pid = await asyncio.get_running_loop().run_in_executor(committer._pool, os.getpid)
    assert pid != os.getpid()
    return pid


async def kill_writer(committer: Committer) -> None:
    os.kill(await writer_pid(committer), signal.SIGKILL)


@pytest.mark.parametrize("left_lock", [False, True], ids=["between-commits", "holding-lock"])
async def test_a_killed_writer_is_replaced_and_the_next_commits_land_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, left_lock: bool) -> None:
    ledger = Ledger(tmp_path / "state.git")
    committer = heard(Committer(ledger, writer="process"))
    task = asyncio.create_task(committer.run())
    try:
        first, second, third = Told("a"), Told("b"), Told("c")
        await commit(committer, first)
        assert first.landed == [ledger.head()]
        await kill_writer(committer)
        if left_lock:  # killed between locking the ref and moving it
            (tmp_path / "state.git" / "refs" / "heads" / "main.lock").write_text("x")
        with caplog.at_level(logging.WARNING, logger="gavel.ledger"):
            await commit(committer, second)
            await commit(committer, third)
        assert (second.failed, third.failed) == ([], [])
        assert third.landed == [ledger.head()] and second.landed != third.landed
        assert caplog.text.count(DIED) == 1
        messages = [c.message for c in ledger.history()]
        assert messages.count("submit b\n") == 1 and messages.count("submit c\n") == 1
    finally:
        task.cancel()
        committer.close()


async def test_a_writer_killed_with_a_write_in_flight_is_replaced_and_it_lands_once(
        tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "state.git")
    committer = heard(Committer(ledger, writer="process"))
    task = asyncio.create_task(committer.run())
    try:
        first, second = Told("a"), Told("b")
        await commit(committer, first)
        pid = await writer_pid(committer)
        os.kill(pid, signal.SIGSTOP)  # the write is handed over but never taken
        committer.submit(second.item())

        async def handed_over() -> None:
            while not ledger.writing:
                await asyncio.sleep(0)
        await asyncio.wait_for(handed_over(), 60)
        os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(0)
        await asyncio.wait_for(committer.idle.wait(), 60)
        assert second.failed == [] and second.landed == [ledger.head()]
        assert [c.message for c in ledger.history()].count("submit b\n") == 1
    finally:
        task.cancel()
        committer.close()


def _dies_at_once() -> None:
    os._exit(1)  # a writer that dies as it starts (a broken install, no memory)


async def test_writers_that_die_as_they_start_give_way_to_a_thread_and_the_commit_lands(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 11: a fresh writer process that dies before it writes, again and again, would be
    replaced for ever while nothing lands; after `WRITER_DEATHS` in a row a thread writes."""
    real = committer_module.make_executor

    def dying(kind: str, orphan_s: float) -> Executor:
        if kind != "process":
            return real(kind, orphan_s)
        return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context(
            "spawn"), initializer=_dies_at_once)

    monkeypatch.setattr(committer_module, "make_executor", dying)
    ledger = Ledger(tmp_path / "state.git")
    committer = heard(Committer(ledger, writer="process", retry_s=0.05))
    task = asyncio.create_task(committer.run())
    try:
        told = Told("a")
        retried = Item(plan=told.item().plan, retry=True)
        with caplog.at_level(logging.WARNING, logger="gavel.ledger"):
            committer.submit(retried)
            await asyncio.wait_for(_landed(told), 120)
        assert committer.writer == "thread"
        assert caplog.text.count("commits are written on a thread from now on") == 1
        assert [c.message for c in ledger.history()].count("submit a\n") == 1
    finally:
        task.cancel()


async def _landed(told: Told) -> None:
    while not told.landed:
        await asyncio.sleep(0.05)


async def test_joined_the_writer_process_is_gone_and_a_hung_one_is_left_behind(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    committer = Committer(Ledger(tmp_path / "state.git"), writer="process")
    pid = await writer_pid(committer)
    await committer.join(30.0)
    assert committer.closed and not psutil.pid_exists(pid)

    hung = Committer(Ledger(tmp_path / "hung.git"), writer="process")
    pid = await writer_pid(hung)
    os.kill(pid, signal.SIGSTOP)
    try:
        with caplog.at_level(logging.WARNING, logger="gavel.ledger"):
            await asyncio.wait_for(hung.join(0.2), 10)
        assert "the git writer did not finish within 0.2s; leaving it" in caplog.text
        assert psutil.pid_exists(pid)
    finally:
        os.kill(pid, signal.SIGKILL)
