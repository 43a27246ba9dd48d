"""Putting the broker's queued messages on the wire: a batch of PUB frames, one hand-over.

Rules:
1. Messages go out in the order they were queued, each exactly as nats-py's `publish` would
   frame it (``PUB <subject> <size>\\r\\n<payload>\\r\\n``, no reply subject, no headers).
2. The broker publishes several messages a placement (RFB shares, the award, events, the
   KV mirror). nats-py's `publish` checks, frames and kicks the flusher on every call;
   framing a batch here and handing it to the client as one pending write is several times
   cheaper a message (`gavel bench` measures it, tests/integration/test_wire.py checks it:
   docs/performance.md). That hand-over uses the client's internal `_send_command` /
   `_flush_pending` (stable across nats-py 2.x); `fast(nc)` says whether this client has
   them, and a test pins it for the installed nats-py so an upgrade that drops them is
   noticed, not silently slower.
3. Whatever the batch path cannot vouch for goes through `publish`, which raises what is
   wrong: a client without those internals, not connected (reconnecting: its buffer
   limits apply), closed or draining, a subject that is empty or holds whitespace (a
   frame injection), a payload over the server's limit. Failures are handed to `failed`.
4. Inbound, the broker's busiest subscriptions (bid replies, reports, heartbeats: a few a
   placement, one from every node a broadcast round) are handled as nats-py's parser hands
   each message over (`Client.subscribe_direct`), not through a `Msg`, a queue and the
   subscription's task, whose object and wake-up are a large share of a message's cost
   (docs/performance.md). Handlers are plain functions that never wait and never raise
   (`transport.inbound` refuses what they cannot serve); one that raises all the same is a
   bug, logged with its traceback at most once a minute per subject, and the next message
   is handled. A client whose `_process_msg` is not the one this was written against
   (`DIRECT`) subscribes them the ordinary way. The client's parser cuts their MSG frames
   off what was read and hands each over itself (`_DirectParser`), without a coroutine and
   a regular expression a message; anything else, from its first frame on, is nats-py's
   parser's (tests/unit/test_direct_parser.py splits a stream every way against it).
5. `write_now` puts a batch on the socket there and then, behind what the client already
   holds (its pending buffer first: order is kept), instead of handing it to nats-py's
   flusher task, which writes it a loop turn or two later (the broker's sender writes its
   batches this way). An auction's RFB shares go out this way as the round opens: the
   round's clock is running, and under load a loop turn or two is time it counts before any
   node has been asked, at the tail a long time (docs/performance.md). Only what rule 3 would
   let through, and only while the socket is keeping up (less than `WRITE_NOW_MAX_BUFFERED`
   unsent in the transport, and not closing: a server that drops the connection closes the
   socket before the client knows, and a write there is lost, or raises under uvloop);
   otherwise the caller sends it the usual way, which waits for the socket to drain, or
   for the reconnect.
6. `subscribed(nc)` returns once the server holds every subscription `nc` has asked for.
   `flush()` does not promise that: nats-py writes its PING straight to the socket, ahead of
   SUBs still waiting in the client's pending buffer for its flusher task, so the PONG can
   come back before the server has read them, and a message another connection publishes
   in that moment reaches no one (tests/integration/test_wire.py shows the order on the
   socket). A message to ourselves, published after them, travels behind them.
7. `abort(nc)` closes a connection without sending what it still holds: a broker that no
   longer leads says nothing more (`broker.ha`). Its subscriptions end with it.
8. `send_replied` hands over messages with headers and a reply subject or none (the event
   history's stores, `broker.events`: two or three a placement, most of them unanswered)
   as one batch, each an HPUB frame exactly as nats-py's `publish(subject, payload, reply,
   headers)` frames it, when the batch path vouches for every one (rule 3); otherwise it
   sends nothing and says so, and the caller publishes each.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.aio.transport import TcpTransport
from nats.protocol.parser import AWAITING_CONTROL_LINE, MAX_CONTROL_LINE_SIZE, Parser

from gavel.shared.timing import Timing
from gavel.transport.inbound import Received
from gavel.transport.rejects import Throttle

__all__ = ["DIRECT", "Client", "Inbound", "Received", "abort", "fast", "header_block", "send",
           "send_replied", "subscribed", "write_now"]

log = logging.getLogger("gavel.broker")
_TIMING = Timing()


class Inbound(NamedTuple):
    """A message as a direct subscription hands it over (`transport.inbound.Received`)."""

    subject: str
    data: bytes
    reply: str = ""
    #: The raw header block (``NATS/1.0...``), or None: gavel's own messages have none.
    headers: bytes | None = None


Handler = Callable[[Received], None]

#: nats-py's parser hands each message to ``_process_msg(sid, subject, reply, data,
#: headers)``; direct subscriptions hook in there (rule 4).
DIRECT = list(inspect.signature(NatsClient._process_msg).parameters) == [
    "self", "sid", "subject", "reply", "data", "headers"]


def fast(nc: Any) -> bool:
    """Whether `nc` offers the internals a batch hand-over needs."""
    return callable(getattr(nc, "_send_command", None)) \
        and callable(getattr(nc, "_flush_pending", None)) \
        and hasattr(nc, "_flush_queue") and isinstance(getattr(nc, "stats", None), dict)


#: What nats-py's `publish` takes as a header's key (rule 8).
_HEADER_KEY = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")

#: Where a MSG line's end is looked for (rule 4): past it, nats-py's parser decides.
_LINE_MAX = MAX_CONTROL_LINE_SIZE

#: Unsent bytes in the transport above which `write_now` declines (rule 5).
WRITE_NOW_MAX_BUFFERED = 1 << 20


def write_now(nc: Any, batch: Sequence[tuple[str, bytes]]) -> bool:
    """Rule 5: `batch` written to the socket now; False: nothing was done (use `send`)."""
    if not batch:
        return True
    if not (fast(nc) and nc.is_connected) or nc.is_draining_pubs:
        return False
    transport = getattr(nc, "_transport", None)
    writer = getattr(transport, "_io_writer", None)
    if not isinstance(transport, TcpTransport) or writer is None \
            or not isinstance(getattr(nc, "_pending", None), list) \
            or writer.transport.is_closing() \
            or writer.transport.get_write_buffer_size() > WRITE_NOW_MAX_BUFFERED:
        return False  # a socket the server closed before the client noticed: publish's way
    limit = nc.max_payload
    frames: list[bytes] = []
    for subject, payload in batch:
        frame = _frame(subject, payload, limit)
        if frame is None:
            return False
        frames.append(frame)
    writer.writelines([*nc._pending, b"".join(frames)])
    nc._pending = []
    nc._pending_data_size = 0
    nc.stats["out_msgs"] += len(frames)
    nc.stats["out_bytes"] += sum(len(payload) for _, payload in batch)
    return True


async def send(nc: Any, batch: Sequence[tuple[str, bytes]],
               failed: Callable[[str, Exception], None]) -> None:
    """Publish `batch` in order; a message that cannot go is handed to `failed`."""
    if not batch:
        return
    if not (fast(nc) and nc.is_connected) or nc.is_draining_pubs:
        await _one_by_one(nc, batch, failed)
        return
    limit = nc.max_payload
    frames: list[bytes] = []
    size = 0
    for i, (subject, payload) in enumerate(batch):
        frame = _frame(subject, payload, limit)
        if frame is None:
            await _hand_over(nc, frames, size)  # what came before it goes first
            frames, size = [], 0
            await _one_by_one(nc, batch[i:i + 1], failed)
            continue
        frames.append(frame)
        size += len(payload)
    await _hand_over(nc, frames, size)


def _frame(subject: str, payload: bytes, limit: int) -> bytes | None:
    """The PUB frame rule 1 means, or None for what only `publish` may try (rule 3)."""
    if len(payload) > limit or not _good_subject(subject):
        return None
    return b"PUB %s %d\r\n%s\r\n" % (subject.encode(), len(payload), payload)


def header_block(headers: dict[str, str]) -> bytes | None:
    """Rule 8: the header block nats-py's `publish` builds for `headers` (``NATS/1.0``, a
    line a header, an empty line), or None for a key or value it would change or refuse
    (empty, whitespace around it or in a key, a control character)."""
    lines = [b"NATS/1.0\r\n"]
    for key, value in headers.items():
        if not _HEADER_KEY.fullmatch(key) or not value.isprintable() or value != value.strip():
            return None
        lines.append(b"%s: %s\r\n" % (key.encode(), value.encode()))
    lines.append(b"\r\n")
    return b"".join(lines)


async def send_replied(nc: Any, batch: Sequence[tuple[str, str, bytes, bytes]]) -> bool:
    """Rule 8: each (subject, reply or "" for none, header block, payload) of `batch`
    handed over in one, in order; False: nothing was sent (publish each)."""
    if not batch:
        return True
    if not (fast(nc) and nc.is_connected) or nc.is_draining_pubs:
        return False
    limit = nc.max_payload
    frames: list[bytes] = []
    size = 0
    for subject, reply, head, payload in batch:
        if len(payload) > limit or not _good_subject(subject) or \
                (reply and not _good_subject(reply)):
            return False
        frames.append(b"HPUB %s %s %d %d\r\n%s%s\r\n" % (  # no reply: two spaces, as nats-py
            subject.encode(), reply.encode(), len(head), len(head) + len(payload), head,
            payload))
        size += len(payload)
    await _hand_over(nc, frames, size)
    return True


def _good_subject(subject: str) -> bool:
    """What nats-py refuses in a subject it publishes to: empty, or any whitespace (CR/LF
    above all: they would end the frame and start another command). Printable and no space
    is that, or stricter (no other control character either), and far cheaper than a regex."""
    return bool(subject) and subject.isprintable() and " " not in subject


async def _hand_over(nc: Any, frames: list[bytes], size: int) -> None:
    if not frames:
        return
    nc.stats["out_msgs"] += len(frames)
    nc.stats["out_bytes"] += size
    await nc._send_command(b"".join(frames))
    if nc._flush_queue is not None and nc._flush_queue.empty():
        await nc._flush_pending()


async def _one_by_one(nc: Any, batch: Sequence[tuple[str, bytes]],
                      failed: Callable[[str, Exception], None]) -> None:
    for subject, payload in batch:
        try:
            await nc.publish(subject, payload)
        except Exception as exc:  # disconnected past the buffer, closed, bad subject: count
            failed(subject, exc)


async def subscribed(nc: Any, timeout: float = _TIMING.call_s) -> None:
    """Rule 6: the server has every subscription `nc` sent before this call. Raises
    nats-py's TimeoutError if the message to ourselves is not back within `timeout`."""
    sub = await nc.subscribe(nc.new_inbox())
    try:
        await nc.publish(sub.subject, b"")
        await sub.next_msg(timeout=timeout)
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()


async def abort(nc: Any) -> None:
    """Rule 7: drop the client's pending buffer, then close."""
    if nc is None or nc.is_closed:
        return
    if isinstance(getattr(nc, "_pending", None), list):
        nc._pending = []
        nc._pending_data_size = 0
    with contextlib.suppress(Exception):
        await nc.close()


class _DirectParser(Parser):
    """Rule 4: complete MSG frames at the front of what was read, for direct subscriptions,
    handed to their handlers as they are cut off, without a coroutine a message; the first
    frame of anything else (another command, a frame not yet whole, an ordinary
    subscription's message) and all after it are nats-py's parser's, as before."""

    nc: Client

    async def parse(self, data: bytes = b"") -> None:
        buf = self.buf
        buf.extend(data)
        direct, nc = self.nc._direct, self.nc
        while self.state == AWAITING_CONTROL_LINE and buf.startswith(b"MSG "):
            end = buf.find(b"\r\n", 4, _LINE_MAX)
            args = buf[4:end].split() if end > 0 else ()
            if len(args) == 3:
                subject, sid, size = args
                reply = bytearray()
            elif len(args) == 4:
                subject, sid, reply, size = args
            else:
                break  # not whole yet, or not a frame this reads: nats-py's parser says
            if not (sid.isdigit() and size.isdigit()):
                break
            handler = direct.get(int(sid))
            start = end + 2
            stop = start + int(size)
            if handler is None or len(buf) < stop + 2:
                break
            payload = bytes(buf[start:stop])
            del buf[:stop + 2]
            nc._hand(handler, subject, reply, payload, None)
        await super().parse()


class Client(NatsClient):
    """nats-py's client, with direct subscriptions for the broker's busiest subjects."""

    def __init__(self) -> None:
        super().__init__()
        self._direct: dict[int, Handler] = {}
        #: A handler that raises is a bug; its traceback is logged, but not per message.
        self._failures = Throttle()
        if DIRECT:
            self._ps = _DirectParser(self)

    async def subscribe_direct(self, subject: str, handler: Handler) -> Subscription:
        """Subscribe `handler` (a function that never waits) to `subject` (rule 4); the
        subscription, to unsubscribe."""
        if not DIRECT:
            async def cb(msg: Msg) -> None:
                handler(msg)

            return await self.subscribe(subject, cb=cb)
        sub = await self.subscribe(subject)  # no callback: no task, its queue stays empty
        self._direct[sub._id] = handler
        return sub

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes,
                           headers: bytes | None) -> None:
        handler = self._direct.get(sid)
        if handler is None:
            await super()._process_msg(sid, subject, reply, data, headers)  # type: ignore[arg-type]
            return
        self._hand(handler, subject, reply, data, headers)

    def _hand(self, handler: Handler, subject: bytes | bytearray, reply: bytes | bytearray,
              data: bytes, headers: bytes | None) -> None:
        self.stats["in_msgs"] += 1
        self.stats["in_bytes"] += len(data)
        try:
            handler(Inbound(subject.decode(), data, reply.decode() if reply else "",
                            headers or None))
        except Exception:  # one broken message must not stop the connection's reader
            where = subject.decode(errors="replace")
            if self._failures.admit("handler failed", where) is not None:
                log.exception("handling a message on %s failed; it is dropped (one line a "
                              "subject every %gs)", where, self._failures.interval_s)
