"""The event history (`transport.eventstream`, `broker.events` rule 2) against a real
nats-server and broker: it survives a broker restart and a nats-server restart, and a
follower resumes across a nats-server restart with no gap and no duplicate."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import nats

from gavel.shared.api import EventsReply, EventsRequest
from gavel.shared.messages import EventType
from gavel.transport import eventstream
from gavel.transport.natsserver import NatsServer
from tests.integration.harness import Cluster, wait_for


def _emit(cluster: Cluster, iid: str, n: int, start: int = 0) -> None:
    assert cluster.broker is not None
    for i in range(start, start + n):
        cluster.broker.events.emit(iid, EventType.SCHEDULED, detail=f"step {i}")


async def _listed(cluster: Cluster, iid: str) -> list[str]:
    reply = await cluster.call("events", EventsRequest(instance_id=iid, limit=0), EventsReply)
    return [e.detail for e in reply.events]


async def _stored(nc: Any) -> int:
    with contextlib.suppress(eventstream.NoHistory):
        return await eventstream.last_seq(nc)
    return -1


async def test_history_survives_a_broker_restart(cluster: Cluster) -> None:
    await cluster.start_broker()
    _emit(cluster, "i-old", 3)
    nc = await cluster.client()
    await wait_for(lambda: _stored(nc), what="the events to be stored")
    await wait_for(lambda: _stored_at_least(nc, 3), what="three events stored")
    await cluster.stop_broker()
    await cluster.start_broker()
    assert await _listed(cluster, "i-old") == ["step 0", "step 1", "step 2"]
    _emit(cluster, "i-old", 1, start=3)  # what the new broker records follows the history
    await wait_for(lambda: _listed_is(cluster, "i-old", 4), what="the fourth event listed")


async def _stored_at_least(nc: Any, n: int) -> bool:
    return await _stored(nc) >= n


async def _listed_is(cluster: Cluster, iid: str, n: int) -> bool:
    return await _listed(cluster, iid) == [f"step {i}" for i in range(n)]


async def test_history_survives_a_nats_server_restart(cluster: Cluster,
                                                      nats_server: NatsServer) -> None:
    await cluster.start_broker()
    _emit(cluster, "i-kept", 2)
    nc = await cluster.client()
    await wait_for(lambda: _stored_at_least(nc, 2), what="two events stored")
    await cluster.stop_broker()
    nats_server.restart()
    await cluster.start_broker()
    assert await _listed(cluster, "i-kept") == ["step 0", "step 1"]


async def test_follow_resumes_across_a_nats_server_restart(cluster: Cluster,
                                                           nats_server: NatsServer) -> None:
    """Events published while the follower's server was away (the broker reconnected first
    and went on) are all delivered, in order, each once."""
    await cluster.start_broker()
    # The reader comes back slowly: what is published meanwhile it never heard live.
    reader = await nats.connect(nats_server.url, max_reconnect_attempts=-1,
                                reconnect_time_wait=5.0)
    got: list[str] = []
    feed = eventstream.follow(reader, "i-f")

    async def read() -> None:
        async for stored in feed:
            got.append(stored.event.detail)

    _emit(cluster, "i-before", 1)  # another instance's event: not this follower's
    task = asyncio.create_task(read())
    try:
        await asyncio.sleep(0)  # the follower takes its place before the first event
        await wait_for(lambda: _stored_at_least(reader, 1), what="the follower's start")
        _emit(cluster, "i-f", 3)
        await wait_for(lambda: len(got) >= 3, what="the first three followed")
        nats_server.stop()
        await wait_for(lambda: not reader.is_connected, what="the reader to lose NATS")
        nats_server.start()
        broker = cluster.broker
        assert broker is not None
        await wait_for(lambda: broker.nc.is_connected, 20, what="the broker back on NATS")
        assert not reader.is_connected
        _emit(cluster, "i-f", 4, start=3)
        await wait_for(lambda: len(got) >= 7, 30, what="every event followed")
        _emit(cluster, "i-f", 1, start=7)  # and it goes on hearing new ones
        await wait_for(lambda: len(got) >= 8, 20, what="the next event followed")
        assert got == [f"step {i}" for i in range(8)]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await reader.close()
