"""Stopping never hangs: a wake that lands in the same loop turn as the stop.

On Python 3.11 `asyncio.wait_for` returns the inner result when the outer task is cancelled
just as the inner one finished, swallowing the cancel; a loop built on it then runs for ever
and whoever awaits it (`Broker.close`, `Agent.stop`) hangs. The loops use `asyncio.timeout`
instead; these tests set the wake event and stop in one turn. With `wait_for` the agent's
heartbeat loop survived its cancel every time (its stop never returned); the broker's
reconcile loop has the same shape, and its test also checks that close lets the git writer
go.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from gavel.broker.service import Broker, Config
from gavel.shared.strategies import make_strategy
from gavel.worker.agent import Agent
from tests.integration.harness import TIMING

pytestmark = pytest.mark.integration


async def test_broker_close_right_after_a_wake(nats_url: str, tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    broker = Broker(Config(nats_url=nats_url, state_dir=tmp_path / "state", timing=TIMING,
                           writer="thread"))
    await broker.start()
    await asyncio.sleep(0.2)  # the reconcile loop is parked on its wake event
    loops = list(broker.tasks.running)
    with caplog.at_level(logging.ERROR, logger="gavel.broker"):
        broker.wake()
        await asyncio.wait_for(broker.close(), 30)
    assert all(t.done() for t in loops)
    assert "did not stop" not in caplog.text
    assert broker.committer.closed


async def test_agent_stop_right_after_a_wake(nats_url: str, tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    agent = Agent(nats_url=nats_url, node_id="n1", strategy=make_strategy("least-loaded"),
                  labels={}, state_dir=tmp_path / "worker", timing=TIMING, cpu=1.0, memory_mb=512)
    task = asyncio.create_task(agent.run())
    await asyncio.wait_for(agent.ready.wait(), 10)
    await asyncio.sleep(0.2)
    with caplog.at_level(logging.ERROR, logger="gavel.worker"):
        agent.set_draining(True)  # sets the heartbeat loop's wake event
        agent.converger.wake()
        await asyncio.wait_for(agent.stop(), 30)
        await asyncio.wait_for(task, 30)
    assert "did not stop" not in caplog.text
