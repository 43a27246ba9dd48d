"""The node's watch of its own node.json in the KV bucket the broker mirrors (`broker.mirror`).

Rules:
1. The watch is one JetStream push consumer at a time, made by the broker on this node's
   request (``gavel.watch.<node>``, `broker.watches`): a node's credential grants no
   JetStream call (`transport.identity` rule 4), so the server delivers its key nowhere but
   into this node's own inbox. The node subscribes to a fresh inbox first, then asks.
2. The consumer delivers the key's last value first, then every later one, unacknowledged,
   to that inbox, with idle heartbeats; it is ephemeral, and the server drops it soon after
   nobody listens (the broker also deletes a node's previous consumer when it makes the
   next).
3. A delivery out of sequence (one lost to a reconnect), a heartbeat naming a later
   delivery than the last one seen, or silence for two heartbeats: the consumer is
   abandoned and a new one made, which delivers the last value again. A value's revision
   (its stream sequence) says which is newer; the same one twice is harmless.
4. What arrives on the inbox and is not a delivery of this key by the current consumer
   (not a JetStream delivery, another consumer's, another key's, a status message that is
   no heartbeat) is counted and dropped, never raised. A heartbeat names no consumer: one
   on this inbox is taken for the current consumer's (only the server and this node know
   the inbox), and at worst makes a new consumer.
5. A request the broker refuses (the bucket does not exist yet, asked too soon) or that
   nobody answers (no broker, NATS away) is retried every heartbeat, with one warning until
   it works; an answer that never comes is given up after a heartbeat. A consumer already
   made keeps delivering while the broker is away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec
import nats.errors
from nats.aio.msg import Msg

from gavel.shared import subjects
from gavel.shared.messages import ApiError, WatchGrant, WatchRequest
from gavel.transport.inbound import Decode, Malformed, Sink

__all__ = ["Entry", "NodeWatch"]

log = logging.getLogger("gavel.worker.converge")

#: Heartbeats of silence after which a consumer is given up (rule 3).
SILENT_BEATS = 2
#: Rule 4's kinds.
NOT_DELIVERY = "KV watch message that is no JetStream delivery"
OTHER_CONSUMER = "KV watch delivery by another consumer"
OTHER_KEY = "KV watch delivery of another node's key"
NOT_HEARTBEAT = "KV watch status message that is no heartbeat"

_encode = msgspec.msgpack.Encoder().encode
_decode: Decode[WatchGrant | ApiError] = Decode(WatchGrant | ApiError)


class Entry(NamedTuple):
    """One value of the node's key: its revision, the KV operation (None for a put), the
    bytes."""

    revision: int
    operation: str | None
    value: bytes


class WatchError(Exception):
    """The broker made no consumer; the message is its sentence."""


class NodeWatch:
    """Watches `node`'s key; hands every value to `observe`. ``await run()`` until
    cancelled."""

    def __init__(self, nc: Any, node: str, observe: Callable[[Entry], None], *,
                 heartbeat_s: float, answer_s: float, sink: Sink,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.nc = nc
        self.sink = sink
        self.node = node
        self.key = subjects.NODE_KEY.format(node=node)
        self._observe = observe
        self.heartbeat_s = heartbeat_s
        #: How long the broker's answer to a watch request may take (rule 5).
        self.answer_s = answer_s
        self._clock = clock
        self._sub: Any = None
        #: The current consumer, the last delivery it made, and when it was last heard.
        self.consumer = ""
        self._delivered = 0
        self._heard = 0.0
        self._stale = asyncio.Event()
        #: Consumers made: the first and every renewal.
        self.created = 0
        self._warned = False

    async def run(self) -> None:
        """Rules 3 and 5: a consumer, renewed whenever it goes stale."""
        while True:
            try:
                await self._start()
            except (nats.errors.Error, TimeoutError, WatchError) as exc:
                await self._stop()
                if not self._warned:
                    self._warned = True
                    log.warning("cannot watch %s in KV yet (%s); retrying every %gs",
                                self.key, exc or type(exc).__name__, self.heartbeat_s)
                await asyncio.sleep(self.heartbeat_s)
                continue
            self._warned = False
            try:
                await self._until_stale()
            finally:
                await self._stop()

    async def _start(self) -> None:
        """Rules 1 and 2: listen on a fresh inbox, then ask the broker for the consumer that
        feeds it."""
        self._stale.clear()
        self._delivered = 0
        # Named here, before it exists: its first delivery may arrive before the answer.
        self.consumer = name = f"{self.node}_{secrets.token_hex(8)}"
        inbox = self.nc.new_inbox()
        self._sub = await self.nc.subscribe(inbox, cb=self._on_msg)
        request = _encode(WatchRequest(node_id=self.node, deliver=inbox, consumer=name))
        self._heard = self._clock()
        bound = self.answer_s
        async with asyncio.timeout(bound):  # rule 5, whatever the client's own timeout does
            msg = await self.nc.request(subjects.WATCH.format(node=self.node), request,
                                        timeout=bound)
        answer = _decode(msg.data)
        if isinstance(answer, Malformed):
            raise WatchError("not an answer of the broker's")
        if isinstance(answer, ApiError):
            raise WatchError(answer.error)
        if answer.consumer != name:
            raise WatchError(f"the broker made {answer.consumer}, not {name}")
        self.created += 1
        self._heard = self._clock()

    async def _until_stale(self) -> None:
        """Rule 3: until a gap says so, or the consumer has been silent too long."""
        while not self._stale.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.heartbeat_s):
                    await self._stale.wait()
            if self._clock() - self._heard > SILENT_BEATS * self.heartbeat_s:
                log.info("the KV watch of %s went silent; renewing it", self.key)
                return

    async def _stop(self) -> None:
        sub, self._sub = self._sub, None
        self.consumer = ""
        if sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    # -- deliveries ------------------------------------------------------------------------

    def _drop(self, kind: str, msg: Msg) -> None:
        """Rule 4: the sink counts it and decides what reaches the log."""
        self.sink.count(kind, f"{msg.subject} (heard on the KV watch of {self.key})")

    async def _on_msg(self, msg: Msg) -> None:
        headers = msg.headers or {}
        if "Status" in headers:
            self._on_status(headers, msg)
            return
        try:
            meta = msg.metadata
        except (nats.errors.Error, ValueError, IndexError):
            self._drop(NOT_DELIVERY, msg)
            return
        if meta.consumer != self.consumer or meta.stream != subjects.NODES_STREAM:
            self._drop(OTHER_CONSUMER, msg)
            return
        if msg.subject != self.key:
            self._drop(OTHER_KEY, msg)
            self._stale.set()  # our consumer's filter is not ours: make a new one
            return
        self._heard = self._clock()
        if meta.sequence.consumer != self._delivered + 1:
            self._stale.set()  # rule 3: a delivery was lost; the next consumer re-reads
        self._delivered = meta.sequence.consumer
        operation = headers.get("KV-Operation")
        self._observe(Entry(revision=meta.sequence.stream, operation=operation,
                            value=msg.data))

    def _on_status(self, headers: dict[str, str], msg: Msg) -> None:
        if headers.get("Status") != "100" or "Nats-Last-Consumer" not in headers:
            self._drop(NOT_HEARTBEAT, msg)
            return
        # A heartbeat names no consumer; only ours knows this inbox (rule 4's stranger would
        # have to guess it), so it is ours.
        self._heard = self._clock()
        try:
            last = int(headers["Nats-Last-Consumer"])
        except ValueError:
            self._drop(NOT_HEARTBEAT, msg)
            return
        if last != self._delivered:
            self._stale.set()  # rule 3: it delivered more than arrived
