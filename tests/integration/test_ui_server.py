"""The dashboard's server without a browser: a real nats-server, a real broker and workers,
the dashboard as an operator client of them, and plain HTTP on a socket - what it serves,
how it streams, who it lets in. tests/integration/test_ui.py drives the page in Chromium."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest

from gavel.cli.ui import app
from gavel.shared import subjects
from gavel.shared.api import (
    DeployReply,
    DeployRequest,
    EventsReply,
    NodesReply,
    StatusReply,
    SubmitReply,
    SubmitRequest,
)
from gavel.shared.messages import ApiError, Spec
from gavel.shared.reasons import Reason
from gavel.transport import wire
from gavel.transport.natsserver import free_port
from tests.integration.harness import Cluster, gavel_process, sleeper_spec, wait_for

pytestmark = pytest.mark.integration


async def http(port: int, path: str, headers: dict[str, str] | None = None,
               method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """One request to the dashboard on this machine: status, headers (lower-cased), body."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    hdrs = {"Host": f"127.0.0.1:{port}", **(headers or {})}
    w.write((f"{method} {path} HTTP/1.1\r\n"
             + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n").encode())
    data = await asyncio.wait_for(r.read(), 30)
    w.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    out = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        out[k.strip().lower()] = v.strip()
    return status, out, body


async def overview(port: int) -> dict[str, Any]:
    status, _, body = await http(port, "/api/overview")
    assert status == 200
    got: dict[str, Any] = json.loads(body)
    return got


class Events:
    """An open event stream of the dashboard, read frame by frame."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.status = 0

    @classmethod
    async def open(cls, port: int, path: str, headers: dict[str, str] | None = None
                   ) -> Events:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        hdrs = {"Host": f"127.0.0.1:{port}", "Accept": "text/event-stream", **(headers or {})}
        w.write((f"GET {path} HTTP/1.1\r\n"
                 + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n").encode())
        self = cls(r, w)
        head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 30)
        self.status = int(head.split(b" ")[1])
        return self

    async def frame(self, timeout: float = 30.0) -> tuple[str, Any]:
        """The next frame that is an event (comments and retry lines skipped)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            raw = await asyncio.wait_for(self.reader.readuntil(b"\n\n"),
                                         max(0.1, deadline - loop.time()))
            event, data = "", b""
            for line in raw.split(b"\n"):
                if line.startswith(b"event: "):
                    event = line[7:].decode()
                elif line.startswith(b"data: "):
                    data = line[6:]
            if event:
                return event, json.loads(data)

    async def until(self, want: str, pred: Any = None, timeout: float = 30.0) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            event, data = await self.frame(max(0.1, deadline - loop.time()))
            if event == want and (pred is None or pred(data)):
                return data

    def close(self) -> None:
        self.writer.close()


@pytest.fixture
async def three(cluster: Cluster) -> Cluster:
    await cluster.start_broker()
    await cluster.start_agent("n1", "least-loaded", labels={"zone": "a"})
    await cluster.start_agent("n2", "binpack", labels={"zone": "b"}, cpu=2.0, memory_mb=2048)
    await cluster.start_agent("n3", "spread", labels={"zone": "a"})
    await cluster.wait_nodes(3)
    return cluster


@pytest.fixture
async def dash(three: Cluster) -> AsyncIterator[app.Dashboard]:
    d = await app.start(three.url, None, port=0)
    try:
        yield d
    finally:
        await d.close()


async def test_the_overview_lists_every_node_with_its_committed_room_and_host_load(
        three: Cluster, dash: app.Dashboard) -> None:
    async def all_healthy() -> bool:
        o = await overview(dash.port)
        return sum(n["health"] == "healthy" for n in o["nodes"]) == 3
    await wait_for(all_healthy, 30, what="three healthy nodes in the overview")
    iid = await three.submit(sleeper_spec("busy", cpu=1.5, memory_mb=300))

    async def committed() -> bool:
        o = await overview(dash.port)
        return any(n["committed"]["cpu"] == 1.5 for n in o["nodes"])
    await wait_for(committed, 30, what="the placement in a node's committed room")
    o = await overview(dash.port)
    nodes = {n["node_id"]: n for n in o["nodes"]}
    assert set(nodes) == {"n1", "n2", "n3"}
    assert nodes["n2"]["capacity"] == {"cpu": 2.0, "memory_mb": 2048, "ports": 1000}
    assert nodes["n2"]["labels"] == {"zone": "b"} and nodes["n2"]["strategy"] == "binpack"
    holder = (await three.status(iid)).node_id
    assert nodes[holder]["committed"]["memory_mb"] == 300 and nodes[holder]["instances"] == 1
    # The load bars: the host's own measurement, from each node's heartbeat.
    assert all(n["stats"]["cpu_count"] >= 1 and n["stats"]["memory_total_mb"] > 0
               for n in nodes.values())
    assert [i["instance_id"] for i in o["instances"]] == [iid]
    # This broker serves the service verbs, and has none.
    assert o["services"] == [] and o["services_error"] == "" and o["error"] == ""


async def test_the_event_stream_opens_with_the_overview_and_carries_every_event_live(
        three: Cluster, dash: app.Dashboard) -> None:
    stream = await Events.open(dash.port, "/api/events")
    try:
        assert stream.status == 200
        first, _ = await stream.frame()
        assert first == "overview"
        assert (await stream.frame())[0] == "history"
        iid = await three.submit(sleeper_spec("live"))
        ev = await stream.until("event", lambda e: e["instance_id"] == iid
                                and e["type"] == "running")
        assert ev["node_id"] in {"n1", "n2", "n3"}
        # ...and the overview that follows lists it, without the page asking.
        await stream.until("overview", lambda o: any(
            i["instance_id"] == iid and i["state"] == "running" for i in o["instances"]))
    finally:
        stream.close()
    # A page opened later is shown what happened before it.
    late = await Events.open(dash.port, "/api/events")
    try:
        history = await late.until("history")
        assert any(e["instance_id"] == iid and e["type"] == "running" for e in history)
    finally:
        late.close()


async def test_an_instance_page_has_its_auction_ranked_with_the_winner_flagged(
        three: Cluster, dash: app.Dashboard) -> None:
    iid = await three.submit(sleeper_spec("picked", labels={"zone": "a"}))

    async def placed() -> bool:
        return bool((await three.status(iid)).node_id)
    await wait_for(placed, 30, what="a placement")
    status, headers, body = await http(dash.port, f"/api/instances/{iid}")
    assert status == 200 and headers["content-type"] == "application/json"
    page = json.loads(body)
    a = page["auctions"][0]
    assert page["instance"]["instance_id"] == iid
    assert a["winner"] == (await three.status(iid)).node_id
    assert [b["node_id"] for b in a["bids"] if b["winner"]] == [a["winner"]]
    assert [b["load"] for b in a["bids"]] == sorted(b["load"] for b in a["bids"])
    assert {b["node_id"] for b in a["bids"]} == {"n1", "n3"}
    assert [(d["node_id"], d["text"]) for d in a["declines"]] == [("n2",
                                                                    "missing label zone=a")]
    status, _, body = await http(dash.port, "/api/instances/no-such-thing")
    assert status == 404 and json.loads(body)["error"].startswith(Reason.UNKNOWN_INSTANCE)
    status, _, _ = await http(dash.port, "/api/instances/..%2Fetc")
    assert status == 404


async def test_an_instance_page_has_its_usage_over_the_last_minutes(
        three: Cluster, dash: app.Dashboard) -> None:
    iid = await three.submit(sleeper_spec("measured"))
    nowhere = await three.submit(sleeper_spec("nowhere", labels={"gpu": "yes"}))

    async def usage(of: str) -> list[list[float]]:
        status, _, body = await http(dash.port, f"/api/instances/{of}")
        assert status == 200, body
        got: list[list[float]] = json.loads(body)["usage"]
        return got

    async def two() -> bool:
        return len(await usage(iid)) >= 2
    await wait_for(two, 30, what="two usage points, a refresh apart")
    got = await usage(iid)
    assert all(len(p) == 3 and p[1] >= 0 and p[2] >= 0 for p in got)  # at, cpu, memory
    assert [p[0] for p in got] == sorted({p[0] for p in got})  # oldest first, each once
    assert await usage(nowhere) == []  # never ran: nothing measured


async def test_a_batch_array_and_a_preemption_are_shown_as_the_broker_counts_them(
        cluster: Cluster, tmp_path: Path) -> None:
    """The overview tallies each batch array (done, running, failed, pending) as `gavel
    status ARRAY` does; an auction that displaced work lists the preempting offers and whom
    it displaced, and the displaced instance's page names its preemptor."""
    await cluster.start_broker()
    await cluster.start_agent("node-a", cpu=2.0)
    await cluster.wait_nodes(1)
    d = await app.start(cluster.url, None, port=0)
    try:
        box = tmp_path / "box"
        box.mkdir()
        script = f'while [ ! -e "{box}/go-$GAVEL_INSTANCE_ID" ]; do sleep 0.02; done'
        await cluster.call("submit", SubmitRequest(
            spec=Spec(name="arr", command=["sh", "-c", script], count=3, parallelism=1,
                      cpu=0.5), instance_id="arr", count=3), SubmitReply)

        async def tally(**want: int) -> bool:
            got = [a for a in (await overview(d.port))["arrays"] if a["array_id"] == "arr"]
            return bool(got) and all(got[0][k] == v for k, v in want.items())
        await wait_for(lambda: tally(succeeded=0, running=1, failed=0, pending=2), 30,
                       what="the array with one task running and two pending")
        for k in (1, 2, 3):
            (box / f"go-arr-{k}").touch()
        await wait_for(lambda: tally(succeeded=3, running=0, pending=0, ended=True, ok=True),
                       60, what="the array done on the dashboard")

        low = await cluster.submit(sleeper_spec("low", cpu=2.0, priority=10))
        await wait_for(lambda: _node_is(cluster, low, "node-a"), 30, what="low on node-a")
        urgent = await cluster.submit(sleeper_spec("urgent", cpu=2.0, priority=80))
        await wait_for(lambda: _node_is(cluster, urgent, "node-a"), 30,
                       what="urgent placed on node-a")
        status, _, body = await http(d.port, f"/api/instances/{urgent}")
        assert status == 200
        won = json.loads(body)["auctions"][0]
        assert won["winner"] == "node-a" and won["decided_by"].startswith("preempting offer")
        assert won["displaced"] == [{"instance_id": low, "priority": 10}]
        assert [(o["node_id"], o["taken"], o["victims"]) for o in won["offers"]] == [
            ("node-a", True, [{"instance_id": low, "priority": 10}])]
        status, _, body = await http(d.port, f"/api/instances/{low}")
        page = json.loads(body)
        assert [(p["instance_id"], p["node_id"], p["text"]) for p in page["preempted_by"]] == [
            (urgent, "node-a", f"preempted by {urgent} (priority 80)")]
    finally:
        await d.close()


async def _node_is(cluster: Cluster, iid: str, node: str) -> bool:
    return bool((await cluster.status(iid)).node_id == node)


async def test_services_are_shown_with_their_replicas(three: Cluster,
                                                     dash: app.Dashboard) -> None:
    spec = sleeper_spec("web", type="service", count=2, cpu=0.25, memory_mb=64)
    await three.call("deploy", DeployRequest(spec=spec), DeployReply)

    async def kept() -> bool:
        services = (await overview(dash.port))["services"] or []
        return any(s["name"] == "web" and len(s["replicas"]) == 2 for s in services)
    await wait_for(kept, 60, what="the service and its two replicas in the overview")
    o = await overview(dash.port)
    web = next(s for s in o["services"] if s["name"] == "web")
    assert web["version"] == 1 and web["count"] == 2 and o["services_error"] == ""
    replicas = {r["instance_id"] for r in web["replicas"]}
    assert replicas <= {i["instance_id"] for i in o["instances"] if i["service"] == "web"}


async def test_a_broker_without_the_service_verbs_has_no_services_on_the_page(
        nats_url: str) -> None:
    """Played by the test: an older broker, answering what it knows (nodes, status, events)
    and either not hearing the service verbs or answering that it does not know them."""
    nc = await nats.connect(nats_url)
    enc = msgspec.msgpack.Encoder()
    services: list[Any] = [None]  # None: the verb is unknown
    asked: list[str] = []

    async def older_broker(msg: Any) -> None:
        verb = msg.subject.rsplit(".", 1)[-1]
        asked.append(verb)
        replies: dict[str, Any] = {"nodes": NodesReply(nodes=[]),
                                   "status": StatusReply(instances=[]),
                                   "events": EventsReply(events=[]),
                                   "services": services[0]}
        await msg.respond(enc.encode(replies.get(verb) or ApiError(error=f"unknown verb "
                                                                         f"{verb}")))
    subs = [await nc.subscribe(subjects.API.format(verb=v), cb=older_broker)
            for v in ("nodes", "status", "events")]
    await wire.subscribed(nc)
    d = await app.start(nats_url, None, port=0)
    try:
        async def shown() -> Any:
            o = await overview(d.port)
            return o["error"], o["services"], o["services_error"]
        await wait_for(lambda: _is(shown(), ("", None, "")), 30,
                       what="no services while nobody answers the verb")
        subs.append(await nc.subscribe(subjects.API.format(verb="services"), cb=older_broker))
        await wire.subscribed(nc)
        await wait_for(lambda: asked.count("services") >= 2, 30,
                       what="the dashboard to ask the verb's responder twice")
        assert await shown() == ("", None, "")  # it says the verb is unknown: still none
        services[0] = ApiError(error="services failed: the state repository is locked")
        await wait_for(lambda: _is(shown(), ("", None, services[0].error)), 30,
                       what="another refusal, said as it was said")
    finally:
        await d.close()
        for sub in subs:
            await sub.unsubscribe()
        await nc.close()


async def _is(got: Any, want: Any) -> bool:
    return bool(await got == want)


async def test_on_another_address_every_request_needs_the_token(three: Cluster) -> None:
    d = await app.start(three.url, None, addr="0.0.0.0", port=0)
    try:
        assert d.token and d.token_made and d.open_url.endswith(f"/?token={d.token}")
        for path in ("/", "/api/overview", "/static/app.js", "/api/instances/x"):
            status, headers, _ = await http(d.port, path)
            assert status == 401, path
            assert headers["www-authenticate"] == "Bearer"
        assert (await http(d.port, "/api/overview", {"Authorization": "Bearer nope"}))[0] == 401
        assert (await Events.open(d.port, "/api/events")).status == 401
        status, _, body = await http(d.port, "/api/overview",
                                     {"Authorization": f"Bearer {d.token}"})
        assert status == 200 and "nodes" in json.loads(body)
        # The printed URL: the token is traded for a cookie and leaves the address bar.
        status, headers, _ = await http(d.port, f"/?token={d.token}")
        assert status == 303 and headers["location"] == "/"
        cookie = headers["set-cookie"].split(";")[0]
        assert "HttpOnly" in headers["set-cookie"] and "SameSite=Strict" in headers["set-cookie"]
        assert (await http(d.port, "/", {"Cookie": cookie}))[0] == 200
        stream = await Events.open(d.port, "/api/events", {"Cookie": cookie})
        try:
            assert stream.status == 200 and (await stream.frame())[0] == "overview"
        finally:
            stream.close()
        # With a token, the Host may be any name the machine is reached by.
        assert (await http(d.port, "/api/overview", {"Cookie": cookie,
                                                     "Host": "gavel.example:1"}))[0] == 200
    finally:
        await d.close()


async def test_a_token_given_on_loopback_is_required_there_too(three: Cluster) -> None:
    d = await app.start(three.url, None, port=0, token="given-token-123")
    try:
        assert not d.token_made and "given-token-123" not in d.announce()
        assert (await http(d.port, "/api/overview"))[0] == 401
        assert (await http(d.port, "/api/overview?token=given-token-123"))[0] == 200
    finally:
        await d.close()


async def test_the_gavel_ui_command_prints_its_token_once(three: Cluster, tmp_path: Path
                                                          ) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gavel", "ui", "--nats", three.url,
                             "--addr", "0.0.0.0", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        line = (await asyncio.to_thread(proc.stdout.readline)).decode()
        m = re.search(rf"http://\S+:{port}/\?token=(\S+)", line)
        assert m, line
        token = m.group(1)
        assert (await http(port, "/api/overview"))[0] == 401
        assert (await http(port, "/api/overview", {"Authorization": f"Bearer {token}"}))[0] \
            == 200
    finally:
        proc.terminate()
        rest = (await asyncio.to_thread(proc.communicate, timeout=30))[0].decode()
    assert proc.returncode == 0 and token not in rest


async def test_a_dashboard_stopped_with_a_page_open_ends_it_quietly(
        three: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    d = await app.start(three.url, None, port=0)
    try:
        events = await Events.open(d.port, "/api/events")
        assert (await events.frame())[0] == "overview"
    finally:
        await d.close()  # as Ctrl-C on `gavel up` or `gavel ui` does, a browser still on it
    await asyncio.wait_for(events.reader.read(), 30)  # the rest, to its end: it ended
    assert events.reader.at_eof()
    events.close()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_on_loopback_a_page_elsewhere_cannot_read_it_and_nothing_is_written(
        three: Cluster, dash: app.Dashboard) -> None:
    assert not dash.token and dash.open_url == f"http://127.0.0.1:{dash.port}/"
    status, headers, body = await http(dash.port, "/")
    assert status == 200 and b"/static/app.js" in body
    assert "script-src 'self'" in headers["content-security-policy"]
    for name in ("app.js", "style.css", "favicon.svg"):
        assert (await http(dash.port, f"/static/{name}"))[0] == 200
    assert (await http(dash.port, "/static/../app.py"))[0] == 404
    # DNS rebinding: a name of someone else's that points here is refused.
    assert (await http(dash.port, "/api/overview", {"Host": "evil.example"}))[0] == 403
    assert (await http(dash.port, "/api/overview", {"Host": f"localhost:{dash.port}"}))[0] \
        == 200
    for method in ("POST", "PUT", "DELETE"):
        assert (await http(dash.port, "/api/overview", method=method))[0] == 405


async def test_the_logs_panel_streams_the_instances_lines_or_says_why_it_cannot(
        three: Cluster, dash: app.Dashboard, tmp_path: Path) -> None:
    spec = Spec(name="talker", command=[sys.executable, "-c",
                                        "import time\nprint('hello from the log', flush=True)\n"
                                        "time.sleep(60)"])
    iid = await three.submit(spec)

    async def running() -> bool:
        return (await three.status(iid)).state == "running"
    await wait_for(running, 30, what="the instance to run")
    stream = await Events.open(dash.port, f"/api/logs/{iid}")
    try:
        got = await stream.until("lines", lambda f: "hello from the log" in f["lines"])
        assert got["stream"] == "stdout"
    finally:
        stream.close()
    # An instance that never ran on a node has no output, and the panel says so.
    never = await three.submit(sleeper_spec("nowhere", labels={"gpu": "true"}))

    async def unschedulable() -> bool:
        return (await three.status(never)).state == "unschedulable"
    await wait_for(unschedulable, 30, what="an unschedulable instance")
    stream = await Events.open(dash.port, f"/api/logs/{never}")
    try:
        got = await stream.until("unavailable")
        assert got["text"].startswith(f"{never} has not run on a node yet")
    finally:
        stream.close()


async def test_gavel_up_serves_the_dashboard_and_prints_its_url_unless_no_ui(
        tmp_path: Path) -> None:
    logs_ = {flag: tmp_path / f"up{flag}.log" for flag in ("", "--no-ui")}
    procs = {flag: gavel_process(["up", "--state", str(tmp_path / f"state{flag}"),
                                  "--workers", "1", *([flag] if flag else [])], log)
             for flag, log in logs_.items()}
    try:
        def said(flag: str) -> bool:
            assert procs[flag].poll() is None, logs_[flag].read_text()
            return "try: " in logs_[flag].read_text()
        await wait_for(lambda: said("") and said("--no-ui"), 90, what="both clusters up")
        text = logs_[""].read_text()
        m = re.search(r"dashboard: http://127\.0\.0\.1:(\d+)/\n", text)
        assert m, text
        port = int(m.group(1))

        async def listed() -> bool:
            return len((await overview(port))["nodes"]) == 1
        await wait_for(listed, 60, what="the node on the dashboard of `gavel up`")
        assert "dashboard" not in logs_["--no-ui"].read_text()
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            await asyncio.to_thread(p.wait, 30)
    assert all(p.returncode == 0 for p in procs.values())


async def test_the_overview_is_the_brokers_summary_not_every_status_page(
        cluster: Cluster) -> None:
    """At a hundred thousand instances reading every status page each refresh is the
    broker's loop and the wire's payload, again and again: the dashboard asks for the
    summary (`StatusRequest.summary`) alone - counts of every instance, a bounded list."""
    from gavel.shared.api import SUMMARY_SHOWN, StatusRequest, SubmitReply, SubmitRequest

    await cluster.start_broker()
    await cluster.start_agent("n1", "least-loaded", cpu=1.0, memory_mb=512)
    await cluster.wait_nodes(1)  # the broker is up whole: its event stream too
    spy = await nats.connect(cluster.url)
    asked: list[StatusRequest] = []

    async def heard(m: Any) -> None:
        asked.append(msgspec.msgpack.decode(m.data, type=StatusRequest))
    await spy.subscribe(subjects.API.format(verb="status"), cb=heard)
    n = SUMMARY_SHOWN + 700
    spec = Spec(name="many", command=["sleep", "600"], cpu=1.0, memory_mb=16)  # one runs
    await cluster.call("submit", SubmitRequest(spec=spec, instance_id="many", count=n),
                       SubmitReply)
    d = await app.start(cluster.url, None, port=0)
    try:
        async def counted() -> bool:
            o = await overview(d.port)
            return o["instances_total"] == n and sum(o["counts"].values()) == n
        await wait_for(counted, 30, what="every instance counted in the overview")
        o = await overview(d.port)
        assert len(o["instances"]) == SUMMARY_SHOWN
        assert {i["name"] for i in o["instances"]} == {"many"}
        await spy.flush()
        # The summary, and each shown array's tally: never a page of every instance.
        assert any(not r.instance_id for r in asked)
        assert all(r.summary and not r.after for r in asked), asked
    finally:
        await d.close()
        await spy.close()
