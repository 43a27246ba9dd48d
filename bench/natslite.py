"""A minimal NATS core client for the bench's agents: connect, subscribe, publish, ping.

Why: `gavel bench` runs 1,000 agents on the broker's own two cores, where on a cluster each
answers on its own host; what an agent spends there is CPU taken from the broker, its writer
and nats-server. nats-py hands every message through a parser, a `Msg` object, a queue and a
task, and every publish through a pending buffer and a flusher task: CPU every bid reply
pays, on the broker's cores (docs/performance.md). This client parses ``MSG`` frames in
`data_received` and calls the handler there and then; a publish is one `transport.write`.
The agents' code above it (their bids, `shared.strategies.answer`, the messages) is the
same whichever client carries it (``gavel bench --agent-client nats-py`` runs them on
nats-py, to compare the two). The real worker (`worker.agent`) speaks through nats-py:
reconnects, TLS, credentials.

Protocol (docs.nats.io, "Client protocol"): the server opens with ``INFO {json}``; the client
sends ``CONNECT {json}`` and ``PING``, and is connected at the first ``PONG``. ``SUB
<subject> <sid>``; ``PUB <subject> <n>\\r\\n<payload>``; the server delivers ``MSG <subject>
<sid> [reply] <n>\\r\\n<payload>\\r\\n`` (``HMSG`` with headers, which this client never asks
for), pings (answered with ``PONG``) and ``-ERR '<text>'``. No reconnects: a bench agent
whose connection drops is a failed run, and says so.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit

__all__ = ["LiteClient", "ProtocolError", "connect"]

Handler = Callable[[bytes], None]
#: The longest control line accepted (a MSG line holds a subject of at most a few hundred
#: bytes; an INFO can be a few KB).
MAX_LINE = 64 * 1024


class ProtocolError(Exception):
    """The server sent something this client cannot read, or an ``-ERR``."""


class LiteClient(asyncio.Protocol):
    def __init__(self, name: str) -> None:
        self.name = name
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._handlers: dict[bytes, Handler] = {}
        self._next_sid = 0
        self._pongs: list[asyncio.Future[None]] = []
        self._info: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed: asyncio.Future[Exception | None] = \
            asyncio.get_running_loop().create_future()
        self._closing = False
        #: Messages whose handler raised.
        self.handler_errors = 0

    # -- the API ----------------------------------------------------------------------------
    def subscribe(self, subject: str, handler: Handler) -> None:
        """`handler(payload)` for every message on `subject`, called as it is parsed."""
        self._next_sid += 1
        sid = str(self._next_sid).encode()
        self._handlers[sid] = handler
        self._write(b"SUB %s %s\r\n" % (subject.encode(), sid))

    def publish(self, subject: str, payload: bytes) -> None:
        self._write(b"PUB %s %d\r\n%s\r\n" % (subject.encode(), len(payload), payload))

    async def flush(self, timeout: float = 10.0) -> None:
        """Wait until the server has read everything sent so far (a PING's PONG)."""
        pong = asyncio.get_running_loop().create_future()
        self._pongs.append(pong)
        self._write(b"PING\r\n")
        await asyncio.wait_for(pong, timeout)

    def close(self) -> None:
        self._closing = True
        if self.transport is not None:
            self.transport.close()

    def _write(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionError(f"{self.name}: not connected")
        self.transport.write(data)

    # -- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio's: no isinstance check here.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        error = None if self._closing else (exc or ConnectionError(
            f"{self.name}: the server closed the connection"))
        self._abandon(error or ConnectionError(f"{self.name}: closed"))
        if not self.closed.done():
            self.closed.set_result(error)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos = 0
        try:
            while True:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    if len(buf) - pos > MAX_LINE:
                        raise ProtocolError(f"a control line longer than {MAX_LINE} bytes")
                    break
                if buf.startswith(b"MSG ", pos) or buf.startswith(b"HMSG ", pos):
                    args = bytes(buf[pos:end]).split()
                    size = int(args[-1])
                    start = end + 2
                    if len(buf) < start + size + 2:
                        break  # the payload has not all arrived: wait for more
                    # HMSG ... <header bytes> <total bytes>: the payload follows the headers.
                    skip = int(args[-2]) if args[0] == b"HMSG" else 0
                    payload = bytes(buf[start + skip:start + size])
                    pos = start + size + 2
                    handler = self._handlers.get(args[2])
                    if handler is not None:
                        self._call(handler, payload)
                    continue
                line = bytes(buf[pos:end])
                pos = end + 2
                self._control(line)
        except (ValueError, IndexError) as exc:
            self._fail(ProtocolError(f"unreadable frame from the server: {exc}"))
            return
        except ProtocolError as exc:
            self._fail(exc)
            return
        del buf[:pos]

    def _call(self, handler: Handler, payload: bytes) -> None:
        """A handler's error is the handler's: counted, the first one printed, the
        connection kept."""
        try:
            handler(payload)
        except Exception as exc:  # the bench reports it; the agent goes on
            self.handler_errors += 1
            if self.handler_errors == 1:
                print(f"{self.name}: a handler failed: {exc!r}", file=sys.stderr, flush=True)

    def _control(self, line: bytes) -> None:
        if line == b"PING":
            self._write(b"PONG\r\n")
        elif line == b"PONG":
            if self._pongs:
                fut = self._pongs.pop(0)
                if not fut.done():
                    fut.set_result(None)
        elif line.startswith(b"INFO "):
            if not self._info.done():
                json.loads(line[5:])  # must be JSON; nothing in it is needed here
                self._info.set_result(None)
        elif line.startswith(b"-ERR"):
            raise ProtocolError(f"server error: {line[5:].decode(errors='replace')}")
        elif line != b"+OK":
            raise ProtocolError(f"unexpected line {line[:80]!r}")

    def _abandon(self, exc: Exception) -> None:
        """Whoever waits for the INFO or a PONG hears `exc` (marked as heard: nobody may be
        waiting)."""
        for fut in (self._info, *self._pongs):
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()
        self._pongs.clear()

    def _fail(self, exc: Exception) -> None:
        self._abandon(exc)
        if not self.closed.done():
            self.closed.set_result(exc)
        if self.transport is not None:
            self.transport.abort()


async def connect(url: str, name: str, timeout: float = 10.0) -> LiteClient:
    """A connected client (``nats://host:port`` with no credentials: the bench's server)."""
    parts = urlsplit(url)
    if parts.scheme not in ("nats", "") or parts.username or parts.password:
        raise ValueError(f"{url!r}: the bench's client speaks plain nats://host:port only")
    loop = asyncio.get_running_loop()
    _, client = await asyncio.wait_for(loop.create_connection(
        lambda: LiteClient(name), parts.hostname or "127.0.0.1", parts.port or 4222), timeout)
    await asyncio.wait_for(client._info, timeout)
    options = {"verbose": False, "pedantic": False, "name": name, "lang": "python-lite",
               "version": "0", "protocol": 1, "headers": False, "no_responders": False}
    client._write(b"CONNECT %s\r\n" % json.dumps(options).encode())
    await client.flush(timeout)  # an auth or option error arrives as -ERR before the PONG
    return client
