"""Operators who are not all one: `gavel auth operator add` identities with roles, against a real
nats-server running the config `gavel auth init` writes, a real broker and a real worker, each
on its own nkey.

What must hold: a reader calls the reading verbs, and its submit, cancel or exec is refused
by the server (and said in one sentence); it cannot subscribe to another operator's inbox,
nor to the shared one, nor publish under another operator's name; a writer submits and
execs, its answers under its own inbox; the node knows who ran an exec, from the subject the
server held the writer to.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gavel.broker.config import Config
from gavel.broker.service import Broker
from gavel.shared import logstream, subjects
from gavel.shared.api import (
    EventsReply,
    EventsRequest,
    StatusReply,
    StatusRequest,
    SubmitReply,
    SubmitRequest,
)
from gavel.shared.execstream import ExecOutput, ExecStart
from gavel.shared.messages import InstanceState
from gavel.shared.strategies import make_strategy
from gavel.transport import identity as auth
from gavel.transport.client import ClientError, call, connect, operator_of
from gavel.transport.execclient import new_session, run
from gavel.transport.natsserver import NatsServer
from gavel.worker.agent import Agent
from tests.integration.harness import TIMING, sleeper_spec, wait_for

pytestmark = pytest.mark.integration


class World:
    def __init__(self, root: Path, ids: auth.Identities, server: NatsServer) -> None:
        self.root, self.ids, self.server = root, ids, server
        self.conns: list[Any] = []
        self.errors: dict[str, list[str]] = {}

    async def operator(self, name: str) -> Any:
        errors = self.errors.setdefault(name, [])

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc).lower())
        nc = await connect(self.server.url, str(self.ids.operators[name]), error_cb=on_error)
        self.conns.append(nc)
        return nc

    def refused(self, name: str, action: str, subject: str) -> bool:
        return any(f"permissions violation for {action} to \"{subject.lower()}\"" in e
                   for e in self.errors.get(name, []))


#: The nodes' response grant in this test's server config: a little over what the exec window
#: lets a node send between two of the operator's messages, far under what an answer needs.
GRANT = 48


@pytest.fixture
async def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[World]:
    monkeypatch.setattr(logstream, "REPLIES_MAX", GRANT)
    auth.init(tmp_path, ["a"])
    auth.add_operator(tmp_path, "reader", "read")
    ids = auth.add_operator(tmp_path, "writer", "write")
    server = NatsServer(store_dir=tmp_path / "js", config=ids.config, log=tmp_path / "nats.log")
    server.start()
    broker = Broker(Config(nats_url=server.url, state_dir=tmp_path / "state", timing=TIMING,
                           nats_options={"nkeys_seed": str(ids.broker)}))
    agent = Agent(nats_url=server.url, node_id="a", strategy=make_strategy("least-loaded"),
                  labels={}, state_dir=tmp_path / "workers" / "a", timing=TIMING,
                  cpu=4.0, memory_mb=4096, nats_options={"nkeys_seed": str(ids.nodes["a"])})
    w = World(tmp_path, ids, server)
    task: asyncio.Task[None] | None = None
    try:
        await broker.start()
        task = asyncio.create_task(agent.run())
        await wait_for(lambda: bool(broker.liveness.eligible(broker.now())), 15,
                       what="the worker heard")
        yield w
    finally:
        for nc in w.conns:
            if not nc.is_closed:
                await nc.close()
        await agent.stop()
        if task is not None:
            await asyncio.wait_for(task, 15)
        await broker.close()
        server.stop()


async def test_a_reader_reads_and_is_refused_every_write(world: World) -> None:
    reader = await world.operator("reader")
    assert operator_of(reader) == "reader"  # its inbox: _GAVEL_OP.reader
    await call(reader, "status", StatusRequest(), StatusReply)
    with pytest.raises(ClientError, match=r"NATS refused operator reader's submit: its role"):
        await call(reader, "submit", SubmitRequest(spec=sleeper_spec("no")), SubmitReply,
                   timeout=3)
    assert world.refused("reader", "publish", "gavel.api.submit.reader")
    # Nor under another's name, nor the shared operator's subject.
    for subject in ("gavel.api.submit.writer", "gavel.api.submit", "gavel.exec.a.reader",
                    "gavel.exec.a.writer"):
        await reader.publish(subject, b"x")
    await wait_for(lambda: all(world.refused("reader", "publish", s) for s in (
        "gavel.api.submit.writer", "gavel.api.submit", "gavel.exec.a.reader",
        "gavel.exec.a.writer")), 10, what="every forged publish refused")


async def test_no_operator_reads_another_operator_s_answers(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    reader = await world.operator("reader")
    writer = await world.operator("writer")
    for stolen in ("_GAVEL_OP.writer.>", "_INBOX.>", "_GAVEL_OP.>", ">"):
        await reader.subscribe(stolen)
    await wait_for(lambda: all(world.refused("reader", "subscription", s) for s in (
        "_GAVEL_OP.writer.>", "_INBOX.>", "_GAVEL_OP.>", ">")), 10,
        what="every subscription to another's inbox refused")
    heard: list[str] = []

    async def spy(msg: Any) -> None:
        heard.append(msg.subject)
    await reader.subscribe("_GAVEL_OP.writer.>", cb=spy)  # refused again: hears nothing
    reply = await call(writer, "submit", SubmitRequest(spec=sleeper_spec("mine")), SubmitReply)
    await call(writer, "status", StatusRequest(instance_id=reply.instance_id), StatusReply)
    assert heard == []
    assert "submit request from operator writer" in caplog.text  # the broker knows who
    said = await call(writer, "events", EventsRequest(instance_id=reply.instance_id, limit=0),
                      EventsReply)  # and so does the history
    assert [e.detail for e in said.events if e.type == "requested"] == [
        "submit by operator writer"]


async def test_a_writer_execs_and_the_node_knows_who(world: World) -> None:
    writer = await world.operator("writer")
    iid = (await call(writer, "submit", SubmitRequest(spec=sleeper_spec("x")),
                      SubmitReply)).instance_id

    async def running() -> bool:
        st = await call(writer, "status", StatusRequest(instance_id=iid), StatusReply)
        return st.instances[0].state == InstanceState.RUNNING
    await wait_for(running, 20, what="the instance running")
    out: list[ExecOutput] = []
    start = ExecStart(node_id="a", instance_id=iid, session=new_session(),
                      command=[sys.executable, "-c", "print('as writer')"])
    ended = await asyncio.wait_for(run(writer, start, out.append, operator="writer"), 30)
    assert ended.exit_code == 0 and b"".join(o.data for o in out) == b"as writer\n"

    async def exec_event() -> list[Any]:
        got = await call(writer, "events", EventsRequest(instance_id=iid, limit=0),
                         EventsReply)
        return [e for e in got.events if e.type == "exec"]
    await wait_for(lambda: _some(exec_event()), 15, what="the exec event")
    (event,) = await exec_event()
    assert event.detail.startswith("writer ran ")

    # More replies than the node's response grant allows one message (`GRANT` here): every
    # acknowledgement renews it, so nothing is lost under the server's real permissions.
    out.clear()
    code = ("import sys, time\nfor i in range(1500):\n    print(i, flush=True)\n"
            "    time.sleep(0.001)")
    start = ExecStart(node_id="a", instance_id=iid, session=new_session(),
                      command=[sys.executable, "-c", code])
    ended = await asyncio.wait_for(run(writer, start, out.append, operator="writer"), 120)
    assert ended.exit_code == 0
    assert b"".join(o.data for o in out).split() == [str(i).encode() for i in range(1500)]
    assert len(out) > GRANT  # past one grant: the acknowledgements renewed it
    assert [o.seq for o in out] == list(range(1, len(out) + 1))

    reader = await world.operator("reader")  # a reader's exec never reaches the node
    sneaky = ExecStart(node_id="a", instance_id=iid, session=new_session(),
                       command=["true"])
    with pytest.raises(ClientError, match=r"NATS refused operator reader's exec: its role"):
        await run(reader, sneaky, out.append, operator="reader", first_s=2)
    assert world.refused("reader", "publish", subjects.EXEC.format(node="a",
                                                                   operator="reader"))
    assert msgspec.json.encode(event)  # the event is an ordinary one


async def _some(events: Any) -> bool:
    return bool(await events)


async def test_an_http_api_on_a_reader_s_identity_refuses_a_write_with_403(world: World) -> None:
    from gavel.cli.api import app
    from tests.integration.httpclient import http

    server = await app.start(world.server.url, str(world.ids.operators["reader"]), port=0)
    try:
        status, _, _ = await http(server.port, "GET", "/v1/nodes")
        assert status == 200
        body = {"spec": msgspec.to_builtins(sleeper_spec("ro"))}
        status, _, said = await http(server.port, "POST", "/v1/instances", json_body=body)
        assert status == 403
        assert "NATS refused operator reader's submit" in msgspec.json.decode(said)["error"]
    finally:
        await server.close()


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_each_http_token_asks_as_its_own_operator(world: World) -> None:
    """`gavel auth operator add NAME --http-token`'s token: the API asks as NAME, so the
    broker's event names NAME, and a reader's token is refused a change before NATS is
    asked; a request with no named token is the API's own identity's."""
    from gavel.cli.api import app
    from gavel.cli.api.operators import token_of
    from tests.integration.httpclient import http

    auth_dir = world.ids.directory
    writer, reader = token_of(auth_dir, "writer"), token_of(auth_dir, "reader")
    assert token_of(auth_dir, "writer") == writer  # kept, not made again
    assert (auth_dir / "operators" / "writer.token").stat().st_mode & 0o077 == 0
    server = await app.start(world.server.url, str(world.ids.operator), port=0,
                             token="the-api-token", operators_dir=str(auth_dir))
    assert server.named == ["reader", "writer"]
    try:
        async def submit(token: str, name: str) -> tuple[int, Any]:
            status, _, said = await http(
                server.port, "POST", "/v1/instances", headers=_bearer(token),
                json_body={"spec": msgspec.to_builtins(sleeper_spec(name)),
                           "instance_id": name})
            return status, msgspec.json.decode(said)

        assert (await submit(writer, "by-writer"))[0] == 200
        assert (await submit("the-api-token", "by-api"))[0] == 200
        status, said = await submit(reader, "by-reader")
        assert status == 403 and said["error"].startswith("this token may only read")
        status, _, _ = await http(server.port, "GET", "/v1/nodes", headers=_bearer(reader))
        assert status == 200
        status, _, _ = await http(server.port, "GET", "/v1/nodes",
                                  headers=_bearer("not-a-token"))
        assert status == 401

        async def requested(iid: str) -> str:
            _, _, body = await http(server.port, "GET", f"/v1/events?instance_id={iid}",
                                    headers=_bearer("the-api-token"))
            got = [e["detail"] for e in msgspec.json.decode(body)["events"]
                   if e["type"] == "requested"]
            return got[0] if got else ""
        await wait_for(lambda: _some(requested("by-writer")), 15, what="the writer's event")
        assert await requested("by-writer") == "submit by operator writer"
        assert await requested("by-api") == f"submit by operator {subjects.OPERATOR}"
    finally:
        await server.close()
    # On loopback with no token of its own (`gavel up`'s), a named token still names its
    # operator; a request with none is the API's own.
    server = await app.start(world.server.url, str(world.ids.operator), port=0,
                             operators_dir=str(auth_dir))
    try:
        assert not server.token
        assert (await submit(writer, "by-writer-2"))[0] == 200
        assert (await submit(reader, "by-reader-2"))[0] == 403
        await wait_for(lambda: _some(requested("by-writer-2")), 15, what="the second event")
        assert await requested("by-writer-2") == "submit by operator writer"
    finally:
        await server.close()
