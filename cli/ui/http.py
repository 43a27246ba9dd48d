"""A small HTTP/1.1 server on asyncio streams: the dashboard's pages, JSON and event streams.

Rules:
1. Read-only by default: GET and HEAD are served, every other method is 405 (`Policy`
   names the methods a server takes). One request per connection (``Connection: close``); a
   request head larger than `HEAD_MAX` is 431, one not read within `HEAD_S` is dropped. A
   body is read only where the policy allows one: up to `Policy.body_max` bytes, announced
   by Content-Length (none: 411; more: 413), and within `HEAD_S`.
2. Every response carries a Content-Security-Policy that lets the page load scripts, styles
   and data from this server only, and no-store caching: the page works with no internet
   and nothing it shows outlives the page.
3. A `Stream` answer is server-sent events: the server writes its headers, then hands the
   stream to the answer, which writes ``event:``/``data:`` frames until it returns or the
   browser goes away (the connection reads end-of-file): the answer is then cancelled, so
   nothing keeps working for a page that is closed.
5. Closing the server ends every connection still open (an event stream never ends of
   itself): each one's task is cancelled and ends quietly, as a connection the browser
   closed does, so a dashboard stopped with pages open prints nothing.
4. Access (`access` rules) is checked before any route: 401 without the token, 403 for a
   Host that is not this machine's when there is no token. Every refusal the server makes
   itself is one sentence, rendered by the policy (plain text for the dashboard).
6. With an `ssl.SSLContext` the server speaks HTTPS only.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from gavel.cli.ui import access
from gavel.shared.timing import Timing

__all__ = ["DASHBOARD", "HEAD_MAX", "HEAD_S", "Policy", "Request", "Response", "Server",
           "Stream"]

log = logging.getLogger("gavel.ui")

#: The largest request head read, and how long a client may take to send it (rule 1).
HEAD_MAX = 16 * 1024
#: Connections waiting to be accepted (asyncio's own default).
_BACKLOG = 100
HEAD_S = Timing().head_s
#: What a refused body may still send before the connection is closed (`_linger`).
LINGER_MAX = 64 * 1024 * 1024
#: Rule 2.
SECURITY = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    #: Lower-cased names; a repeated header keeps its first value.
    headers: dict[str, str]
    body: bytes = b""
    #: Admitted on the server's read token (`Server.read_token`), not its full one.
    reader: bool = False
    #: Admitted on a named operator's token (`Server.operators`): that operator's name.
    operator: str = ""


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)


class Sse:
    """The writing end of an event stream (rule 3)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    async def send(self, event: str, data: bytes, id: str = "") -> None:
        """One frame; `data` is one line of JSON (it holds no newline); with `id`, the frame's
        id, which a client that reconnects sends back as ``Last-Event-ID``."""
        head = b"id: " + id.encode() + b"\n" if id else b""
        self._writer.write(head + b"event: " + event.encode() + b"\ndata: " + data + b"\n\n")
        await self._writer.drain()

    async def comment(self) -> None:
        """A frame the browser ignores: it finds out early that the connection is gone."""
        self._writer.write(b": keep-alive\n\n")
        await self._writer.drain()


@dataclass
class Stream:
    """An answer of server-sent events: `run` writes frames until it returns. `abandon`
    releases what the answer holds when it never gets to run (the client went first)."""

    run: Callable[[Sse], Awaitable[None]]
    abandon: Callable[[], Awaitable[None]] | None = None


Handler = Callable[[Request], Awaitable[Response | Stream]]


def _text(status: int, sentence: str) -> Response:
    return Response(status, sentence.encode() + b"\n")


@dataclass(frozen=True)
class Policy:
    """What a server takes (rule 1) and how it says no (rule 4)."""

    methods: frozenset[str] = frozenset({"GET", "HEAD"})
    #: Bytes of body a request may carry (0: none is read).
    body_max: int = 0
    #: The sentence of each refusal the server makes itself, by status.
    sentences: Mapping[int, str] = field(default_factory=dict)
    render: Callable[[int, str], Response] = _text

    def refuse(self, status: int, headers: Mapping[str, str] | None = None) -> Response:
        resp = self.render(status, self.sentences.get(status, HTTPStatus(status).phrase))
        resp.headers.update(headers or {})
        return resp


#: The dashboard's: read-only, its sentences in plain text.
DASHBOARD = Policy(sentences={
    400: "not an HTTP request",
    401: "this dashboard needs its token: open the URL `gavel ui` printed (it ends in "
         "?token=...)",
    403: "this dashboard answers only to this machine's own names",
    405: "the dashboard is read-only",
    431: "request head too large",
})


def listening(addr: str, port: int) -> socket.socket:
    """A non-blocking TCP socket listening on `addr`'s first address and `port` (as asyncio's
    own: address reuse, IPv6 only on an IPv6 address); OSError if it cannot."""
    family, kind, proto, _, sockaddr = socket.getaddrinfo(
        addr or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(sockaddr)
        sock.listen(_BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class Server:
    """Serves `handler` on (addr, port) to whoever holds `token` (rule 4)."""

    def __init__(self, handler: Handler, token: str, policy: Policy = DASHBOARD,
                 read_token: str = "",
                 operators: Mapping[str, tuple[str, bool]] | None = None) -> None:
        self.handler = handler
        self.token = token
        #: A second token whose requests are marked `Request.reader` (the handler decides
        #: what a reader may do); only beside a full `token`.
        self.read_token = read_token if token else ""
        #: Named operators' bearer tokens: each token's operator and whether it only reads
        #: (`Request.operator`, `Request.reader`). Without a full `token` (on loopback) a
        #: request bearing none is still served, as the server's own.
        self.operators = dict(operators or {})
        self.policy = policy
        self.port = 0
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[Any]] = set()
        self._closing = False

    async def start(self, addr: str, port: int, tls: ssl.SSLContext | None = None) -> int:
        """Listen on `addr`'s first address; the port listened on (`port` 0: a free one).
        OSError if it cannot. The socket is bound and listening before the loop takes it:
        uvloop answers a listen that fails (another process took the port between its bind
        and its listen: two `gavel up`s starting side by side) by closing the server rather
        than raising, and the caller's fall-back to a free port never heard of it."""
        sock = listening(addr, port)
        try:
            self._server = await asyncio.start_server(self._client, sock=sock,
                                                      limit=HEAD_MAX, ssl=tls)
        except BaseException:
            sock.close()
            raise
        self.port = int(sock.getsockname()[1])
        return self.port

    async def start_at(self, addr: str, port: int | None, default: int,
                       tls: ssl.SSLContext | None = None) -> int:
        """`start` on `port`, or with none given on `default`, and on a free port when another
        process holds that; OSError if it cannot."""
        try:
            return await self.start(addr, default if port is None else port, tls)
        except OSError as exc:
            if port is None and exc.errno == errno.EADDRINUSE:
                return await self.start(addr, 0, tls)
            raise

    async def close(self) -> None:
        """Rule 5."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for task in list(self._clients):
            task.cancel()
        for task in list(self._clients):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._clients.add(task)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        except asyncio.CancelledError:
            # Rule 5: asyncio's server reads a cancelled connection's task as an error.
            if not self._closing:
                raise
        except Exception:  # a bug in one answer must not take the dashboard down
            log.exception("the dashboard failed to answer a request")
        finally:
            if task is not None:
                self._clients.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        policy = self.policy
        try:
            async with asyncio.timeout(HEAD_S):
                head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.LimitOverrunError, ValueError):
            await _write(writer, policy.refuse(431))
            return
        req = _parse(head)
        if req is None:
            await _write(writer, policy.refuse(400))
            return
        if req.method not in policy.methods:
            await _write(writer, policy.refuse(405, {"Allow": ", ".join(sorted(
                policy.methods))}))
            return
        named = access.bearer_among(self.operators, req.headers)
        if named:
            name, reads = self.operators[named]
            req = dataclasses.replace(req, operator=name, reader=reads)
        elif not access.authorized(self.token, self.port, req.headers, req.query):
            if not (self.read_token and access.authorized(self.read_token, self.port,
                                                           req.headers, req.query)):
                await _write(writer, policy.refuse(401, {"WWW-Authenticate": "Bearer"}))
                return
            req = dataclasses.replace(req, reader=True)
        if not self.token and not access.host_is_loopback(req.headers.get("host", "")):
            await _write(writer, policy.refuse(403))
            return
        if policy.body_max and req.method not in ("GET", "HEAD"):
            body = await _body(reader, req, policy.body_max)
            if isinstance(body, int):
                await _write(writer, policy.refuse(body))
                await _linger(reader, writer)
                return
            req = dataclasses.replace(req, body=body)
        answer = await self.handler(req)
        if isinstance(answer, Response):
            await _write(writer, answer, head_only=req.method == "HEAD")
            return
        await _stream(reader, writer, answer)


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """After refusing a body unread: say we are done writing, then read and drop what the
    client is still sending (up to `LINGER_MAX` bytes, for up to `HEAD_S`), so closing does
    not reset the connection before the client has read the refusal."""
    with contextlib.suppress(OSError, RuntimeError):
        if writer.can_write_eof():
            writer.write_eof()
    dropped = 0
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(HEAD_S):
            while dropped < LINGER_MAX and (got := await reader.read(64 * 1024)):
                dropped += len(got)


async def _body(reader: asyncio.StreamReader, req: Request, most: int) -> bytes | int:
    """Rule 1: the request's body, or the status that refuses it."""
    if "transfer-encoding" in req.headers:
        return 411
    text = req.headers.get("content-length", "0")
    if not text.isdigit():
        return 400
    length = int(text)
    if length > most:
        return 413
    if not length:
        return b""
    async with asyncio.timeout(HEAD_S):
        return await reader.readexactly(length)


def _parse(head: bytes) -> Request | None:
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        return None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return None
    method, target, _ = parts
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers.setdefault(name.strip().lower(), value.strip())
    url = urlsplit(target)
    return Request(method=method, path=unquote(url.path), headers=headers,
                   query=dict(parse_qsl(url.query)))


def _head(status: int, headers: dict[str, str]) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    lines = [f"HTTP/1.1 {status} {phrase}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _write(writer: asyncio.StreamWriter, resp: Response, head_only: bool = False) -> None:
    headers = {**SECURITY, "Content-Type": resp.content_type,
               "Content-Length": str(len(resp.body)), "Connection": "close", **resp.headers}
    writer.write(_head(resp.status, headers) + (b"" if head_only else resp.body))
    await writer.drain()


async def _stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  answer: Stream) -> None:
    """Rule 3."""
    try:
        writer.write(_head(200, {**SECURITY, "Content-Type": "text/event-stream",
                                 "Connection": "close", "X-Accel-Buffering": "no"}))
        writer.write(b"retry: 2000\n\n")
        await writer.drain()
    except BaseException:
        if answer.abandon is not None:
            await answer.abandon()
        raise
    running = asyncio.ensure_future(answer.run(Sse(writer)))
    gone = asyncio.ensure_future(reader.read(1))  # a browser sends nothing more: EOF is gone
    try:
        await asyncio.wait({running, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (running, gone):
            task.cancel()
        for task in (running, gone):
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await task
