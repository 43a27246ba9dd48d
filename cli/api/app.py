"""`gavel api` (and `gavel up`'s API): the HTTP API, an operator client of the NATS API.

Rules:
1. It listens on ``--api-addr`` (loopback by default) and ``--api-port`` (`DEFAULT_PORT`, or
   a free port when that one is taken and none was asked for; 0: a free one). Off loopback
   it requires a bearer token (the operator's, ``--api-token``/GAVEL_API_TOKEN, or one made at
   start and printed once); a token given on loopback is required there too (`ui.access`).
   With ``--api-tls-cert`` and ``--api-tls-key`` it speaks HTTPS only. A second token,
   ``--api-read-token``, is a reader's (`shared.roles`): its requests are served for the
   reading verbs and the event and log streams only, anything else 403 with a sentence. What
   the API may do at all is its NATS identity's (``--creds``: a named operator's role holds
   it to that).
   With ``--api-operators DIR``, each named operator's own token (`api.operators`) is served
   on a connection of that operator's identity: the broker's log and events name it, and its
   role holds it as it holds that operator's CLI (a reader's token is refused a writing
   route as the read token is).
2. Each request is one verb of the NATS API through `gavel.client.Client` on the server's
   own connection, or its operator's (`routes`); the answer is the reply struct as JSON, or
   `ApiError` with the status `errors` gives it. Bad input is refused before the cluster is
   asked (400, 411, 413, 415), with one sentence; nothing a client sends makes a 500.
3. ``/openapi.json`` is the document `openapi` makes; ``/v1/...`` the routes.
4. The streaming routes write server-sent events: ``/v1/events/stream`` the events kept,
   then each new one (subscribed before the kept ones are asked for, and a new one already
   among those is not sent twice), each new one with its sequence in the event history as
   its ``id:``; a request with ``Last-Event-ID`` (a reconnecting client's) gets instead
   every event stored after that one, in order, each once, then each new one;
   ``/v1/instances/ID/logs`` the output's chunks, then ``done``. A failure after the stream
   has begun is an ``error`` event with the sentence; an idle stream gets a comment every
   `KEEPALIVE_S`.
5. ``POST /v1/instances/ID/exec`` runs a command inside the running instance as `gavel exec`
   does without a terminal (`Client.exec`: the node's limits, its ``exec`` event naming the
   operator who asked): its body's ``stdin`` is the command's whole input, its output comes
   as ``output`` events (`ExecOutput`), then one ``exit`` (`ExecExit`: the exit status, or
   why the session ended it). The client going away hangs up: the node kills the command.
   A reader may not (403), as with every change; the streams of events and logs it may.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from gavel.cli.api import errors, operators
from gavel.cli.api.openapi import document
from gavel.cli.api.options import DEFAULT_PORT
from gavel.cli.api.routes import BODY_MAX, BadRequest, Route, build, find
from gavel.cli.ui import access
from gavel.cli.ui.http import Policy, Request, Response, Server, Sse, Stream
from gavel.client import BrokerRefused, Client, ClientError, NoAnswer, NoBroker, NotAllowed
from gavel.shared import subjects
from gavel.shared.api import InstanceStatus
from gavel.shared.errors import BadInput
from gavel.shared.execstream import CHUNK_MAX, ExecOutput, ExecRequest
from gavel.shared.logstream import LogsDone, LogsRequest
from gavel.shared.messages import ApiError
from gavel.shared.roles import READ_VERBS
from gavel.shared.timing import Timing

__all__ = ["KEEPALIVE_S", "ApiServer", "ApiUnavailable", "run", "start"]

#: Rule 4.
KEEPALIVE_S = Timing().keepalive_s
#: The header a reconnecting event-stream client sends: the last ``id:`` it heard (rule 4).
LAST_EVENT_ID = "last-event-id"
_JSON = "application/json"
#: The streams a reader may open (rule 5: exec is a writer's).
_READ_STREAMS = frozenset({"events", "logs"})
_enc = msgspec.json.Encoder()


class ApiUnavailable(BadInput):
    """The API cannot listen where it was asked to, or its TLS files are unusable (exit 2)."""


def _error(status: int, sentence: str) -> Response:
    return Response(status, errors.body(sentence), _JSON)


#: Rule 2: what the server itself refuses, in the API's own JSON.
POLICY = Policy(methods=frozenset({"GET", "HEAD", "POST", "PUT", "DELETE"}), body_max=BODY_MAX,
                render=_error, sentences={
    400: "not an HTTP request, or a Content-Length that is not a number",
    401: "this API needs its token: send Authorization: Bearer TOKEN",
    403: "this API answers only to this machine's own names (give it a token to serve "
         "others)",
    405: "this API takes GET, HEAD, POST, PUT and DELETE",
    411: "a request body must come with a Content-Length (chunked bodies are not read)",
    413: f"the request body is larger than this API reads ({BODY_MAX} bytes)",
    431: "request head too large",
})


class Handler:
    """Rules 2-5."""

    def __init__(self, client: Client, operators: Mapping[str, Client] | None = None) -> None:
        self.client = client
        #: Each named operator's client, by name (rule 1).
        self.operators = dict(operators or {})
        self.openapi = _enc.encode(document())

    async def __call__(self, req: Request) -> Response | Stream:
        if req.path == "/openapi.json" and req.method in ("GET", "HEAD"):
            return Response(200, self.openapi, _JSON)
        found = find(req.method, req.path)
        if isinstance(found, int):
            return _error(found, f"no such route: {req.method} {req.path}" if found == 404
                          else f"{req.path} does not take {req.method}")
        route, params = found
        if req.reader and route.verb not in READ_VERBS and route.verb not in _READ_STREAMS:
            return _error(403, f"this token may only read: {route.method} {route.path} "
                          "changes the cluster (give the API's full token)")
        try:
            request = build(route, params, req.query, req.headers, req.body)
        except BadRequest as exc:
            return _error(exc.status, str(exc))
        client = self.operators.get(req.operator, self.client)
        if route.stream:
            return await self._stream(client, route, request,
                                      req.headers.get(LAST_EVENT_ID, ""))
        try:
            reply = await route.ask(client, request)
        except ClientError as exc:
            return _error(_status(exc), str(exc))
        return Response(200, _enc.encode(reply), _JSON)

    async def _stream(self, client: Client, route: Route, request: Any, last_id: str = ""
                      ) -> Response | Stream:
        if isinstance(request, ExecRequest):
            return await self._exec_stream(client, request)
        if isinstance(request, LogsRequest):
            node = await _node_of(client, request.instance_id, request.node_id, _ran)
            if isinstance(node, Response):
                return node
            return Stream(lambda sse: self._logs(sse, client, msgspec.structs.replace(
                request, node_id=node)))
        if last_id:  # rule 4: resumed from the history, nothing kept sent again
            if not last_id.isdigit() or len(last_id) > 19:
                return _error(400, "Last-Event-ID must be the id of an event this stream "
                              "sent (a sequence number)")
            resumed = await client.follow_events(request.instance_id, after=int(last_id))
            return Stream(lambda sse: self._events(sse, resumed, []), abandon=resumed.aclose)
        feed = await client.follow_events(request.instance_id)
        try:
            kept = await client.events(request.instance_id, limit=request.limit,
                                       since=request.since)
        except ClientError as exc:
            await feed.aclose()
            return _error(_status(exc), str(exc))
        return Stream(lambda sse: self._events(sse, feed, kept.events), abandon=feed.aclose)

    async def _events(self, sse: Sse, feed: Any, kept: list[Any]) -> None:
        """Rule 4."""
        seen = {_enc.encode(e) for e in kept}
        try:
            for e in kept:
                await sse.send("event", _enc.encode(e))
            it = aiter(feed)
            while True:
                try:
                    async with asyncio.timeout(KEEPALIVE_S):
                        e = await anext(it)
                except TimeoutError:
                    await sse.comment()
                    continue
                except StopAsyncIteration:
                    return
                data = _enc.encode(e)
                if seen and data in seen:
                    seen.discard(data)
                    continue
                seq = getattr(feed, "last", 0)  # 0: no history to resume from
                await sse.send("event", data, str(seq) if seq else "")
        finally:
            await feed.aclose()

    async def _exec_stream(self, client: Client, request: ExecRequest) -> Response | Stream:
        """Rule 5: the instance's node found first (a refusal is an answer of its own), then
        the session, streamed."""
        node = await _node_of(client, request.instance_id, request.node_id, _running)
        if isinstance(node, Response):
            return node

        async def stdin() -> AsyncIterator[bytes]:
            for at in range(0, len(request.stdin), CHUNK_MAX):
                yield request.stdin[at:at + CHUNK_MAX]

        async def run(sse: Sse) -> None:
            async def out(chunk: ExecOutput) -> None:
                await sse.send("output", _enc.encode(chunk))
            try:
                ended = await client.exec(request.instance_id, list(request.command),
                                          on_output=out, stdin=stdin(), node_id=node,
                                          timeout_s=request.timeout_s)
            except ClientError as exc:
                await sse.send("error", _enc.encode(ApiError(error=str(exc))))
                return
            await sse.send("exit", _enc.encode(ended))
        return Stream(run)

    async def _logs(self, sse: Sse, client: Client, request: LogsRequest) -> None:
        """Rule 4. The next chunk is awaited beside the keep-alive, never cancelled by it:
        cancelling the iterator's step would end the read."""
        chunks = aiter(client.logs(
            request.instance_id, node_id=request.node_id, streams=request.streams,
            tail=request.tail, since=request.since, follow=request.follow))
        step: asyncio.Future[Any] | None = None
        try:
            while True:
                if step is None:
                    step = asyncio.ensure_future(anext(chunks))
                done, _ = await asyncio.wait({step}, timeout=KEEPALIVE_S)
                if not done:
                    await sse.comment()
                    continue
                got, step = step.result(), None
                await sse.send("done" if isinstance(got, LogsDone) else "chunk",
                               _enc.encode(got))
        except StopAsyncIteration:
            return
        except ClientError as exc:
            await sse.send("error", _enc.encode(ApiError(error=str(exc))))
        finally:
            if step is not None:
                step.cancel()
                with contextlib.suppress(BaseException):
                    await step
            with contextlib.suppress(Exception):
                await chunks.aclose()  # type: ignore[attr-defined]


def _status(exc: ClientError) -> int:
    """`errors` rule 2."""
    if isinstance(exc, BrokerRefused):
        return errors.status_for(str(exc))
    if isinstance(exc, NotAllowed):  # the API's own NATS identity may not (its role)
        return 403
    if isinstance(exc, NoBroker):
        return 503
    if isinstance(exc, NoAnswer):
        return 504
    return 502


@dataclass
class ApiServer:
    """A running HTTP API: where it listens, its token, what to close."""

    addr: str
    port: int
    token: str
    token_made: bool
    tls: bool
    server: Server
    client: Client
    #: Each named operator's client (rule 1), and their names.
    operators: list[Client] = field(default_factory=list)
    named: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        host = self.addr
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        if ":" in host:
            host = f"[{host}]"
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}/"

    def announce(self) -> str:
        """The address, the token once when the server made it, and whose own tokens it
        takes (rule 1)."""
        named = f"; named operators' own tokens: {', '.join(self.named)}" if self.named else ""
        if self.token_made:
            return f"{self.url} (bearer token {self.token}{named})"
        if self.token:
            return f"{self.url} (it asks for the token given with --api-token{named})"
        return self.url + (f" ({named[2:]})" if named else "")

    async def close(self) -> None:
        await self.server.close()
        for c in (self.client, *self.operators):
            await c.close()


def _tls(cert: str, key: str) -> ssl.SSLContext | None:
    if not cert and not key:
        return None
    if not (cert and key):
        raise ApiUnavailable("--api-tls-cert and --api-tls-key go together: give both")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ApiUnavailable(f"cannot use the TLS certificate {cert} with key {key}: "
                             f"{getattr(exc, 'strerror', None) or exc}") from None
    return ctx


async def _listen(server: Server, addr: str, port: int | None,
                  tls: ssl.SSLContext | None) -> int:
    try:
        return await server.start_at(addr, port, DEFAULT_PORT, tls)
    except OSError as exc:
        what = f"port {port}" if port else "a port"
        raise ApiUnavailable(f"the HTTP API cannot listen on {addr}, {what}: "
                             f"{exc.strerror or exc}") from None


async def start(nats_url: str, creds: str | None, *, addr: str = "127.0.0.1",
                port: int | None = None, token: str = "", tls_cert: str = "",
                tls_key: str = "", read_token: str = "", operators_dir: str = ""
                ) -> ApiServer:
    """An HTTP API for the cluster at `nats_url`, listening until `ApiServer.close`."""
    tls = _tls(tls_cert, tls_key)
    required = access.token_for(addr, token) or (access.make_token() if read_token else "")
    named = operators.load(Path(operators_dir)) if operators_dir else []
    client = await _connect(nats_url, creds)
    clients: dict[str, Client] = {}
    server = None
    try:
        for op in named:  # rule 1: each named operator asks as itself
            clients[op.name] = await _connect(  # as its name, whatever GAVEL_OPERATOR says
                nats_url, str(op.creds), inbox_prefix=subjects.operator_inbox(op.name))
        server = Server(Handler(client, clients), required, POLICY, read_token=read_token,
                        operators={op.token: (op.name, op.reader) for op in named})
        bound = await _listen(server, addr, port, tls)
    except BaseException:
        if server is not None:
            await server.close()
        for c in (client, *clients.values()):
            await c.close()
        raise
    return ApiServer(addr=addr, port=bound, token=required,
                     token_made=bool(required) and not token, tls=tls is not None,
                     server=server, client=client, operators=list(clients.values()),
                     named=list(clients))


async def _connect(nats_url: str, creds: str | None, **options: Any) -> Client:
    return await Client.connect(nats_url, creds, allow_reconnect=True,
                                max_reconnect_attempts=-1, reconnect_time_wait=1, **options)


async def run(args: argparse.Namespace) -> int:
    """`gavel api`: serve the HTTP API until SIGTERM or Ctrl-C."""
    api = await start(args.nats, args.creds, addr=args.api_addr, port=args.api_port,
                      token=args.api_token, tls_cert=args.api_tls_cert,
                      tls_key=args.api_tls_key, read_token=args.api_read_token,
                      operators_dir=args.api_operators)
    try:
        print(f"gavel api: HTTP API at {api.announce()}; its OpenAPI document at "
              f"{api.url}openapi.json   (Ctrl-C stops it)", flush=True)
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, done.set)
        await done.wait()
        return 0
    finally:
        with contextlib.suppress(Exception):
            await api.close()


async def _node_of(client: Client, instance_id: str, given: str,
                   unfit: Callable[[InstanceStatus], str]) -> str | Response:
    """The node a stream is asked of: `given`, else the instance's own - a 409 with
    `unfit`'s sentence where it has none to ask (a refusal is an answer of its own)."""
    if given:
        return given
    try:
        inst = await client.instance(instance_id)
    except ClientError as exc:
        return _error(_status(exc), str(exc))
    why = unfit(inst)
    return _error(409, why) if why else inst.node_id


def _ran(inst: InstanceStatus) -> str:
    return "" if inst.node_id else (f"{inst.instance_id} has not run on a node yet "
                                    f"({inst.state}): it has no output")


def _running(inst: InstanceStatus) -> str:
    return "" if inst.node_id and inst.state == "running" else (
        f"{inst.instance_id} is not running ({inst.state}): nothing to exec into")
