"""A broker that starts while JetStream cannot answer yet still uses its streams once it can
(`transport.asklater` rule 2): one server of a three-server cluster is up (no quorum:
JetStream's API says "temporarily unavailable"), the broker starts and works, then the
other two come up. Given up on at the start, the heartbeats would be heard directly for
the broker's whole run (`broker.heartbeat_stream` rule 7) and the event history would
never hold what it recorded (`broker.events` rule 4).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import nats
import nats.errors
import nats.js.errors
import pytest

from gavel.broker.service import Broker
from gavel.shared import subjects
from gavel.shared.messages import EventType, Spec
from gavel.transport import eventstream
from gavel.transport.natscluster import NatsCluster
from tests.integration.harness import TIMING, Cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture
async def without_quorum(tmp_path: Path) -> AsyncIterator[tuple[NatsCluster, Cluster]]:
    """One server of three up, and a cluster of gavel's parts on it."""
    nats_cluster = NatsCluster(tmp_path / "nats", 3)
    nats_cluster.start_one(0)
    cluster = Cluster(nats_cluster.servers[0].url, tmp_path)
    try:
        yield nats_cluster, cluster
    finally:
        await cluster.close()
        nats_cluster.stop()


#: The broker's JetStream calls given up on sooner than the default's 5 s
#: (`Timing.call_s`): without quorum its start waits one out (making the heartbeat stream)
#: before it says it carries on; what is checked is that it asks again once JetStream
#: answers, not how long it waited.
UNANSWERED = msgspec.structs.replace(TIMING, call_s=1.5)


async def _started(cluster: Cluster, caplog: pytest.LogCaptureFixture, said: str) -> Broker:
    """The broker started without quorum, saying `said` of it."""
    with caplog.at_level(logging.WARNING, logger="gavel.broker"):
        broker = await cluster.start_broker(timing=UNANSWERED)
    assert any(said in r.message for r in caplog.records), [r.message for r in caplog.records]
    return broker


async def _works(cluster: Cluster) -> None:
    """The broker hears its node and places work on it."""
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1, timeout=60)
    iid = await cluster.submit(Spec(name="s", command=["sleep", "600"], cpu=0.1, memory_mb=8))
    await wait_for(lambda: cluster.holders(iid) == ["node-a"], 60, what="the placement")


async def _healed(nats_cluster: NatsCluster) -> Any:
    """The other two servers up, and a connection to the three."""
    for i in range(1, len(nats_cluster.servers)):
        nats_cluster.start_one(i)
    return await nats.connect(nats_cluster.urls, max_reconnect_attempts=-1,
                              reconnect_time_wait=0.2)


async def test_a_broker_started_before_jetstream_answers_reads_heartbeats_from_the_stream(
        without_quorum: tuple[NatsCluster, Cluster],
        caplog: pytest.LogCaptureFixture) -> None:
    nats_cluster, cluster = without_quorum
    broker = await _started(cluster, caplog, "cannot make the heartbeat stream yet")
    assert not broker.feed.jetstream
    await _works(cluster)  # hearing node-a directly meanwhile
    witness = await _healed(nats_cluster)
    try:
        await wait_for(lambda: broker.feed.jetstream, 90, every=0.5,
                       what="the broker reading the heartbeat stream")
        js = witness.jetstream(timeout=5)
        # The broker's consumer was made before this: what the stream stores after it is
        # the consumer's to deliver.
        seen: list[int] = []

        async def last_seq() -> bool:
            try:
                seen.append((await js.stream_info(subjects.HEARTBEAT_STREAM)).state.last_seq)
            except (nats.js.errors.Error, nats.errors.Error):
                return False
            return True
        await wait_for(last_seq, 30, every=0.5, what="the heartbeat stream's last sequence")
        made_at = seen[0]

        async def read_through_the_stream() -> bool:
            """A heartbeat of node-a's stored after the switch reached the broker's
            consumer."""
            try:
                stored = await js.get_last_msg(subjects.HEARTBEAT_STREAM,
                                               subjects.HEARTBEAT.format(node="node-a"))
                info = await js.consumer_info(subjects.HEARTBEAT_STREAM,
                                              broker.feed._consumer)
            except (nats.js.errors.Error, nats.errors.Error):
                return False
            seq = stored.seq or 0
            return seq > made_at and info.delivered is not None and \
                (info.delivered.stream_seq or 0) >= seq
        await wait_for(read_through_the_stream, 60, every=0.5,
                       what="node-a's heartbeat read from the stream")
        # Heard through the stream alone now: the direct subscriptions are gone (rule 2's
        # reason for the stream: a flood stays between the node and the stream).
        heard = {sub.subject for sub in broker.nc._subs.values()}
        assert subjects.HEARTBEAT_ALL not in heard, heard
        assert "node-a" in broker.liveness.eligible(broker.now())
        assert not broker.deafness.deaf
    finally:
        await witness.close()


async def test_a_broker_started_before_jetstream_answers_stores_its_events_once_it_does(
        without_quorum: tuple[NatsCluster, Cluster],
        caplog: pytest.LogCaptureFixture) -> None:
    nats_cluster, cluster = without_quorum
    broker = await _started(cluster, caplog, "cannot make the event history yet")
    await _works(cluster)
    # A follower started now has no history to read: it yields what it hears.
    live = await eventstream.follow(await cluster.client(), "i-early").start()
    assert live.plain
    heard: list[str] = []

    async def follow() -> None:
        async for got in live:
            heard.append(got.event.detail)
    following = asyncio.create_task(follow())
    for i in range(3):  # recorded before the history can be made
        broker.events.emit("i-early", EventType.SCHEDULED, detail=f"step {i}")
    witness = await _healed(nats_cluster)
    try:
        async def stored() -> list[str]:
            try:
                got = await eventstream.recent(witness, 100)
            except eventstream.NoHistory:
                return []
            return [s.event.detail for s in got if s.event.instance_id == "i-early"]

        async def stored_are(n: int) -> bool:
            return await stored() == [f"step {i}" for i in range(n)]
        await wait_for(lambda: stored_are(3), 90, every=0.5,
                       what="the early events in the history")
        broker.events.emit("i-early", EventType.SCHEDULED, detail="step 3")
        await wait_for(lambda: stored_are(4), 30, every=0.5, what="the fourth, after them")
        # Stored in order after the early three: once the follower heard the fourth, it
        # had been sent those three again too - and took each once, as published.
        await wait_for(lambda: "step 3" in heard, 30, what="the follower hearing the fourth")
        assert heard == [f"step {i}" for i in range(4)]
    finally:
        following.cancel()
        await live.aclose()
        await witness.close()
    await cluster.stop_broker()  # a broker started now loads them from the history
    await cluster.start_broker()
    proc = await asyncio.to_thread(  # what an operator types
        subprocess.run, [sys.executable, "-m", "gavel", "events", "i-early", "--since", "1h",
                         "--nats", cluster.url], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert [line.split()[-1] for line in proc.stdout.splitlines()] == ["0", "1", "2", "3"]

