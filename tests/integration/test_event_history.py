"""The event history (`transport.eventstream`, `broker.events` rule 2) against a real
nats-server and broker: it survives a broker restart and a nats-server restart, and a
follower resumes across a nats-server restart with no gap and no duplicate."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import nats
import pytest

from gavel.broker.service import Broker, Config
from gavel.cli.ui.feed import CALL_S, Feed
from gavel.client import Client
from gavel.shared import subjects
from gavel.shared.api import EventsReply, EventsRequest
from gavel.shared.messages import EventType
from gavel.transport import eventstream
from gavel.transport import identity as auth
from gavel.transport.natscluster import NatsCluster
from gavel.transport.natsserver import NatsServer
from tests.integration.authed import Authed
from tests.integration.harness import TIMING, Cluster, gavel_process, wait_for


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
    _emit(cluster, "i-late", 1)  # as it stops: stored before it goes
    await cluster.stop_broker()
    await cluster.start_broker()
    assert await _listed(cluster, "i-old") == ["step 0", "step 1", "step 2"]
    assert await _listed(cluster, "i-late") == ["step 0"]
    proc = await asyncio.to_thread(  # what an operator types
        subprocess.run, [sys.executable, "-m", "gavel", "events", "i-old", "--since", "1h",
                         "--nats", cluster.url], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert [line.split()[-1] for line in proc.stdout.splitlines()] == ["0", "1", "2"]
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
    _emit(cluster, "i-before", 1)  # before the follower starts: not followed
    await wait_for(lambda: _stored_at_least(reader, 1), what="the first event stored")
    feed = await eventstream.follow(reader, "i-f").start()

    async def read() -> None:
        async for stored in feed:
            assert stored.event.instance_id == "i-f"
            got.append(stored.event.detail)

    task = asyncio.create_task(read())
    try:
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


async def test_operators_read_the_history_and_only_the_broker_writes_it(authed: Authed
                                                                         ) -> None:
    broker = Broker(Config(nats_url=authed.url, state_dir=authed.root / "state", timing=TIMING,
                           nats_options={"nkeys_seed": authed.seed(auth.BROKER)}))
    await broker.start()
    try:
        broker.events.emit("i-p", EventType.SCHEDULED, detail="by the broker")
        op = await authed.connect(auth.OPERATOR)
        await wait_for(lambda: _stored_at_least(op, 1), what="the operator reading it")
        got = await eventstream.next_after(op, 0, subjects.EVENTS.format(instance="i-p"))
        assert got is not None and got.event.detail == "by the broker"
        # An operator may not write, purge or delete it; a node may not even read it.
        for subject in (subjects.EVENTS.format(instance="i-p"),
                        f"$JS.API.STREAM.PURGE.{subjects.EVENTS_STREAM}",
                        f"$JS.API.STREAM.DELETE.{subjects.EVENTS_STREAM}",
                        f"$JS.API.STREAM.MSG.DELETE.{subjects.EVENTS_STREAM}"):
            await op.publish(subject, b"{}")
        node = await authed.connect("a")
        for subject in (subjects.EVENTS.format(instance="i-p"), subjects.EVENTS_GET,
                        subjects.EVENTS_INFO):
            await node.publish(subject, b"{}")
        await op.flush()
        await node.flush()
        await wait_for(lambda: all(authed.refused(auth.OPERATOR, "publish", s) for s in (
            subjects.EVENTS.format(instance="i-p"),
            f"$JS.API.STREAM.PURGE.{subjects.EVENTS_STREAM}")), what="the operator refused")
        await wait_for(lambda: all(authed.refused("a", "publish", s) for s in (
            subjects.EVENTS.format(instance="i-p"), subjects.EVENTS_GET)),
            what="the node refused")
        assert await eventstream.last_seq(op) == 1  # nothing else landed, nothing went
        # The broker's own calls for it are all in its permissions: the refusals the
        # server logged are the seven provoked above.
        await wait_for(lambda: len(authed.violations()) >= 7, what="the refusals logged")
        assert len(authed.violations()) == 7, authed.violations()
    finally:
        await broker.close()


async def test_the_history_is_bounded_and_kept_as_the_kv_is(cluster: Cluster) -> None:
    """Bounded by age and size; a lone server refuses the cluster's three replicas, so it
    keeps the history alone (a cluster keeps it on `kv_replicas`)."""
    await cluster.start_broker(kv_replicas=3)
    nc = await cluster.client()
    info = await nc.jetstream().stream_info(subjects.EVENTS_STREAM)
    assert info.config.max_age == eventstream.MAX_AGE_S
    assert info.config.max_bytes == eventstream.MAX_BYTES
    assert info.config.num_replicas == 1
    assert info.config.subjects == [subjects.EVENTS_ALL]


@pytest.mark.timeout(180)
async def test_on_a_cluster_the_history_outlives_its_leaders_server(tmp_path: Path) -> None:
    """Kept on three replicas: the server that led the stream killed, a new broker still
    lists every event."""
    servers = NatsCluster(tmp_path / "nats", 3).start()
    cluster = Cluster(servers.url, tmp_path)
    try:
        await servers.wait_jetstream()
        await cluster.start_broker(kv_replicas=3)
        _emit(cluster, "i-r3", 3)
        inspector = await nats.connect(servers.urls, max_reconnect_attempts=-1,
                                       reconnect_time_wait=0.2)
        cluster.nc = inspector
        await wait_for(lambda: _stored_at_least(inspector, 3), 30, what="three stored")
        info = await inspector.jetstream(timeout=5).stream_info(subjects.EVENTS_STREAM)
        assert info.config.num_replicas == 3 and info.cluster is not None
        await cluster.stop_broker()
        names = [f"{servers.name}-{k}" for k in (1, 2, 3)]
        victim = info.cluster.leader
        servers.servers[names.index(victim)].kill()
        await wait_for(lambda: _led_by_another(inspector, victim), 60,
                       what="a survivor leading the stream")
        await cluster.start_broker(kv_replicas=3)
        await wait_for(lambda: _listed_is(cluster, "i-r3", 3), 60,
                       what="the history listed from the survivors")
    finally:
        await cluster.close()
        servers.stop()


async def _led_by_another(nc: Any, victim: str | None) -> bool:
    try:
        info = await nc.jetstream(timeout=2).stream_info(subjects.EVENTS_STREAM)
    except Exception:  # no leader yet
        return False
    return info.cluster is not None and info.cluster.leader not in (None, victim)


async def test_gavel_events_follow_goes_on_after_a_nats_server_restart(
        cluster: Cluster, nats_server: NatsServer) -> None:
    """The command an operator leaves open: the listing, then every event once, in order,
    across a restart of the server it is connected to."""
    await cluster.start_broker()
    _emit(cluster, "i-c", 1)
    log = cluster.root / "follow.log"
    proc = gavel_process(["events", "i-c", "--follow", "--json", "--nats", cluster.url], log)

    def shown() -> list[str]:
        return [json.loads(line)["detail"] for line in log.read_text().splitlines()
                if line.startswith("{")]
    try:
        await wait_for(lambda: log.exists() and len(shown()) == 1, 60, what="the listing")
        _emit(cluster, "i-c", 2, start=1)
        await wait_for(lambda: len(shown()) >= 3, 30, what="two followed")
        nats_server.stop()
        nats_server.start()
        broker = cluster.broker
        assert broker is not None
        await wait_for(lambda: broker.nc.is_connected, 30, what="the broker back on NATS")
        _emit(cluster, "i-c", 2, start=3)
        await wait_for(lambda: len(shown()) >= 5, 30, what=f"two more followed {proc.poll()}")
        assert shown() == [f"step {i}" for i in range(5)]
        assert proc.poll() is None  # still following
    finally:
        proc.terminate()
        proc.wait(10)


async def test_the_dashboard_shows_history_on_load_and_misses_nothing_across_a_restart(
        cluster: Cluster, nats_server: NatsServer) -> None:
    await cluster.start_broker()
    _emit(cluster, "i-ui", 1)
    await wait_for(lambda: _listed_is(cluster, "i-ui", 1), what="the first event kept")
    await cluster.stop_broker()
    await cluster.start_broker()  # what the dashboard loads is the history
    nc = await nats.connect(nats_server.url, max_reconnect_attempts=-1,
                            reconnect_time_wait=5.0)
    feed = Feed(Client(nc, timeout=CALL_S))
    await feed.start()

    def shown() -> list[str]:
        return [json.loads(e)["detail"] for e in feed.events
                if json.loads(e)["instance_id"] == "i-ui"]
    try:
        assert shown() == ["step 0"]
        _emit(cluster, "i-ui", 1, start=1)
        await wait_for(lambda: len(shown()) >= 2, 30, what="an event followed")
        nats_server.stop()
        await wait_for(lambda: not nc.is_connected, what="the dashboard to lose NATS")
        nats_server.start()
        broker = cluster.broker
        assert broker is not None
        await wait_for(lambda: broker.nc.is_connected, 20, what="the broker back on NATS")
        assert not nc.is_connected  # published while the dashboard was away
        _emit(cluster, "i-ui", 2, start=2)
        await wait_for(lambda: len(shown()) >= 4, 30, what="every event shown")
        assert shown() == [f"step {i}" for i in range(4)]
    finally:
        await feed.close()
        await nc.close()
