"""On a NATS cluster a fresh client's first request is answered (`broker.api` rule 7).

The client's reply subscription and its request leave on one connection; its server tells
each other server of the new interest on a route of its own, while the request travels on
the route to the server of the broker's API connection. Answered on that same connection,
the answer follows the interest along the route that carried the request. Answered on the
broker's node connection, on another server, it raced the interest to that server and was
dropped there as wanted by no one: the client waited out its timeout ("the broker did not
answer status within 10s", on `gavel up --ha`). Here the routes of two of the three servers
to each other are slowed down, so the race that a loaded machine loses now and then is lost
every time.

A client that asks before the broker's API interest has reached its server (the broker is
still starting, or one is taking over) is told "no responders" at once; `call` asks again
for a while (`transport.client` rule 1), so it is answered once a broker subscribes, and a
cluster with no broker at all is still told so, within that while, not the request's timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import nats
import nats.errors
import pytest

from gavel.broker.service import Broker, Config
from gavel.shared import subjects
from gavel.shared.api import NodesReply, NodesRequest
from gavel.shared.timing import Timing
from gavel.transport import client
from gavel.transport.client import NoBroker, call, connect
from gavel.transport.natscluster import NatsCluster
from tests.integration.harness import TIMING

pytestmark = pytest.mark.integration

#: Fresh clients, each asking once.
CLIENTS = 20
#: How late the slow routes deliver every byte.
DELAY_S = 0.4


class SlowLink:
    """A TCP proxy to `port` on loopback that delivers every byte `DELAY_S` late, in order."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> SlowLink:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        for src, dst in ((reader, up_w), (up_r, writer)):
            task = asyncio.create_task(self._pipe(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                if not data:
                    dst.close()
                    return
                dst.write(data)
                await dst.drain()
        delivering = asyncio.create_task(deliver())
        try:
            while True:
                data = await src.read(65536)
                queue.put_nowait((time.monotonic() + DELAY_S, data))
                if not data:
                    break
            await delivering
        except (OSError, asyncio.CancelledError):
            delivering.cancel()
            dst.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def slow_cluster(root: Path) -> tuple[NatsCluster, list[SlowLink]]:
    """Three servers; server 0 reaches 1 and 2 directly, 1 and 2 reach each other only
    through a `SlowLink` (each advertises its link, so no route between them goes around)."""
    cluster = NatsCluster(root, 3)
    ports = cluster.cluster_ports
    links = [await SlowLink(ports[1]).start(), await SlowLink(ports[2]).start()]
    routes = {0: [ports[1], ports[2]], 1: [ports[0], links[1].port], 2: [ports[0]]}
    for i, server in enumerate(cluster.servers):
        advertise = f'  advertise: "127.0.0.1:{links[i - 1].port}"\n' if i else ""
        listed = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in routes[i])
        assert server.config is not None
        server.config.write_text(
            f'server_name: "slow-{i + 1}"\ncluster {{\n  name: {json.dumps(cluster.name)}\n'
            f'  listen: "127.0.0.1:{ports[i]}"\n{advertise}  routes: [{listed}]\n}}\n')
    cluster.start()
    return cluster, links


async def interest_reached(url: str) -> None:
    """Until the server at `url` has heard of the broker's API subscriptions (a slow route
    away, it says no responders before): a precondition, not what is tested."""
    nc = await nats.connect(url)
    try:
        while True:
            try:
                await nc.request(subjects.API.format(verb="nodes"),
                                 msgspec.msgpack.encode(NodesRequest()),
                                 timeout=5 * DELAY_S + 1)
                return
            except nats.errors.NoRespondersError:
                await asyncio.sleep(0.05)
            except nats.errors.TimeoutError:
                return  # the request was heard; the answer is what the test is about
    finally:
        await nc.close()


@pytest.fixture
async def split_broker(tmp_path: Path) -> AsyncIterator[tuple[NatsCluster, Broker, str]]:
    """A broker whose node connection is on server 1 or 2, and the URL of the other one:
    a client there is a slow route away from the broker's node connection."""
    cluster, links = await slow_cluster(tmp_path / "nats")
    broker = None
    try:
        await cluster.wait_jetstream()
        for _ in range(30):  # each connection picks a server at random
            broker = Broker(Config(nats_url=cluster.url, state_dir=tmp_path / "state",
                                   timing=TIMING, writer="thread"))
            await broker.start()
            port = broker.nc.connected_url.port
            if port in (cluster.servers[1].port, cluster.servers[2].port):
                break
            await broker.close()
            broker = None
        assert broker is not None, "the broker's node connection never left server 0"
        other = cluster.servers[2 if port == cluster.servers[1].port else 1]
        await interest_reached(other.url)
        yield cluster, broker, other.url
    finally:
        if broker is not None:
            await broker.close()
        cluster.stop()
        for link in links:
            await link.close()


async def test_every_fresh_clients_first_request_is_answered(
        split_broker: tuple[NatsCluster, Broker, str]) -> None:
    _, broker, url = split_broker
    lost = []
    for i in range(CLIENTS):
        nc = await connect(url)
        try:
            reply = await call(nc, "nodes", NodesRequest(), NodesReply, timeout=5 * DELAY_S + 3)
            assert reply.nodes == []
        except Exception as exc:  # counted, then reported together
            lost.append(f"request {i}: {exc}")
        finally:
            with contextlib.suppress(Exception):
                await nc.close()
    assert lost == [], (f"answers leave on {broker.api_nc.connected_url.port}, "
                        f"the node connection is on {broker.nc.connected_url.port}, "
                        f"the clients on {url}")


async def asked(nc: object, times: int, task: asyncio.Task[object]) -> None:
    """Until the client on `nc` has sent `times` requests, or `task` has ended."""
    while nc.stats["out_msgs"] < times and not task.done():  # type: ignore[attr-defined]
        await asyncio.sleep(0.01)


async def test_a_request_asked_before_the_broker_subscribes_is_answered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client, "_TIMING", Timing(interest_s=600.0))  # the broker's start decides
    cluster = NatsCluster(tmp_path / "nats", 3)
    cluster.start()
    broker = None
    try:
        await cluster.wait_jetstream()
        nc = await connect(cluster.url)
        try:
            asking = asyncio.create_task(call(nc, "nodes", NodesRequest(), NodesReply,
                                              timeout=600))
            await asked(nc, 2, asking)  # told no responders once, and asking again
            assert not asking.done(), asking.exception()
            broker = Broker(Config(nats_url=cluster.url, state_dir=tmp_path / "state",
                                   timing=TIMING, writer="thread"))
            await broker.start()
            reply = await asyncio.wait_for(asking, 120)
            assert reply.nodes == []
        finally:
            await nc.close()
    finally:
        if broker is not None:
            await broker.close()
        cluster.stop()


async def test_with_no_broker_a_request_fails_within_the_bound_not_its_timeout(
        tmp_path: Path) -> None:
    cluster = NatsCluster(tmp_path / "nats", 3)
    cluster.start()
    try:
        await cluster.wait_jetstream()
        nc = await connect(cluster.url)
        try:
            asking = asyncio.create_task(call(nc, "nodes", NodesRequest(), NodesReply,
                                              timeout=3600))
            with pytest.raises(NoBroker, match=r"^no broker is answering"):
                await asyncio.wait_for(asking, 600)  # a guard against a hang, not a measure
            assert nc.stats["out_msgs"] > 1  # it did ask again before giving up
        finally:
            await nc.close()
        proc = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "gavel", "nodes", "--nats", cluster.url],
            capture_output=True, text=True, timeout=600)
        assert (proc.returncode, len(proc.stderr.splitlines())) == (1, 1), proc.stderr
        assert "no broker is answering" in proc.stderr
    finally:
        cluster.stop()
