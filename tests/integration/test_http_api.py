"""The HTTP API against a real cluster: a real nats-server, a broker and workers, the API as
an operator client of them (`gavel.cli.api`), plain HTTP on a socket, and the typed Python
client (`gavel.client`) asked the same questions."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gavel.cli.api import app
from gavel.cli.api.routes import BODY_MAX, ROUTES
from gavel.client import Client, Ended, SyncClient
from gavel.shared.execstream import Ended as Ended_
from gavel.shared.messages import Spec
from gavel.shared.reasons import Reason
from tests.integration.harness import Cluster, sleeper_spec, wait_for
from tests.integration.httpclient import Sse, get_json, http

pytestmark = pytest.mark.integration

JSON = {"Content-Type": "application/json"}


def spec_json(spec: Spec) -> Any:
    return msgspec.to_builtins(spec)


def service_spec(name: str) -> Spec:
    return sleeper_spec(name, 120, type="service", count=1, cpu=0.1, memory_mb=32)


@pytest.fixture
async def two(cluster: Cluster) -> Cluster:
    await cluster.start_broker()
    await cluster.start_agent("n1", labels={"zone": "a"})
    await cluster.start_agent("n2", labels={"zone": "b"})
    await cluster.wait_nodes(2)
    return cluster


@pytest.fixture
async def api(two: Cluster) -> AsyncIterator[app.ApiServer]:
    server = await app.start(two.url, None, port=0)
    try:
        yield server
    finally:
        await server.close()


async def running(port: int, iid: str) -> None:
    async def up() -> bool:
        status, got = await get_json(port, f"/v1/instances/{iid}")
        return status == 200 and got["instances"][0]["state"] == "running"
    await wait_for(up, 30, what=f"{iid} running")


async def test_every_route_is_documented_and_every_documented_route_answers(
        api: app.ApiServer) -> None:
    status, doc = await get_json(api.port, "/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.1")
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert documented == {(r.method, r.path) for r in ROUTES}
    for ops in doc["paths"].values():  # every schema it names is in the document
        for ref in json.dumps(ops).split('"$ref": "')[1:]:
            assert ref.split('"')[0].removeprefix("#/components/schemas/") in \
                doc["components"]["schemas"]
    # A cluster with something of each: an instance, a service.
    status, _, got = await http(api.port, "POST", "/v1/instances",
                                json_body={"spec": spec_json(sleeper_spec("job", cpu=0.1,
                                                                       memory_mb=32)),
                                        "instance_id": "job-1"})
    assert status == 200, got
    status, _, got = await http(api.port, "POST", "/v1/services",
                                json_body={"spec": spec_json(service_spec("web"))})
    assert status == 200, got
    await running(api.port, "job-1")
    names = {"instance_id": "job-1", "node_id": "n1", "name": "web"}
    bodies: dict[tuple[str, str], Any] = {
        ("POST", "/v1/instances"): {"spec": spec_json(sleeper_spec("job2", cpu=0.1,
                                                                   memory_mb=32))},
        ("POST", "/v1/services"): {"spec": spec_json(service_spec("web"))},
        ("POST", "/v1/services/{name}/scale"): {"count": 2},
        ("POST", "/v1/nodes/{node_id}/drain"): {"undo": True},
        ("POST", "/v1/plan"): {"spec": spec_json(service_spec("web"))},
        ("POST", "/v1/tune"): {"batch_max": 8, "commit_gap_ms": 2.5},
    }
    # The last ones change what the others read: ask them last.
    last = [("POST", "/v1/services/{name}/rollback"), ("POST", "/v1/services/{name}/stop"),
            ("DELETE", "/v1/instances/{instance_id}")]
    order = sorted(documented - set(last)) + last
    for method, path in order:
        url = path.format(**names)
        if method == "GET" and url.endswith(("/logs", "/stream")):
            sse = await Sse.open(api.port, url)
            sse.close()
            assert sse.status == 200 and b"text/event-stream" in sse.head, (method, path)
            continue
        if url.endswith("/exec"):
            status, headers, got = await http(api.port, method, url,
                                              json_body={"command": ["true"]})
            assert status == 200 and headers["content-type"] == "text/event-stream", got
            assert [e for e, _ in _frames(got)] == ["exit"]
            continue
        body = bodies.get((method, path), {} if method == "POST" else None)
        status, headers, got = await http(api.port, method, url, json_body=body)
        # rollback: the service has no version to go back to yet - the broker's sentence
        want = 409 if path.endswith("/rollback") else 200
        assert status == want, (method, path, got)
        assert headers["content-type"] == "application/json"
        json.loads(got)


async def test_the_client_and_the_http_api_give_the_same_answers(
        two: Cluster, api: app.ApiServer) -> None:
    async with await Client.connect(two.url) as client:
        reply = await client.submit(sleeper_spec("same", cpu=0.1, memory_mb=32),
                                    instance_id="same-1")
        assert reply.instance_id == "same-1"
        await client.wait("same-1")
        await client.deploy(service_spec("svc"))
        await wait_for(lambda: _healthy(client, "svc"), 30, what="svc running")
        asked = {
            "/v1/instances": client.status,
            "/v1/instances/same-1": lambda: client.status("same-1"),
            "/v1/instances/same-1/why": lambda: client.why("same-1"),
            "/v1/events?instance_id=same-1&limit=0": lambda: client.events("same-1",
                                                                            limit=0),
            "/v1/services": client.services,
            "/v1/services/svc": lambda: client.service("svc"),
            "/v1/routes": client.routes,
            "/v1/endpoints": client.endpoints,
            "/v1/nodes/n1": lambda: client.nodes("n1"),
        }
        for path, ask in asked.items():
            async def agree(path: str = path, ask: Any = ask) -> bool:
                mine = msgspec.to_builtins(await ask())
                status, theirs = await get_json(api.port, path)
                return status == 200 and _steady(mine) == _steady(theirs)
            await wait_for(agree, 20, what=f"the client and GET {path} agreeing")
        nodes = await client.nodes()
        status, theirs = await get_json(api.port, "/v1/nodes")
        assert status == 200
        assert [(n.node_id, msgspec.to_builtins(n.capacity), n.labels) for n in nodes.nodes] \
            == [(n["node_id"], n["capacity"], n["labels"]) for n in theirs["nodes"]]
        # wait: a pipeline hears at once that what it submitted cannot be placed
        nowhere = await client.submit(sleeper_spec("gpu", labels={"gpu": "yes"}))
        with pytest.raises(Ended, match="is unschedulable"):
            await client.wait(nowhere.instance_id, timeout=60)
    # The sync client, from a thread of its own (this loop runs the broker).
    def sync_status() -> Any:
        with SyncClient(two.url) as c:
            return msgspec.to_builtins(c.status("same-1"))
    mine = await asyncio.to_thread(sync_status)
    status, theirs = await get_json(api.port, "/v1/instances/same-1")
    assert _steady(mine) == _steady(theirs)

    def sync_follow() -> str:  # the sync client's event feed: subscribed when it returns
        with SyncClient(two.url) as c:
            feed = c.follow_events("same-1")
            c.cancel("same-1")
            for event in feed:
                if event.type == "cancelled":
                    return event.instance_id
        return ""
    assert await asyncio.to_thread(sync_follow) == "same-1"


async def _healthy(client: Client, name: str) -> bool:
    svc = (await client.service(name)).service
    return bool(svc.replicas) and all(r.state == "running" for r in svc.replicas)


def _steady(obj: Any) -> Any:
    """An answer without what changes from one moment to the next (ages, host load)."""
    if isinstance(obj, dict):
        return {k: _steady(v) for k, v in obj.items()
                if k not in ("last_seen_s", "stats", "rejected")}
    if isinstance(obj, list):
        return [_steady(v) for v in obj]
    return obj


async def test_an_idempotency_key_makes_one_submission_and_refuses_another_spec(
        api: app.ApiServer) -> None:
    body = {"spec": spec_json(sleeper_spec("keyed", cpu=0.1, memory_mb=32)), "count": 2}
    key = {"Idempotency-Key": "build-000123"}
    first = await http(api.port, "POST", "/v1/instances", json_body=body, headers=key)
    again = await http(api.port, "POST", "/v1/instances", json_body=body, headers=key)
    assert first[0] == again[0] == 200
    assert json.loads(first[2]) == json.loads(again[2])
    assert len(json.loads(first[2])["instance_ids"]) == 2
    status, all_ = await get_json(api.port, "/v1/instances")
    assert sum(i["name"] == "keyed" for i in all_["instances"]) == 2
    other = {"spec": spec_json(sleeper_spec("other", cpu=0.1, memory_mb=32)), "count": 2}
    status, _, got = await http(api.port, "POST", "/v1/instances", json_body=other,
                                headers=key)
    assert status == 409 and json.loads(got)["error"].startswith(Reason.KEY_REUSED)
    status, _, got = await http(api.port, "POST", "/v1/instances", json_body=body,
                                headers={"Idempotency-Key": "no!"})
    assert status == 400 and "Idempotency-Key" in json.loads(got)["error"]
    # A deploy retried with its key is answered what the first was (without one, the same
    # spec again would be "unchanged").
    web = {"spec": spec_json(service_spec("keyed-web"))}
    replies = [json.loads((await http(api.port, "POST", "/v1/services", json_body=web,
                                      headers={"Idempotency-Key": "deploy-0001"}))[2])
               for _ in range(2)]
    assert replies[0] == replies[1] and replies[0]["changed"] is True
    plain = json.loads((await http(api.port, "POST", "/v1/services", json_body=web))[2])
    assert plain["changed"] is False and plain["version"] == replies[0]["version"]


async def test_refusals_are_json_sentences_with_a_fitting_status(
        two: Cluster, api: app.ApiServer) -> None:
    async def refused(method: str, path: str, **kw: Any) -> tuple[int, str]:
        status, headers, body = await http(api.port, method, path, **kw)
        assert headers["content-type"] == "application/json", (path, body)
        got = json.loads(body)
        assert got["kind"] == "error" and "\n" not in got["error"]
        return status, got["error"]

    status, said = await refused("GET", "/v1/instances/ghost")
    assert status == 404 and said.startswith(Reason.UNKNOWN_INSTANCE)
    status, said = await refused("GET", "/v1/nodes/ghost")
    assert status == 404 and said.startswith(Reason.UNKNOWN_NODE)
    status, said = await refused("GET", "/v1/services/ghost")
    assert status == 404 and said.startswith(Reason.UNKNOWN_SERVICE)
    status, said = await refused("DELETE", "/v1/instances/ghost")
    assert status == 404 and said.startswith(Reason.UNKNOWN_INSTANCE)
    body = {"spec": spec_json(sleeper_spec("dup", cpu=0.1, memory_mb=32)),
            "instance_id": "dup-1"}
    assert (await http(api.port, "POST", "/v1/instances", json_body=body))[0] == 200
    status, said = await refused("POST", "/v1/instances", json_body=body)
    assert status == 409 and said.startswith(Reason.DUPLICATE)
    status, said = await refused("POST", "/v1/services", json_body={
        "spec": spec_json(sleeper_spec("a-job"))})
    assert status == 422 and said.startswith(Reason.NOT_A_SERVICE)
    status, said = await refused("GET", "/v1/nope")
    assert status == 404
    status, headers, body = await http(api.port, "HEAD", "/v1/nodes")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0
    r, w = await asyncio.open_connection("127.0.0.1", api.port)
    w.write(b"not http at all\r\n\r\n")
    answer = await asyncio.wait_for(r.read(), 30)
    w.close()
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["kind"] == "error"
    status, said = await refused("PUT", "/v1/instances")
    assert status == 405
    await two.stop_broker()
    status, said = await refused("GET", "/v1/instances")
    assert status == 503 and said.startswith("no broker is answering")


async def test_bad_input_is_a_4xx_with_the_clis_sentence_never_a_500(
        two: Cluster, api: app.ApiServer, tmp_path: Path) -> None:
    good = spec_json(sleeper_spec("bad", cpu=0.1, memory_mb=32))
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"body": b"{not json", "headers": JSON}, 400, "request body: not valid JSON"),
        ({"body": b"[1, 2]", "headers": JSON}, 400, "request body: expected a JSON object"),
        ({"body": json.dumps({"spec": good}).encode(), "headers": {"Content-Type":
                                                                   "text/plain"}},
         415, "the request body must be JSON"),
        ({"json_body": {"spec": good, "bogus": 1}}, 400,
         "request body: invalid request: unknown field `bogus`"),
        ({"json_body": {"spec": good, "count": "two"}}, 400,
         "request: invalid request: field 'count'"),
        ({"body": b" " * (BODY_MAX + 1), "headers": JSON}, 413,
         f"the request body is larger than this API reads ({BODY_MAX} bytes)"),
        ({"body": b"{}", "headers": {**JSON, "Transfer-Encoding": "chunked"}}, 411,
         "a request body must come with a Content-Length"),
        ({"body": b"{}", "headers": {**JSON, "Content-Length": "lots"}}, 400,
         "not an HTTP request, or a Content-Length that is not a number"),
    ]
    for kw, want, said in cases:
        status, _, body = await http(api.port, "POST", "/v1/instances", **kw)
        assert (status, json.loads(body)["error"][:len(said)]) == (want, said), kw
    # A spec with an unknown field: the sentence `gavel submit` gives for the same spec.
    bad = {**good, "cmd": ["x"]}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    cli = subprocess.run([sys.executable, "-m", "gavel", "submit", "--nats", two.url,
                          str(tmp_path / "bad.json")], capture_output=True, text=True,
                         timeout=60)
    assert cli.returncode == 2
    cli_said = cli.stderr.strip().split("invalid spec: ", 1)[1]
    status, _, body = await http(api.port, "POST", "/v1/instances", json_body={"spec": bad})
    assert status == 400
    assert json.loads(body)["error"] == f"request body: invalid spec: {cli_said}"


async def test_events_stream_the_kept_ones_then_each_new_one(
        two: Cluster, api: app.ApiServer) -> None:
    sse = await Sse.open(api.port, "/v1/events/stream?instance_id=ev-1&limit=0")
    try:
        assert sse.status == 200
        body = {"spec": spec_json(sleeper_spec("ev", cpu=0.1, memory_mb=32)),
                "instance_id": "ev-1"}
        assert (await http(api.port, "POST", "/v1/instances", json_body=body))[0] == 200
        seen = await sse.until("event", lambda e: e["type"] == "running")
        assert seen["instance_id"] == "ev-1"
    finally:
        sse.close()
    # Opened later, it starts with what the broker kept.
    sse = await Sse.open(api.port, "/v1/events/stream?instance_id=ev-1&limit=0")
    try:
        first = await sse.until("event")
        assert first["instance_id"] == "ev-1" and first["type"] != "running"
        await sse.until("event", lambda e: e["type"] == "running")
    finally:
        sse.close()


async def test_a_reconnecting_events_stream_resumes_after_its_last_id_from_the_history(
        two: Cluster, api: app.ApiServer) -> None:
    """Each new event carries its sequence in the history as its ``id:``; a client that comes
    back with ``Last-Event-ID`` gets what happened meanwhile, in order, each once, and
    nothing it had."""
    sse = await Sse.open(api.port, "/v1/events/stream?instance_id=rs-1&limit=0")
    try:
        body = {"spec": spec_json(sleeper_spec("rs", cpu=0.1, memory_mb=32)),
                "instance_id": "rs-1"}
        assert (await http(api.port, "POST", "/v1/instances", json_body=body))[0] == 200
        await sse.until("event", lambda e: e["type"] == "running")
        assert sse.id.isdigit(), "a new event carries its history sequence"
        last = sse.last_id
    finally:
        sse.close()
    # Gone while the instance is cancelled; back with the last id heard.
    assert (await http(api.port, "DELETE", "/v1/instances/rs-1"))[0] == 200
    async def ended() -> bool:
        return (await two.status("rs-1")).state == "cancelled"
    await wait_for(ended, 30, what="rs-1 cancelled")
    sse = await Sse.open(api.port, "/v1/events/stream?instance_id=rs-1&limit=0",
                         last_id=last)
    try:
        assert sse.status == 200
        ids, types = [], []
        while "cancelled" not in types:
            event, data = await sse.frame()
            assert event == "event" and data["instance_id"] == "rs-1"
            ids.append(int(sse.id))
            types.append(data["type"])
        assert "running" not in types and ids == sorted(set(ids)) and ids[0] > int(last)
    finally:
        sse.close()
    bad = await Sse.open(api.port, "/v1/events/stream?instance_id=rs-1", last_id="soon")
    try:
        assert bad.status == 400
    finally:
        bad.close()


async def test_logs_stream_an_instances_output_then_done(
        two: Cluster, api: app.ApiServer) -> None:
    code = "import sys, time\nfor i in range(3): print('line', i, flush=True)\ntime.sleep(60)"
    spec = Spec(name="talk", command=[sys.executable, "-c", code], cpu=0.1, memory_mb=32)
    assert (await http(api.port, "POST", "/v1/instances", json_body={
        "spec": spec_json(spec), "instance_id": "talk-1"}))[0] == 200
    await running(api.port, "talk-1")

    async def said() -> bytes:
        sse = await Sse.open(api.port, "/v1/instances/talk-1/logs?streams=stdout")
        out = b""
        try:
            while True:
                event, data = await sse.frame()
                if event == "chunk":
                    out += base64.b64decode(data["data"])
                if event == "done":
                    assert data["running"] is True
                    return out
        finally:
            sse.close()

    async def all_three() -> bool:
        return (await said()).count(b"line") == 3
    await wait_for(all_three, 30, what="three lines of output")
    follow = await Sse.open(api.port, "/v1/instances/talk-1/logs?follow=true&tail=1")
    try:
        chunk = await follow.until("chunk")
        assert base64.b64decode(chunk["data"]) == b"line 2\n"
    finally:
        follow.close()
    status, _, body = await http(api.port, "GET", "/v1/instances/ghost/logs")
    assert status == 404 and json.loads(body)["error"].startswith(Reason.UNKNOWN_INSTANCE)


def _frames(body: bytes) -> list[tuple[str, Any]]:
    """A finished event stream's frames: (event, its data as JSON)."""
    out = []
    for raw in body.split(b"\n\n"):
        lines = dict(line.split(b": ", 1) for line in raw.split(b"\n") if b": " in line)
        if b"event" in lines:
            out.append((lines[b"event"].decode(), json.loads(lines[b"data"])))
    return out


async def test_exec_over_http_streams_a_commands_output_and_its_exit(
        two: Cluster, api: app.ApiServer) -> None:
    await two.submit(sleeper_spec("shell", cpu=0.1, memory_mb=32), "shell-1")
    await running(api.port, "shell-1")
    script = "cat; echo oops >&2; exit 7"
    status, headers, got = await http(
        api.port, "POST", "/v1/instances/shell-1/exec",
        json_body={"command": ["/bin/sh", "-c", script],
                   "stdin": base64.b64encode(b"hello\n").decode()})
    assert status == 200 and headers["content-type"] == "text/event-stream", got
    frames = _frames(got)
    said = {stream: b"".join(base64.b64decode(d["data"]) for e, d in frames
                             if e == "output" and d["stream"] == stream)
            for stream in ("stdout", "stderr")}
    assert said == {"stdout": b"hello\n", "stderr": b"oops\n"}
    assert frames[-1][0] == "exit" and frames[-1][1]["exit_code"] == 7
    # the node's own limits: a session past its time is killed, and says why
    status, _, got = await http(api.port, "POST", "/v1/instances/shell-1/exec",
                                json_body={"command": ["sleep", "60"], "timeout_s": 0.5})
    assert _frames(got)[-1] == ("exit", {**_frames(got)[-1][1], "exit_code": None,
                                         "reason": Ended_.TIMEOUT})

    async def audited() -> bool:  # each session an exec event of the instance, as the CLI's
        _, kept = await get_json(api.port, "/v1/events?instance_id=shell-1&limit=0")
        return len([e for e in kept["events"] if e["type"] == "exec"]) == 2
    await wait_for(audited, 15, what="two exec events")
    _, kept = await get_json(api.port, "/v1/events?instance_id=shell-1&limit=0")
    first = next(e for e in kept["events"] if e["type"] == "exec")
    assert first["detail"].startswith("operator ran /bin/sh -c") and first["exit_code"] == 7
    # not running: refused before any stream, in a sentence
    await two.submit(sleeper_spec("gone", cpu=0.1, memory_mb=32, labels={"gpu": "yes"}),
                     "gone-1")
    status, _, got = await http(api.port, "POST", "/v1/instances/gone-1/exec",
                                json_body={"command": ["true"]})
    assert status == 409 and "is not running" in json.loads(got)["error"], got
    status, _, got = await http(api.port, "POST", "/v1/instances/shell-1/exec",
                                json_body={"command": []})
    assert status == 400, got


async def test_a_read_token_serves_the_reading_routes_and_refuses_every_change(
        two: Cluster) -> None:
    server = await app.start(two.url, None, port=0, token="full-token",
                             read_token="reader-token")
    try:
        def bearer(token: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {token}"}
        status, _, _ = await http(server.port, "GET", "/v1/nodes",
                                  headers=bearer("reader-token"))
        assert status == 200
        body = {"spec": spec_json(sleeper_spec("ro", cpu=0.1, memory_mb=32))}
        status, _, said = await http(server.port, "POST", "/v1/instances", json_body=body,
                                     headers=bearer("reader-token"))
        assert status == 403
        assert json.loads(said)["error"].startswith("this token may only read")
        status, _, _ = await http(server.port, "POST", "/v1/instances", json_body=body,
                                  headers=bearer("full-token"))
        assert status == 200
        status, _, said = await http(server.port, "POST", "/v1/instances/x-1/exec",
                                     json_body={"command": ["true"]},
                                     headers=bearer("reader-token"))
        assert status == 403, said  # exec is a writer's, though it streams
        status, _, _ = await http(server.port, "GET", "/v1/nodes")
        assert status == 401
    finally:
        await server.close()


async def test_a_token_is_required_where_given_and_tls_where_a_cert_is(
        two: Cluster, tmp_path: Path) -> None:
    from tests.integration.test_tls import make_certs
    make_certs(tmp_path)
    server = await app.start(two.url, None, port=0, token="s3cret-token",
                             tls_cert=str(tmp_path / "server.pem"),
                             tls_key=str(tmp_path / "server.key"))
    try:
        assert server.url.startswith("https://")
        tls = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        status, _, body = await http(server.port, "GET", "/v1/nodes", tls=tls)
        assert status == 401 and "Bearer" in json.loads(body)["error"]
        status, _, body = await http(server.port, "GET", "/v1/nodes", tls=tls,
                                     headers={"Authorization": "Bearer s3cret-token"})
        assert status == 200 and len(json.loads(body)["nodes"]) == 2
        r, w = await asyncio.open_connection("127.0.0.1", server.port)  # plain HTTP
        w.write(b"GET /v1/nodes HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            answer = await asyncio.wait_for(r.read(), 30)
        except ConnectionError:
            answer = b""
        w.close()
        assert not answer.startswith(b"HTTP/")  # it gets no answer in plain text
    finally:
        await server.close()
    off = await app.start(two.url, None, addr="0.0.0.0", port=0)  # off loopback: a token
    try:
        assert off.token and off.token_made and off.token in off.announce()
        assert (await http(off.port, "GET", "/v1/nodes"))[0] == 401
    finally:
        await off.close()


async def test_gavel_api_serves_the_document_and_says_where(two: Cluster) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "gavel", "api", "--nats", two.url,
                             "--api-port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        assert line.startswith("gavel api: HTTP API at http://127.0.0.1:"), line
        port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
        status, doc = await get_json(port, "/openapi.json")
        assert status == 200 and "/v1/instances" in doc["paths"]
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


async def test_an_idle_follow_gets_keep_alives_and_goes_on(
        two: Cluster, api: app.ApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app, "KEEPALIVE_S", 0.1)
    code = ("import time\nfor i in range(60):\n    print('tick', i, flush=True)\n"
            "    time.sleep(1)")
    spec = Spec(name="tick", command=[sys.executable, "-c", code], cpu=0.1, memory_mb=32)
    assert (await http(api.port, "POST", "/v1/instances", json_body={
        "spec": spec_json(spec), "instance_id": "tick-1"}))[0] == 200
    await running(api.port, "tick-1")
    sse = await Sse.open(api.port, "/v1/instances/tick-1/logs?follow=true&tail=0")
    try:
        raw = b""

        def chunk_after_keep_alive() -> bool:  # a line, a keep-alive, then another line
            first = raw.find(b"event: chunk")
            alive = raw.find(b": keep-alive", first) if first >= 0 else -1
            return alive >= 0 and raw.find(b"event: chunk", alive) >= 0

        while not chunk_after_keep_alive():
            raw += await asyncio.wait_for(sse.reader.read(4096), 30)
        assert b"event: done" not in raw and b"event: error" not in raw
    finally:
        sse.close()
