"""A pass that finds too little waiting (`shared.auctioneer` rule 4: a batch under its size,
younger than `batch_wait_s`) is run again when the wait ends (`broker.auctioneer` rule 4), on
either event loop: uvloop answers a wake-up due within a millisecond with a plain `Handle`
(no `when()`), and once one was pending every later wake-up failed, so the last partial
batch of a stream waited for the next tick."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop

from gavel.broker.service import Broker, Config
from gavel.shared.timing import Timing

Runner = Callable[[Coroutine[Any, Any, None]], None]
LOOPS: dict[str, Runner] = {"uvloop": uvloop.run, "asyncio": asyncio.run}


def _woken(root: Path) -> tuple[Broker, list[float]]:
    b = Broker(Config(nats_url="nats://127.0.0.1:1", state_dir=root, timing=Timing(),
                      batch_wait_s=0.05))
    woken: list[float] = []
    b.auctioneer.ctx.wake = lambda: woken.append(asyncio.get_running_loop().time())
    return b, woken


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_wake_due_at_once_leaves_the_next_one_working(loop: str, tmp_path: Path) -> None:
    async def go() -> None:
        b, woken = _woken(tmp_path)
        a = b.auctioneer
        a._wake_at(0.0)  # uvloop: a Handle, not a TimerHandle
        await asyncio.sleep(0.01)
        assert len(woken) == 1
        start = asyncio.get_running_loop().time()
        a._wake_at(0.03)
        await asyncio.sleep(0.1)
        assert len(woken) == 2 and woken[1] - start >= 0.029
    LOOPS[loop](go())


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_an_earlier_wake_replaces_a_later_one_and_a_later_one_waits(
        loop: str, tmp_path: Path) -> None:
    async def go() -> None:
        b, woken = _woken(tmp_path)
        a = b.auctioneer
        start = asyncio.get_running_loop().time()
        a._wake_at(0.5)
        a._wake_at(0.02)  # sooner: it runs then, and the later one is not left behind
        a._wake_at(0.3)  # later than the one pending: that one covers it
        await asyncio.sleep(0.7)
        assert len(woken) == 1 and woken[0] - start < 0.25
    LOOPS[loop](go())


def test_a_partial_batch_arms_the_wake_up_of_its_wait(tmp_path: Path) -> None:
    """The pass that finds a batch under its size, younger than the wait, asks for a pass
    when the wait ends: a partial batch after the last round of a stream opens then."""
    async def go() -> None:
        from tests.unit.test_tuning_broker import _broker
        b = _broker(tmp_path, 5, max_auctions=1)
        b.auctioneer.core.batch_wait_s = 0.05
        woken: list[float] = []
        b.auctioneer.ctx.wake = lambda: woken.append(asyncio.get_running_loop().time())
        b.auctioneer.reconcile(b.now())
        assert not b.auctioneer.auctions  # 5 of 24 wait
        await asyncio.sleep(0.02)
        b.auctioneer.reconcile(b.now())  # still waiting: the wake-up stays armed
        await asyncio.sleep(0.1)
        assert len(woken) == 1
        b.auctioneer.reconcile(b.now())
        assert len(b.auctioneer.auctions) == 1
    uvloop.run(go())
