"""A worker told to stop while it is still trying to reach NATS stops (`worker.agent`,
through `transport.tasks.opened_until`): nats-py swallows a cancel that lands while it sets
up its first attempt and would retry for ever. Nothing listens on the loopback port it is
pointed at."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gavel.shared.strategies import make_strategy
from gavel.shared.timing import Timing
from gavel.worker.agent import Agent


@pytest.mark.parametrize("after_s", [0.0, 0.001, 0.05, 0.6])
async def test_a_worker_stopped_before_it_reached_nats_stops(tmp_path: Path,
                                                            after_s: float) -> None:
    agent = Agent(nats_url="nats://127.0.0.1:1", node_id="n1",
                  strategy=make_strategy("least-loaded"), labels={}, state_dir=tmp_path,
                  timing=Timing(), cpu=1.0, memory_mb=512)
    running = asyncio.create_task(agent.run())
    await asyncio.sleep(after_s)
    await asyncio.wait_for(agent.stop(), 60)  # a liveness bound: without the fix, never
    await asyncio.wait_for(running, 60)
    assert not agent.ready.is_set()
