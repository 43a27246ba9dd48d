"""The broker's long passes in steps, on a real broker in memory: the loop runs other work
between the services' pass's steps (`broker.services` rule 9), which decides as it would in
one go and takes no replica started while its steps run for one that ended; and between
auctioneer's passes woken again at once (`broker.service` rule 9)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable

import pytest

from gavel.broker import steps
from gavel.broker.serviceplans import Started
from tests.unit.test_fuzz_broker import Rig
from tests.unit.test_services import deployed, live, settle, web


@pytest.fixture
def stepped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step every two replicas, and a turn of the loop after every step."""
    monkeypatch.setattr(steps, "EVERY", 2)
    monkeypatch.setattr(steps, "SLICE_S", 0.0)


def _pass(rig: Rig, between: list[str], during: Callable[[], None] | None = None) -> None:
    """One pass of the services at the rig's clock, noting each turn another task gets
    while it runs (and calling `during` once the pass has begun)."""
    async def both() -> None:
        work = asyncio.ensure_future(rig.b.services.watch(rig.now))
        while not work.done():
            between.append("turn")
            if during is not None and len(between) == 2:
                during()
            await asyncio.sleep(0)
        work.result()
    rig.run(both())
    settle(rig)


def test_a_pass_lets_the_loop_run_between_its_steps_and_starts_the_next_chunk(
        rig: Rig, stepped: None) -> None:
    """Rule 6 and 8: two replicas a pass, each pass and its plan read in steps."""
    rig.b.services.start_chunk = 2
    deployed(rig, web(count=9))
    assert len(live(rig)) == 2  # the deploy's own first steps
    for want in (4, 6, 8, 9):
        turns: list[str] = []
        _pass(rig, turns)
        assert len(turns) >= len(live(rig)) // 2, "the pass ran in one go"
        assert len(live(rig)) == want
    assert len({r.instance_id for r in live(rig)}) == 9


def test_a_replica_started_while_a_pass_runs_is_not_taken_for_an_end(
        rig: Rig, stepped: None) -> None:
    deployed(rig, web(count=6))
    services = rig.b.services
    _pass(rig, [])
    assert not services._ended.get("web")
    turns: list[str] = []  # a commit of the service lands while the pass reads (rule 9)
    _pass(rig, turns, during=lambda: services._started(Started("web", ("web-late",), rig.now),
                                                       ""))
    assert len(turns) > 2
    assert "web-late" in services._live["web"]
    assert not services._ended.get("web"), services._ended


def test_auctioneers_passes_woken_again_at_once_let_the_loop_run_between(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wave of retries come due is a chain of passes, each taking the room for auctions
    and waking the next: each is a step of its own."""
    log: list[str] = []

    def chained(now: float) -> None:
        log.append("pass")
        if log.count("pass") < 6:
            rig.b.wake()
    monkeypatch.setattr(rig.b.auctioneer, "reconcile", chained)

    async def go() -> None:
        looping = asyncio.ensure_future(rig.b._loop())
        try:
            while log.count("pass") < 6:
                log.append("turn")
                await asyncio.sleep(0)
        finally:
            looping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await looping
    rig.run(go())
    passes = [i for i, e in enumerate(log) if e == "pass"]
    assert len(passes) == 6
    assert all("turn" in log[a:b] for a, b in itertools.pairwise(passes)), log
