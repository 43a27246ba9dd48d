"""compose/compose.yaml and compose/compose.ha.yaml brought up for real on the gavel image
(compose/build-image), as compose/README.md says: set up with compose/setup (`gavel auth
init`'s nkeys), `docker-compose up`, every container healthy, then driven from this host
through the published NATS port with the operator's seed, as an operator would.

Marked `compose` (`make compose-test` builds the image and runs them); each skips with a
sentence where docker-compose, an engine or the image is missing (tests/integration/composerig.py).
"""

from __future__ import annotations

import json
import tomllib
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gavel.shared.api import (
    InstanceStatus,
    NodesReply,
    NodesRequest,
    StatusReply,
    StatusRequest,
    SubmitReply,
    SubmitRequest,
)
from gavel.shared.messages import Message, Spec
from gavel.shared.spec import Route
from gavel.transport.client import ClientError, call, connect
from tests.integration.composerig import ROOT, Project, project
from tests.integration.harness import wait_for
from tests.integration.test_logs import gavel

pytestmark = [pytest.mark.integration, pytest.mark.compose]

T = TypeVar("T", bound=Message)
#: Every wait below is for a condition; these are only how long before it is called a failure
#: (containers start, workers heartbeat every 10 s, a broker's lease expires unrenewed).
UP_S = 150.0
PLACE_S = 90.0

#: An instance that answers every GET with its instance id and the host name of the container
#: it runs in, on every interface (the caddy container dials the worker by its service name).
ANSWER = (
    "import http.server as h, os, socket\n"
    "class H(h.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        b = (os.environ['GAVEL_INSTANCE_ID'] + ' ' + socket.gethostname()).encode()\n"
    "        self.send_response(200)\n"
    "        self.send_header('Content-Length', str(len(b)))\n"
    "        self.end_headers()\n"
    "        self.wfile.write(b)\n"
    "    def log_message(self, *args):\n"
    "        pass\n"
    "h.ThreadingHTTPServer(('0.0.0.0', int(os.environ['PORT'])), H).serve_forever()\n")


def answering_spec(name: str) -> Spec:
    return Spec(name=name, command=["python3", "-c", ANSWER], ports=["http"],
                routes=[Route(path=f"/{name}", port="http")], cpu=0.1, memory_mb=64)


def documented_spec() -> str:
    """The web.toml of docs/deploy.md's compose section, as written there."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    section = text[text.index("## Docker compose"):]
    start = section.index("```toml\n") + len("```toml\n")
    return section[start:section.index("```", start)]


def sleeping_spec(name: str) -> Spec:
    return Spec(name=name, command=["python3", "-c", "import time; time.sleep(3600)"],
                cpu=0.1, memory_mb=32)


@pytest.fixture
def single(tmp_path: Path) -> Iterator[Project]:
    yield from project("compose.yaml", tmp_path)


@pytest.fixture
def ha(tmp_path: Path) -> Iterator[Project]:
    yield from project("compose.ha.yaml", tmp_path)


class Operator:
    """The operator's API client on this host, through the published NATS port(s)."""

    def __init__(self, nc: Any) -> None:
        self.nc = nc

    async def ask(self, verb: str, request: Message, reply: type[T]) -> T | None:
        """The broker's answer, or None while none answers (a broker restarting, no leader)."""
        try:
            return await call(self.nc, verb, request, reply, timeout=5)
        except ClientError:
            return None

    async def submit(self, spec: Spec) -> str:
        """Submitted once, whatever the retries (an idempotency key)."""
        request = SubmitRequest(spec=spec, key=str(uuid.uuid4()))
        got: list[SubmitReply] = []

        async def landed() -> bool:
            reply = await self.ask("submit", request, SubmitReply)
            if reply is not None:
                got.append(reply)
            return bool(got)
        await wait_for(landed, PLACE_S, every=1.0, what=f"the broker to take {spec.name}")
        return got[0].instance_id

    async def status(self) -> StatusReply | None:
        return await self.ask("status", StatusRequest(), StatusReply)

    async def running(self, iid: str) -> InstanceStatus:
        """The instance once it runs (and is healthy where it has a route)."""
        seen: list[InstanceStatus] = []

        async def runs() -> bool:
            reply = await self.status()
            for s in reply.instances if reply else []:
                if s.instance_id == iid and s.state == "running" and s.health != "checking":
                    seen.append(s)
            return bool(seen)
        await wait_for(runs, PLACE_S, every=1.0, what=f"{iid} to run")
        return seen[-1]

    async def healthy_nodes(self, n: int) -> None:
        async def enough() -> bool:
            reply = await self.ask("nodes", NodesRequest(), NodesReply)
            return reply is not None and sum(x.health == "healthy" for x in reply.nodes) >= n
        await wait_for(enough, UP_S, every=1.0, what=f"{n} healthy nodes")


@asynccontextmanager
async def operator(p: Project, *ports: int) -> AsyncIterator[Operator]:
    url = ",".join(f"nats://127.0.0.1:{port}" for port in ports)
    nc = await connect(url, str(p.dir / "auth" / "operator.nk"), allow_reconnect=True,
                       max_reconnect_attempts=-1, reconnect_time_wait=0.5)
    try:
        yield Operator(nc)
    finally:
        await nc.close()


async def healthy(p: Project) -> None:
    """Every service's container running and healthy (its image's or its file's check)."""
    await wait_for(lambda: not p.unhealthy(), UP_S, every=2.0,
                   what="every container to be healthy")


def loopback_only(p: Project) -> bool:
    """Every port the project publishes listens on 127.0.0.1 alone (and some do)."""
    hosts = [b["HostIp"] for service in p.all_services
             for bindings in (p.inspect(service)["HostConfig"]["PortBindings"] or {}).values()
             for b in bindings or ()]
    assert hosts, "nothing published"
    return set(hosts) == {"127.0.0.1"}


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


async def through_gateway(p: Project, path: str, want: str) -> None:
    url = f"http://127.0.0.1:{p.ports['HTTP']}{path}"
    await wait_for(lambda: get(url) == (200, want), PLACE_S, every=1.0,
                   what=f"{url} to answer {want!r} through the composed Caddy")


def placements(p: Project, git_dir: str, service: str) -> dict[str, list[str]]:
    """Instance id -> the nodes whose node.json on main holds it, read in `service`."""
    names = p.exec(service, "git", f"--git-dir={git_dir}", "ls-tree", "-r", "--name-only",
                   "main", "nodes/").split()
    out: dict[str, list[str]] = {}
    for name in names:
        if not name.endswith("/node.json"):
            continue
        node = json.loads(p.exec(service, "git", f"--git-dir={git_dir}", "show",
                                 f"main:{name}"))
        for iid in node.get("instances", {}):
            out.setdefault(iid, []).append(name.split("/")[1])
    return out


@pytest.mark.timeout(480)
async def test_compose_yaml_places_serves_and_survives_a_broker_restart(
        single: Project) -> None:
    single.up()
    await healthy(single)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for service in single.all_services:  # every role unprivileged, on the labelled image
        config = single.inspect(service)["Config"]
        assert config["User"] == "gavel", service
        assert config["Labels"]["org.opencontainers.image.version"] == version, service
    assert loopback_only(single)
    assert single.exec("worker-1", "id", "-u").strip() == "10001"
    url, creds = f"nats://127.0.0.1:{single.ports['NATS']}", str(single.dir / "auth" /
                                                                 "operator.nk")
    async with operator(single, single.ports["NATS"]) as op:
        await op.healthy_nodes(3)
        # docs/deploy.md's commands, with the gavel CLI on this host
        nodes = await gavel("nodes", "--nats", url, creds=creds)
        assert nodes.returncode == 0, nodes.stderr
        assert all(f"worker-{n}" in nodes.stdout for n in (1, 2, 3)), nodes.stdout
        (single.dir / "web.toml").write_text(documented_spec())
        submitted = await gavel("submit", str(single.dir / "web.toml"), "--wait=running",
                                "--nats", url, creds=creds, timeout=PLACE_S)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        web = submitted.stdout.split()[0]
        await wait_for(lambda: "Directory listing" in get(
            f"http://127.0.0.1:{single.ports['HTTP']}/web")[1], PLACE_S, every=1.0,
            what="the documented spec's route through the composed Caddy")

        iid = await op.submit(answering_spec("answer"))
        where = await op.running(iid)
        assert where.node_id in ("worker-1", "worker-2", "worker-3")
        # It runs in that worker's container: it answers with the container's host name.
        host = single.inspect(where.node_id)["Config"]["Hostname"]
        await through_gateway(single, "/answer", f"{iid} {host}")
        # ... by the address compose/setup's node book gives it, not what the worker says.
        gateway_log = single.compose("logs", "--no-color", "gateway")
        assert "no node book" not in gateway_log, gateway_log[-2000:]

        # A new broker container on the same volume: what it knows is what state.git holds.
        old = single.container("broker")
        single.compose("up", "--detach", "--no-deps", "--force-recreate", "broker")
        assert single.container("broker") not in ("", old)
        after = await op.running(iid)
        assert (after.node_id, after.attempt) == (where.node_id, where.attempt)
        reply = await op.status()
        assert reply is not None and {s.instance_id for s in reply.instances} == {web, iid}
        again = await op.submit(sleeping_spec("after-restart"))
        await op.running(again)
        await through_gateway(single, "/answer", f"{iid} {host}")
        held = placements(single, "/var/lib/gavel/state.git", "broker")
        assert held == {web: [held[web][0]], iid: [where.node_id], again: [held[again][0]]}
    single.down()
    assert single.leftovers() == []


@pytest.mark.timeout(480)
async def test_compose_ha_yaml_fails_over_without_placing_twice(ha: Project) -> None:
    ha.up()
    await healthy(ha)
    assert loopback_only(ha)
    ports = (ha.ports["NATS"], ha.ports["NATS_2"], ha.ports["NATS_3"])
    async with operator(ha, *ports) as op:
        await op.healthy_nodes(3)
        first = await op.submit(sleeping_spec("before"))
        where = await op.running(first)
        before = await op.status()
        assert before is not None and before.leader.startswith("broker-") and before.epoch > 0

        ha.compose("kill", before.leader)
        second = await op.submit(sleeping_spec("after"))
        await op.running(second)
        now = await op.status()
        assert now is not None and now.leader != before.leader
        assert now.epoch > before.epoch
        kept = await op.running(first)
        assert (kept.node_id, kept.attempt) == (where.node_id, where.attempt)

        # The remote every broker pushes to: each instance in exactly one node.json.
        held: dict[str, list[str]] = {}

        def pushed() -> bool:
            held.update(placements(ha, "/var/lib/gavel/state.git", "remote"))
            return {first, second} <= set(held)
        await wait_for(pushed, PLACE_S, every=2.0, what="the new leader's push to the remote")
        assert set(held) == {first, second}
        assert all(len(nodes) == 1 for nodes in held.values()), held
    ha.down()
    assert ha.leftovers() == []
