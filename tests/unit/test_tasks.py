"""`transport.tasks`: a crash is reported as it happens, and nothing outlives its owner."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gavel.broker.heartbeat_stream import HeartbeatStream
from gavel.broker.ledger.committer import Committer, Item
from gavel.broker.ledger.repository import Ledger
from gavel.broker.service import Broker, Config
from gavel.shared.spec import Check
from gavel.shared.strategies import make_strategy
from gavel.shared.timing import Timing
from gavel.transport.tasks import Crashed, Tasks, opened_until, until
from gavel.worker.agent import Agent
from gavel.worker.instance import Held, Life
from gavel.worker.probes import Prober

LOG = logging.getLogger("gavel.test.tasks")


async def forever() -> None:
    await asyncio.Event().wait()


async def fails() -> None:
    await asyncio.sleep(0)
    raise ValueError("a bug")


def pending(names: set[str]) -> set[str]:
    return {t.get_name() for t in asyncio.all_tasks() if not t.done()} & names


async def crash_then_look(tasks: Tasks, crashes: list[Crashed]) -> None:
    tasks.spawn(forever(), name="sibling")
    tasks.spawn(fails(), name="buggy")
    for _ in range(5):  # the crash, then its done callback
        await asyncio.sleep(0)
    assert [c.name for c in crashes] == ["buggy"]
    assert str(crashes[0]) == "broker task buggy failed: ValueError('a bug')"
    assert pending({"sibling"}) == {"sibling"}  # one crash leaves its siblings running
    assert len(tasks) == 1


def test_a_crash_is_reported_at_once_and_close_leaves_nothing_pending(
        caplog: pytest.LogCaptureFixture) -> None:
    crashes: list[Crashed] = []

    async def scenario() -> None:
        tasks = Tasks("broker", LOG, crashed=crashes.append)
        with caplog.at_level(logging.ERROR, logger=LOG.name):
            await crash_then_look(tasks, crashes)
            failed = [r for r in caplog.records if r.getMessage() == "broker task buggy failed"]
            assert len(failed) == 1 and failed[0].exc_info is not None  # before any close
        await tasks.aclose(5.0)
        assert pending({"sibling", "buggy"}) == set()
        assert len(tasks) == 0
        late = tasks.spawn(forever(), name="late")  # spawned once closed: never runs
        await asyncio.sleep(0)
        assert late.cancelled()

    asyncio.run(scenario())


def test_a_task_that_returns_or_is_cancelled_is_no_crash() -> None:
    crashes: list[Crashed] = []

    async def scenario() -> None:
        tasks = Tasks("worker", LOG, crashed=crashes.append)
        done = tasks.spawn(asyncio.sleep(0, result=7), name="done")
        stopped = tasks.spawn(forever(), name="stopped")
        await asyncio.sleep(0)
        stopped.cancel()
        assert await done == 7
        await asyncio.wait({stopped})
        assert not tasks and crashes == []

    asyncio.run(scenario())


def test_until_gives_the_work_up_once_told_to_stop() -> None:
    """Rule 5: told to stop first, the work is cancelled and awaited (its own clean-up runs
    before `until` returns); ended first, what it returned or raised is the task's."""
    async def scenario() -> None:
        cleaned: list[str] = []

        async def starting() -> None:
            try:
                await forever()
            finally:
                cleaned.append("starting")

        stopped = asyncio.Event()
        asyncio.get_running_loop().call_soon(stopped.set)
        given_up = await until(stopped, starting())
        assert given_up.cancelled() and cleaned == ["starting"]
        assert (await until(asyncio.Event(), asyncio.sleep(0, result=7))).result() == 7
        failed = await until(asyncio.Event(), fails())
        with pytest.raises(ValueError, match="a bug"):
            failed.result()
        await asyncio.sleep(0)
        assert not [t for t in asyncio.all_tasks()
                    if t is not asyncio.current_task() and not t.done()]

        async def stubborn() -> None:  # swallows the first cancel, as nats-py's connect can
            try:
                await forever()
            except asyncio.CancelledError:
                cleaned.append("swallowed")
            await forever()

        told = asyncio.Event()
        asyncio.get_running_loop().call_soon(told.set)
        async with asyncio.timeout(5):  # one cancel, not repeated, would leave it running
            assert (await until(told, stubborn())).cancelled()
        assert cleaned == ["starting", "swallowed"]

    asyncio.run(scenario())


class Opened:
    def __init__(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True


def test_opened_until_closes_what_was_opened_after_the_stop() -> None:
    """Rule 5: what the work opened, or None once told to stop - a connection the work made
    while it swallowed the cancel (nats-py's first connect can) is closed, not leaked."""
    async def scenario() -> None:
        made: list[Opened] = []

        async def opens_anyway() -> Opened:  # swallows the cancel and opens all the same
            with contextlib.suppress(asyncio.CancelledError):
                await forever()
            made.append(Opened())
            return made[-1]

        told = asyncio.Event()
        asyncio.get_running_loop().call_soon(told.set)
        assert await opened_until(told, opens_anyway()) is None
        assert len(made) == 1 and made[0].closed
        opened = await opened_until(asyncio.Event(), asyncio.sleep(0, result=Opened()))
        assert isinstance(opened, Opened) and not opened.closed
        with pytest.raises(ValueError, match="a bug"):
            await opened_until(asyncio.Event(), fails())

    asyncio.run(scenario())


def test_a_failure_on_the_way_out_is_no_crash() -> None:
    """A task that raises as its owner stops it is not reported as a crash: the part is
    ending anyway."""
    crashes: list[Crashed] = []

    async def untidy() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise OSError("connection closed") from None

    async def scenario() -> None:
        tasks = Tasks("lease", LOG, crashed=crashes.append)
        tasks.spawn(untidy(), name="untidy")
        await asyncio.sleep(0)
        await tasks.aclose(5.0)
        assert not tasks and crashes == []

    asyncio.run(scenario())


def test_a_stuck_task_is_logged_not_waited_for(caplog: pytest.LogCaptureFixture) -> None:
    async def stubborn(release: asyncio.Event) -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue

    async def scenario() -> None:
        release = asyncio.Event()
        tasks = Tasks("worker", LOG)
        task = tasks.spawn(stubborn(release), name="stubborn")
        await asyncio.sleep(0)
        with caplog.at_level(logging.ERROR, logger=LOG.name):
            await tasks.aclose(0.01)
        assert "worker task stubborn did not stop within 0.01s" in caplog.messages
        release.set()
        await task

    asyncio.run(scenario())


def test_a_broker_loop_that_crashes_stops_the_broker_at_once(tmp_path: Path) -> None:
    """The broker's loops are its `tasks`: a crash in one sets `fatal` and stops it now, and
    once closed none of its tasks is pending."""
    async def scenario() -> None:
        broker = Broker(Config(nats_url="nats://127.0.0.1:1", state_dir=tmp_path,
                               timing=Timing()))
        broker.tasks.spawn(forever(), name="reconcile")
        broker.tasks.spawn(fails(), name="outbox")
        for _ in range(5):  # the crash, then its done callback: no tick, no close
            await asyncio.sleep(0)
        assert broker.stopped.is_set()
        assert isinstance(broker.fatal, Crashed) and broker.fatal.name == "outbox"
        await broker.close()
        assert pending({"reconcile", "outbox"}) == set()

    asyncio.run(scenario())


def test_a_worker_loop_that_crashes_stops_the_agent_at_once(tmp_path: Path) -> None:
    """The agent's loops, and its converger's, are the agent's to act on: a crash in one
    asks `run` to end now, leaving the instances running, and once the agent has shut down
    none of its tasks is pending."""
    async def scenario() -> None:
        agent = Agent(nats_url="nats://127.0.0.1:1", node_id="n1",
                      strategy=make_strategy("least-loaded"), labels={},
                      state_dir=tmp_path, timing=Timing(), cpu=1.0, memory_mb=512)
        agent._loops.spawn(forever(), name="stats")
        agent.converger.start_link_watch(lambda: None)
        agent.converger._loops.spawn(fails(), name="watch")
        for _ in range(5):  # the crash, then its done callback
            await asyncio.sleep(0)
        assert isinstance(agent.crashed, Crashed) and agent.crashed.name == "watch"
        assert agent._stop_requested.is_set() and not agent._kill_children
        await agent._shutdown()
        assert pending({"stats", "link", "watch"}) == set()

    asyncio.run(scenario())


def test_a_crash_in_the_heartbeat_feeds_own_tasks_ends_the_feed() -> None:
    """The feed's probe and stream-making tasks are a group of its loop: a crash in one
    ends `run` at once (its owner, the broker, then reports it), and nothing is left."""
    async def scenario() -> None:
        feed = HeartbeatStream(timing=Timing(), deliver=lambda m: None, deaf=lambda s: None,
                               hearing=lambda: None, now=lambda: 0.0, log=LOG)
        feed._later = True
        feed._until_stream = fails  # type: ignore[method-assign]
        with pytest.raises(ExceptionGroup) as raised:
            async with asyncio.timeout(60):  # without the group: the feed runs on
                await feed.run()
        assert raised.group_contains(ValueError)
        assert pending({"heartbeat-probe", "heartbeat-stream-later"}) == set()

    asyncio.run(scenario())


def test_a_crash_in_the_committers_after_work_ends_its_run(tmp_path: Path) -> None:
    """The after-commit work is a group of the committer's loop: a crash in it ends `run`
    at once (the broker, its owner, reports it), leaving nothing running."""
    class Broken:
        def mark(self) -> int:
            return 0

        async def wait(self, mark: int) -> None:
            raise ValueError("a bug")

    async def scenario() -> None:
        committer = Committer(Ledger(tmp_path / "state.git"), writer="thread",
                              durable=Broken())
        committer.submit(Item(plan=lambda view: None))  # no change: its after-work runs
        with pytest.raises(ExceptionGroup) as raised:
            async with asyncio.timeout(60):  # without the group: the committer runs on
                await committer.run()
        assert raised.group_contains(ValueError)
        assert pending({"after-commit"}) == set()
        committer.close()

    asyncio.run(scenario())


def test_a_run_s_checks_end_before_its_watch_does() -> None:
    """An instance's checks (`worker.probes.Prober`) are the run's: when the process exits,
    the check under way is ended and awaited before the run's watch returns, not left
    cancelled behind it."""
    async def scenario() -> None:
        checking = asyncio.Event()

        async def hangs(command: Any, env: Any, cwd: Any) -> tuple[bool, str]:
            checking.set()
            await forever()
            return True, ""

        async def no_env() -> dict[str, str]:
            return {}

        async def heard(change: Any) -> None:
            return None

        class Exits:  # a process that exits while its check runs
            async def wait(self) -> int:
                await checking.wait()
                return 0

        prober = Prober([Check(type="exec", command=["true"], timeout_s=3600.0)],
                        started=time.time(), ports={}, env=no_env, cwd=Path("/"),
                        on_change=heard, execute=hangs)
        held = Held(local=None, proc=Exits(), prober=prober)  # type: ignore[arg-type]
        prober.start()
        life = Life(SimpleNamespace(timing=Timing()), held)  # type: ignore[arg-type]
        assert await life._watch() == (0, None)
        assert {t for t in asyncio.all_tasks() if t is not asyncio.current_task()
                and not t.done()} == set()

    asyncio.run(scenario())
