"""The heartbeat stream on a real three-server NATS cluster: kept on three replicas, so
killing the server that leads it leaves the broker reading heartbeats from the survivors
(`broker.heartbeat_stream` rule 1); on a lone server it stays at one replica.

No timing is asserted: the kill is followed by a wait, with a generous timeout, for a
heartbeat of every node that the stream stored after the kill; the server stays down all
along, so an unreplicated stream (lost with its only server) would never deliver one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import nats
import pytest

from gavel.shared import subjects
from gavel.shared.health import Health
from gavel.transport.inbound import Received
from gavel.transport.natscluster import NatsCluster
from gavel.transport.natsserver import NatsServer
from tests.integration.harness import TIMING, Cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


async def test_killing_the_heartbeat_streams_leader_leaves_liveness_reading(
        tmp_path: Path) -> None:
    nats_cluster = NatsCluster(tmp_path / "nats", 3).start()
    cluster = Cluster(nats_cluster.url, tmp_path)
    inspector: nats.NATS | None = None
    try:
        await nats_cluster.wait_jetstream()
        broker = await cluster.start_broker(kv_replicas=3)
        for node in ("node-a", "node-b"):
            await cluster.start_agent(node)
        await cluster.wait_nodes(2, timeout=60)
        heard: list[tuple[str, float]] = []  # (subject, when the broker was handed it)
        deliver = broker.feed._deliver

        def recording(msg: Received) -> None:
            heard.append((msg.subject, time.monotonic()))
            deliver(msg)
        broker.feed._deliver = recording
        inspector = await nats.connect(nats_cluster.urls, max_reconnect_attempts=-1,
                                       reconnect_time_wait=0.2)
        js = inspector.jetstream(timeout=5)
        info = await js.stream_info(subjects.HEARTBEAT_STREAM)
        assert info.config.num_replicas == 3 and info.cluster is not None
        assert len(info.cluster.replicas or []) == 2
        names = [f"{nats_cluster.name}-{k}" for k in (1, 2, 3)]
        victim = names.index(info.cluster.leader)
        healths: set[Health] = set()
        stop = asyncio.Event()

        async def watch() -> None:  # every health the broker judges (it judges none while
            while not stop.is_set():  # deaf), all along
                if not broker.deafness.deaf:
                    healths.update(broker.liveness.health(n, broker.now())
                                   for n in ("node-a", "node-b"))
                await asyncio.sleep(TIMING.heartbeat_s / 4)
        watching = asyncio.create_task(watch())
        killed_at = time.monotonic()
        nats_cluster.servers[victim].kill()

        def after_kill() -> set[str]:
            return {s for s, at in heard if at > killed_at}
        await wait_for(lambda: after_kill() >= {"gavel.hb.node-a", "gavel.hb.node-b"}, 90,
                       what="a heartbeat of every node read after the stream's leader died")
        info = await js.stream_info(subjects.HEARTBEAT_STREAM)
        assert info.config.num_replicas == 3 and info.cluster is not None
        assert info.cluster.leader != names[victim]
        # More polls later, still healthy: the broker never presumed either node silent.
        await asyncio.sleep(3 * TIMING.heartbeat_s)
        stop.set()
        await watching
        assert healths == {Health.HEALTHY}, healths
        assert nats_cluster.servers[victim].proc is None  # it stayed down throughout
    finally:
        if inspector is not None:
            await inspector.close()
        await cluster.close()
        nats_cluster.stop()


async def test_a_lone_server_keeps_the_stream_at_one_replica(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    server = NatsServer(store_dir=tmp_path / "js", log=tmp_path / "nats.log").start()
    cluster = Cluster(server.url, tmp_path)
    inspector: nats.NATS | None = None
    try:
        with caplog.at_level(logging.WARNING, logger="gavel.broker"):
            broker = await cluster.start_broker(kv_replicas=3)
            await cluster.start_agent("node-a")
            await cluster.wait_nodes(1)
        assert broker.feed.jetstream and broker.feed.replicas == 1
        assert any("not clustered" in r.message for r in caplog.records)
        inspector = await nats.connect(server.url)
        info = await inspector.jetstream().stream_info(subjects.HEARTBEAT_STREAM)
        assert info.config.num_replicas == 1
    finally:
        if inspector is not None:
            await inspector.close()
        await cluster.close()
        server.stop()
