"""The heartbeat stream against a real nats-server: it works with exactly the subjects
`identity.heartbeat_stream_permissions` names (and nodes publishing with their own
permissions, nothing more); without JetStream the broker hears heartbeats directly and
says so once; and a feed that stops returning the broker's own probe makes the broker deaf
- it judges no one while it cannot hear, and owes the nodes the time afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest

from gavel.broker.heartbeat_stream import PROBE, HeartbeatStream
from gavel.shared import subjects
from gavel.shared.health import Health
from gavel.shared.messages import Heartbeat
from gavel.shared.reasons import Reason
from gavel.shared.timing import Timing
from gavel.transport import identity as auth
from gavel.transport import wire
from gavel.transport.natsserver import NatsServer
from tests.integration.harness import TIMING, Cluster, FakeNode, sleeper_spec, wait_for

pytestmark = pytest.mark.integration
_enc = msgspec.msgpack.Encoder()


async def test_the_stream_needs_only_its_own_subjects(tmp_path: Path) -> None:
    """Two feeds in turn on a credential allowed only `heartbeat_stream_permissions`, a
    node on its own: the second reads the first's past, purges the first's probe (gone for
    longer than offline_s) and hears the node; the server refused nothing."""
    ids = auth.init(tmp_path, ["a", "inspector"])
    conf = tmp_path / "narrow.conf"
    conf.write_text(auth.render_config([
        ("the heartbeat stream only", auth.public_key(ids.broker.read_text().strip()),
         auth.heartbeat_stream_permissions()),
        ("node a", auth.public_key(ids.nodes["a"].read_text().strip()),
         auth.worker_permissions("a")),
        ("the test", auth.public_key(ids.nodes["inspector"].read_text().strip()),
         {"publish": {"allow": [">"]}, "subscribe": {"allow": [">"]}})]))
    log = tmp_path / "nats.log"
    server = NatsServer(store_dir=tmp_path / "js", config=conf, log=log).start()
    node = await nats.connect(server.url, nkeys_seed=str(ids.nodes["a"]),
                              inbox_prefix=subjects.NODE_INBOX.format(node="a"))
    inspector = await nats.connect(server.url, nkeys_seed=str(ids.nodes["inspector"]))
    quick = Timing(heartbeat_s=0.1, unreachable_s=0.2, offline_s=0.5, tick_s=0.1)
    hb = _enc.encode(Heartbeat(node_id="a"))
    probes: list[str] = []
    try:
        for generation in range(2):
            heard: list[str] = []
            nc = wire.Client()
            await nc.connect(server.url, nkeys_seed=str(ids.broker),
                             inbox_prefix=subjects.BROKER_INBOX)
            feed = HeartbeatStream(timing=quick, deliver=lambda m, h=heard: h.append(m.subject),
                                   deaf=lambda _at: None, hearing=lambda: None,
                                   now=time.monotonic, log=logging.getLogger("test"))
            stamps = await feed.start(nc)
            assert feed.jetstream
            if generation:  # what the first feed and node a left in the stream
                assert set(stamps) == {"a", PROBE}
                assert stamps["a"] - stamps[PROBE] > quick.offline_s
                info = await inspector.jetstream().stream_info(
                    subjects.HEARTBEAT_STREAM, subjects_filter=subjects.HEARTBEAT_PROBE_ALL)
                assert probes[0] not in (info.state.subjects or {}), "the old probe purged"
            probes.append(feed._probe_subject)
            task = asyncio.create_task(feed.run())
            await node.publish(subjects.HEARTBEAT.format(node="a"), hb)
            await wait_for(lambda h=heard: h == ["gavel.hb.a"], 10,  # type: ignore[misc]
                           what="a's heartbeat through the stream")
            await wait_for(lambda f=feed: f._back >= 3, 10,  # type: ignore[misc]
                           what="the probe back")
            task.cancel()
            await feed.close()
            await nc.close()
            await asyncio.sleep(quick.offline_s + 0.1)
            await node.publish(subjects.HEARTBEAT.format(node="a"), hb)  # fresher than any
        assert "Violation" not in log.read_text()
    finally:
        await node.close()
        await inspector.close()
        server.stop()


async def test_without_jetstream_heartbeats_are_heard_directly(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    server = NatsServer(jetstream=False, log=tmp_path / "nats.log").start()
    cluster = Cluster(server.url, tmp_path)
    try:
        with caplog.at_level(logging.WARNING, logger="gavel.broker"):
            broker = await cluster.start_broker()
            await cluster.start_agent("node-a")
            await cluster.wait_nodes(1)
            await asyncio.sleep(3 * broker.feed.poll_s)
        assert not broker.feed.jetstream and not broker.deafness.deaf
        warned = [r for r in caplog.records if "no JetStream heartbeat stream" in r.message]
        assert len(warned) == 1
    finally:
        await cluster.close()
        server.stop()


async def test_a_feed_that_loses_its_probe_judges_no_one(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    """The broker's consumer is paused for longer than offline_s: no heartbeat reaches the
    broker, nor does its probe. The node is alive all along; it must not be declared
    offline, and once the feed is back its silence is forgiven."""
    broker = await cluster.start_broker()
    node = await FakeNode(cluster.url, "node-z").start()
    node.confirm = True
    try:
        await cluster.wait_nodes(1)
        iid = await cluster.submit(sleeper_spec("kept"))
        await wait_for(lambda: cluster.holders(iid) == ["node-z"], 10, what="placed")
        head = cluster.ledger().head()
        js: Any = broker.nc.jetstream()
        pause = TIMING.offline_s + 2 * TIMING.heartbeat_s
        until = (datetime.now(UTC) + timedelta(seconds=pause)).isoformat().replace("+00:00",
                                                                                    "Z")
        with caplog.at_level(logging.INFO, logger="gavel.broker"):
            await js.pause_consumer(subjects.HEARTBEAT_STREAM, broker.feed._consumer, until)
            await asyncio.sleep(pause)
            await wait_for(lambda: not broker.deafness.deaf, 10, what="the feed back")
        await wait_for(lambda: broker.liveness.health("node-z", broker.now())
                       is Health.HEALTHY, 10, what="node-z heard again")
        await asyncio.sleep(2 * TIMING.tick_s)
        assert cluster.holders(iid) == ["node-z"]
        since = []
        for commit in cluster.ledger().history():
            if str(commit.id) == head:
                break
            since.append(commit.message)
        assert not [m for m in since if Reason.NO_LEASE.value in m], \
            "a live node was declared offline while the broker could not hear it"
        assert [r for r in caplog.records if "lost its own probe" in r.message]
    finally:
        await node.close()


async def last_heard(broker: Any, silent: str, live: str) -> Any:
    """The silent node's last heartbeat as the broker holds it, once three of the live
    node's have come after it (a condition, not a pause: on a loaded machine the last one
    may still be on its way long after it was sent)."""
    held, after = broker.liveness.heartbeats[silent], 0
    seen = broker.liveness.heartbeats[live]
    while after < 3:
        await asyncio.sleep(TIMING.heartbeat_s / 4)
        if broker.liveness.heartbeats[silent] is not held:
            held, after = broker.liveness.heartbeats[silent], 0
        if broker.liveness.heartbeats[live] is not seen:
            seen, after = broker.liveness.heartbeats[live], after + 1
    return held


async def test_a_lost_consumer_or_stream_is_made_again_from_what_is_new(
        cluster: Cluster) -> None:
    """The broker's consumer deleted, then the whole stream: the broker hears the live node
    again each time, and never takes the silent node's last stored heartbeat for news."""
    broker = await cluster.start_broker()
    live = await FakeNode(cluster.url, "node-live").start()
    silent = await FakeNode(cluster.url, "node-silent").start()
    try:
        await cluster.wait_nodes(2)
        silent.heartbeating = False
        last = await asyncio.wait_for(last_heard(broker, "node-silent", "node-live"), 60)
        js: Any = broker.nc.jetstream()
        for lose in ("consumer", "stream"):
            before = broker.now()
            if lose == "consumer":
                await js.delete_consumer(subjects.HEARTBEAT_STREAM, broker.feed._consumer)
            else:
                await js.delete_stream(subjects.HEARTBEAT_STREAM)
            await wait_for(lambda b=before: broker.liveness.last_seen["node-live"] > b,  # type: ignore[misc]
                           10, what=f"the live node heard again after losing the {lose}")
            # The same heartbeat, never its stored copy taken again as news. (Not its
            # time: a loaded machine's late probe makes the broker deaf for a moment, and
            # that moment is rightly given back to every node.)
            assert broker.liveness.heartbeats["node-silent"] is last
        assert (await js.stream_info(subjects.HEARTBEAT_STREAM)).config.max_msgs_per_subject == 1
    finally:
        await live.close()
        await silent.close()


async def test_a_broker_running_through_a_nats_restart_hears_the_nodes_again(
        nats_server: NatsServer, tmp_path: Path) -> None:
    """The restarted server has forgotten the stream (memory): the broker makes it again
    and hears its node through it; the outage is the broker's own and costs no one."""
    cluster = Cluster(nats_server.url, tmp_path)
    try:
        broker = await cluster.start_broker()
        await cluster.start_agent("node-a")
        await cluster.wait_nodes(1)
        iid = await cluster.submit(sleeper_spec("through"))
        await wait_for(lambda: cluster.holders(iid) == ["node-a"], 10, what="placed")
        await asyncio.to_thread(nats_server.stop)
        await asyncio.sleep(TIMING.unreachable_s)
        await asyncio.to_thread(nats_server.start)
        back = broker.now()
        await wait_for(lambda: broker.liveness.last_seen["node-a"] > back, 30,
                       what="node-a heard through the stream made again")
        assert broker.feed.jetstream and not broker.deafness.deaf
        assert broker.disconnects == {"nodes": 1, "api": 1}  # each lost once, each back
        assert cluster.holders(iid) == ["node-a"]
        status = await cluster.status(iid)  # the API connection is back too
        assert status.node_id == "node-a"
    finally:
        await cluster.close()
