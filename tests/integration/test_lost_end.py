"""An end whose event never reached the broker is heard from the node's heartbeats
(`worker.reports` rule 2, `broker.promises` rule 8): a real nats-server, broker, git and
worker, whose link drops the one event that said how an attempt ended - as an event written
while its NATS server goes away is lost."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from gavel.shared.api import EventsReply, EventsRequest
from gavel.shared.messages import Event, EventType, Message, Spec
from gavel.shared.strategies import make_strategy
from gavel.worker.agent import Agent
from tests.integration.harness import TIMING, Cluster, wait_for

pytestmark = pytest.mark.integration


class Lossy(Agent):
    """A worker whose link loses its first end event (its heartbeats go through)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.dropped: list[Event] = []

    async def _send(self, subject: str, message: Message) -> None:
        if isinstance(message, Event) and message.type == EventType.EXITED \
                and not self.dropped:
            self.dropped.append(message)
            return
        await super()._send(subject, message)


async def test_an_end_whose_event_was_lost_is_heard_from_the_heartbeats_once(
        cluster: Cluster) -> None:
    await cluster.start_broker()
    agent = Lossy(nats_url=cluster.url, node_id="n1", strategy=make_strategy("least-loaded"),
                  labels={}, state_dir=cluster.root / "workers" / "n1", timing=TIMING)
    cluster.agents["n1"] = agent  # the cluster stops it as it stops its own
    cluster.agent_tasks["n1"] = asyncio.create_task(agent.run())
    await cluster.wait_nodes(1)
    iid = await cluster.submit(Spec(name="quick", command=[sys.executable, "-c", "pass"]))
    await wait_for(lambda: bool(agent.dropped), 30, what="its exit event dropped")

    async def ended() -> bool:
        return (await cluster.status(iid)).state == "succeeded"

    await wait_for(ended, 60, what="the end heard from a heartbeat")
    got = await cluster.call("events", EventsRequest(instance_id=iid), EventsReply)
    assert [e.type for e in got.events].count(EventType.EXITED) == 1, got.events

