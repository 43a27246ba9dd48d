"""A real worker on a real nats-server ignores an award and a cancel of an older leadership
than the newest it has heard of, and still acts on the newest's.

The test plays two brokers by hand on the wire: a leader of epoch 5 and a deposed one of
epoch 3 speaking late.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest

from gavel.shared import subjects
from gavel.shared.messages import Award, Cancel, Spec
from gavel.shared.strategies import make_strategy
from gavel.worker.agent import Agent
from gavel.worker.localstate import load
from gavel.worker.supervisor import OLDER_AWARD, OLDER_CANCEL
from tests.integration.harness import TIMING, wait_for

pytestmark = pytest.mark.integration
NODE = "n1"
SPEC = Spec(name="s", command=[sys.executable, "-c", "import time; time.sleep(60)"])
_enc = msgspec.msgpack.Encoder()


@pytest.fixture
async def worker(nats_url: str, tmp_path: Path) -> AsyncIterator[tuple[Agent, Any]]:
    agent = Agent(nats_url=nats_url, node_id=NODE, strategy=make_strategy("least-loaded"),
                  labels={}, state_dir=tmp_path / NODE, timing=TIMING, cpu=4.0,
                  memory_mb=4096)
    task = asyncio.create_task(agent.run())
    nc = await nats.connect(nats_url)
    try:
        await asyncio.wait_for(agent.ready.wait(), 20)
        yield agent, nc
    finally:
        await nc.close()
        await agent.stop()
        await asyncio.wait_for(task, 20)


async def say(nc: Any, subject: str, msg: msgspec.Struct) -> None:
    await nc.publish(subject, _enc.encode(msg))
    await nc.flush()


async def test_a_worker_ignores_an_award_and_a_cancel_of_an_older_epoch(
        worker: tuple[Agent, Any], tmp_path: Path) -> None:
    agent, nc = worker
    award, cancel = subjects.AWARD.format(node=NODE), subjects.CANCEL.format(node=NODE)
    await say(nc, award, Award(auction_id="a", instance_id="new", node_id=NODE, spec=SPEC,
                               epoch=5))
    await wait_for(lambda: "new" in agent._supervisor.held(), 20, what="the leader's award run")
    await say(nc, award, Award(auction_id="b", instance_id="old", node_id=NODE, spec=SPEC,
                               epoch=3))
    await say(nc, cancel, Cancel(instance_id="new", node_id=NODE, epoch=3))
    await wait_for(lambda: agent.ignored[OLDER_AWARD] == 1 and agent.ignored[OLDER_CANCEL] == 1,
                   20, what="the deposed leader's award and cancel ignored")
    assert set(agent._supervisor.held()) == {"new"}  # nothing started, nothing stopped
    saved = load(tmp_path / NODE / "agent.json")
    assert saved is not None and saved.epoch == 5  # the newest, kept across restarts
    await say(nc, cancel, Cancel(instance_id="new", node_id=NODE, epoch=5))
    await wait_for(lambda: not agent._supervisor.held(), 30, what="the leader's cancel obeyed")
