"""The event history: every event the broker publishes, kept by JetStream, read by sequence.

Rules:
1. The stream (`subjects.EVENTS_STREAM`) stores what the broker publishes on
   ``gavel.events.>`` as it publishes it: on file, bounded by age (`MAX_AGE_S`) and size
   (`MAX_BYTES`, the oldest dropped first), on `replicas` servers (the broker's KV replicas:
   3 on a cluster, 1 on a lone server, which refuses more - said once). Only the broker
   publishes events (`transport.identity`), so nobody else writes into it.
2. Readers get stored events by sequence (``STREAM.MSG.GET`` with ``next_by_subj``): no
   consumer is made, so a reader needs no state on the server and only read permissions
   (`subjects.EVENTS_GET`, `subjects.EVENTS_INFO`), and a reconnect loses nothing.
3. `follow` yields every event after a sequence, in order, each once: it reads the next
   stored one after the last it yielded, so after a reconnect or a nats-server restart it
   goes on where it left off, with no gap and no duplicate (on a connection that reconnects;
   a closed one ends it). A subscription to the events' subject is only its doorbell;
   without one it looks again every `Timing.follow_s`.
4. Without JetStream (or without the stream) there is no history: `follow` yields what
   the subscription hears, with sequence 0 - but not an event stored late (its header
   `STORED_LATE`: the broker stores what it published while the history could not be
   made once it can, `broker.events` rule 4), which such a follower heard when it was
   published.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from typing import Any, NamedTuple

from nats.js.api import DiscardPolicy, StorageType, StreamConfig
from nats.js.errors import APIError, BadRequestError

from gavel.shared import subjects
from gavel.shared.messages import Event
from gavel.shared.timing import Timing
from gavel.transport.inbound import Decode, Malformed, js_answer

__all__ = ["MAX_AGE_S", "MAX_BYTES", "STORED_LATE", "Follower", "NoHistory",
           "Stored", "ensure", "follow", "last_seq", "next_after", "recent", "stream_config"]

#: Events older than this leave the stream (seven days).
MAX_AGE_S = 7 * 24 * 3600.0
#: The stream's size bound; past it the oldest events go first.
MAX_BYTES = 64 * 1024 * 1024
#: The largest event stored (an event is a few hundred bytes; a reason and a detail at most).
MAX_MSG_BYTES = 64 * 1024
#: A JetStream call unanswered this long has failed, and how often `follow` looks again when
#: its doorbell is silent (rule 3) unless its caller's `Timing` says: `Timing`'s machine
#: waits, for the operator's commands and the broker's load of the history alike.
_CALL_S, _FOLLOW_S = Timing().call_s, Timing().follow_s
#: The header of an event stored after it was published (rule 4).
STORED_LATE = "Gavel-Stored-Late"
_STREAM_NAME_IN_USE = 10058
_REPLICAS_UNSUPPORTED = 10074
#: Reads in flight at once while `recent` loads the newest events.
_AT_ONCE = 64
_event: Decode[Event] = Decode(Event)


class Stored(NamedTuple):
    seq: int  # its sequence in the stream (0: heard without one, rule 4)
    event: Event


class NoHistory(Exception):
    """The stream is not there to read (no JetStream, no stream, no answer)."""


def stream_config(replicas: int = 1) -> StreamConfig:
    """Rule 1's stream, kept on `replicas` servers."""
    return StreamConfig(name=subjects.EVENTS_STREAM, subjects=[subjects.EVENTS_ALL],
                        storage=StorageType.FILE, max_age=MAX_AGE_S, max_bytes=MAX_BYTES,
                        max_msg_size=MAX_MSG_BYTES, discard=DiscardPolicy.OLD,
                        num_replicas=replicas)


async def ensure(nc: Any, replicas: int, log: logging.Logger) -> int:
    """Rule 1: the stream made or brought to this configuration; the replicas it has."""
    js = nc.jetstream(timeout=_CALL_S)
    while True:
        config = stream_config(replicas)
        try:
            try:
                await js.add_stream(config)
            except BadRequestError as exc:
                if exc.err_code != _STREAM_NAME_IN_USE:
                    raise
                await js.update_stream(config)
            return replicas
        except APIError as exc:
            if exc.err_code != _REPLICAS_UNSUPPORTED or replicas == 1:
                raise
            log.warning("nats-server is not clustered: the event history is kept on it "
                        "alone, not on %d replicas", replicas)
            replicas = 1


async def _ask(nc: Any, subject: str, body: dict[str, Any]) -> dict[str, Any]:
    try:
        msg = await nc.request(subject, json.dumps(body).encode(), timeout=_CALL_S)
    except Exception as exc:  # no responders, timeout, disconnected
        raise NoHistory(str(exc) or type(exc).__name__) from None
    answer = js_answer(msg.data)
    if isinstance(answer, Malformed):
        raise NoHistory(f"not a JetStream answer ({answer.why})")
    return answer


async def last_seq(nc: Any) -> int:
    """The sequence of the newest stored event (0: none yet); `NoHistory` without one."""
    answer = await _ask(nc, subjects.EVENTS_INFO, {})
    if "error" in answer:
        raise NoHistory(str(answer["error"].get("description", "")))
    return int(answer.get("state", {}).get("last_seq", 0))


async def _get(nc: Any, body: dict[str, Any]) -> Stored | None:
    answer = await _ask(nc, subjects.EVENTS_GET, body)
    error = answer.get("error")
    if error is not None:
        if error.get("code") == 404:  # none there (yet)
            return None
        raise NoHistory(str(error.get("description", "")))
    msg = answer.get("message") or {}
    seq = int(msg.get("seq", 0))
    try:
        event = _event(base64.b64decode(msg.get("data", "")))
    except ValueError:  # not base64
        event = Malformed("not base64")
    # Not an event: skipped.
    return Stored(seq, Event(instance_id="", type="error") if isinstance(event, Malformed)
                  else event)


async def next_after(nc: Any, seq: int, subject: str = subjects.EVENTS_ALL) -> Stored | None:
    """Rule 2: the first stored event on `subject` after `seq`, or None (none yet)."""
    return await _get(nc, {"seq": seq + 1, "next_by_subj": subject})


async def recent(nc: Any, count: int) -> list[Stored]:
    """The newest `count` stored events, oldest first (those the limits dropped skipped)."""
    last = await last_seq(nc)
    first = max(1, last - count + 1)
    got: list[Stored] = []
    for start in range(first, last + 1, _AT_ONCE):
        seqs = range(start, min(start + _AT_ONCE, last + 1))
        got.extend(s for s in await asyncio.gather(*(_get(nc, {"seq": n}) for n in seqs))
                   if s is not None and s.event.instance_id)
    return got


class Follower:
    """Rule 3 as an async iterator of `Stored`: `start` subscribes and fixes where it
    begins (so nothing published after `start` returns is missed), ``aclose`` ends it."""

    def __init__(self, nc: Any, instance_id: str = "", after: int | None = None, *,
                 follow_s: float = _FOLLOW_S) -> None:
        self.nc = nc
        #: How often it looks again when its doorbell is silent (rule 3).
        self.follow_s = follow_s
        self.subject = subjects.EVENTS.format(instance=instance_id) if instance_id \
            else subjects.EVENTS_ALL
        #: The sequence of the last event yielded (None until `start`).
        self.last = after
        #: Rule 4: no history, so what is heard is what is yielded.
        self.plain = False
        self._bell = asyncio.Event()
        self._heard: asyncio.Queue[bytes] = asyncio.Queue()
        self._sub: Any = None

    async def start(self) -> Follower:
        self._sub = await self.nc.subscribe(self.subject, cb=self._ring)
        if self.last is None:
            try:
                self.last = await last_seq(self.nc)
            except NoHistory:
                self.plain = True
        return self

    async def _ring(self, msg: Any) -> None:
        if self.plain and not (msg.headers and STORED_LATE in msg.headers):  # rule 4
            self._heard.put_nowait(msg.data)
        self._bell.set()

    def __aiter__(self) -> Follower:
        return self

    async def __anext__(self) -> Stored:
        if self._sub is None:
            await self.start()
        while self.plain:
            data = await self._heard.get()
            event = _event(data)
            if not isinstance(event, Malformed):
                return Stored(0, event)
        while True:
            if self.nc.is_closed:  # closed, not reconnecting: nothing more will come
                raise StopAsyncIteration
            self._bell.clear()
            try:
                got = await next_after(self.nc, self.last or 0, self.subject)
            except NoHistory:  # NATS away or restarting: look again
                got = None
            if got is None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.follow_s):
                        await self._bell.wait()
                continue
            self.last = got.seq
            if got.event.instance_id:
                return got

    async def aclose(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()


def follow(nc: Any, instance_id: str = "", after: int | None = None, *,
           follow_s: float = _FOLLOW_S) -> Follower:
    """Rule 3: every event (of `instance_id`, or all) stored after sequence `after` (None:
    from `start` on), each once, in order, across reconnects, looking again every
    `follow_s` when nothing rings; rule 4 without a stream."""
    return Follower(nc, instance_id, after, follow_s=follow_s)
