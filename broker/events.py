"""Instance events: each published on its instance's subject and kept for `gavel events`.

Rules:
1. An event is published as it happens (``gavel.events.<instance>``, for whoever follows
   it) and the newest `KEPT` stay in memory for the API.
2. With JetStream, what is published is also stored in the event history
   (`transport.eventstream`: bounded by age and size, replicated like the KV), and `load`
   fills the memory from it at start, so a restarted broker (or nats-server, the history
   being on file) answers `gavel events` with what happened before it. Without JetStream
   the history starts empty at each start (said once); git holds the outcomes either way.
3. With the history, an event is published as a JetStream publish, in order, up to
   `_WINDOW` at once, until the stream acknowledges it (`run`): one published while NATS or
   its stream is away (a nats-server restarting recovers its streams after it accepts
   connections) is sent again, never lost from the history, and carries a message id, so
   one whose acknowledgement was lost is stored once (the stream's duplicate window). At
   most `WAITING_MAX` wait (seconds of a busy cluster's events while its broker is stalled
   or its stream away); past that the oldest waiting is dropped, counted
   (``gavel_events_dropped_total``) and said once per run of drops. A leader of several
   brokers sends none while its lease says it does not lead (`Outbox.gate`): what waits
   then is dropped, never sent late. A window's stores are plain publishes whose reply
   subjects (one inbox, a number each) tell their acknowledgements apart (`Window`), heard
   by one direct subscription (`transport.wire` rule 4): a request each (an inbox token,
   a future, a timer and a task, the answer as a `Msg`) took about a sixth of the broker's
   CPU a placement (docs/performance.md). A message id is the broker's random prefix and a
   count. A window's stores reach the client as one hand-over (`transport.wire` rule 8),
   not a `publish` each, whose checks and framing cost more than the frame; their header
   blocks are built as they are, not checked key by key like any header's.
4. JetStream that cannot answer yet (`transport.asklater` rules 2 and 3: electing its
   leaders, or any failure with several brokers) is asked again for the history every
   `retry_s` (`run`), and meanwhile each event is published as without JetStream (for
   whoever follows it now) and also waits to be stored (rule 3): once the history is
   made, it is loaded as at start and what waited is stored, in order, so nothing
   recorded meanwhile is lost from it. Those are stored marked (`eventstream.STORED_LATE`):
   a follower without a history (`transport.eventstream` rule 4), which heard them as they
   were published, does not take them again. Else a broker (a leadership)
   begun while JetStream elects would keep no history for its whole run.
5. A window is acknowledged once while the broker knows the stream's sequence of its own
   newest store (`Events.last`: from a window answered store by store, each stored anew,
   or from the last covered one): only the window's last store asks for an answer, and
   each store carries the sequence the stream must have stored last before it
   (``Nats-Expected-Last-Sequence``: the known one, plus the stores before it in the
   window). A store lost, refused, a duplicate, or another writer's message between them
   leaves the stream's last sequence other than what every later store expects, so it
   refuses each, the last's answer included: that answer saying it was stored anew at the
   known sequence plus the window's size says the whole window is stored, in order, once.
   Any other answer sends the window again at once with an answer each (rule 3's message
   ids keep what was stored stored once; the sequence is learnt again from it); no answer
   within `ack_s` leaves the sequence unknown and the window waits to go again. Only the
   leading broker writes events (`transport.eventstream` rule 1), so nothing else moves
   the sequence between its windows. An acknowledgement a store was three of the six
   messages the broker read a placement (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import msgspec

from gavel.broker.outbox import Outbox
from gavel.shared import subjects
from gavel.shared.messages import Event, EventType
from gavel.shared.timing import Timing
from gavel.transport import eventstream, wire
from gavel.transport.asklater import Made, again, verdict, why
from gavel.transport.inbound import Decode, Malformed
from gavel.transport.wire import Inbound

__all__ = ["KEPT", "Events", "Window"]

#: Events kept in memory for `gavel events`, and the most waiting to be stored (rule 3).
KEPT = 2000
#: Events waiting to be stored, at most (rule 3): ~300 bytes each.
WAITING_MAX = 20_000
#: Stores on the wire at once (rule 3): one window in flight at a time, answered once (rule
#: 5), so the history keeps up with this many events a round trip to the stream, and a
#: window's own work (its answer, its timer, its wake-ups) is shared by as many stores.
_WINDOW = 256
_TIMING = Timing()


class _Ack(msgspec.Struct):
    """A store's answer as rule 3 reads it (a JSON object, like `js_answer`'s): stored when it
    names a sequence and no error, anew unless it says it was a duplicate (rule 5). Decoded
    as this, not as a dict."""

    seq: Any = msgspec.UNSET
    error: Any = msgspec.UNSET
    duplicate: Any = msgspec.UNSET


_ack: Decode[_Ack] = Decode(_Ack, json=True)


class Window:
    """Rule 3: the answers a window on the wire asks for, numbered from `first` (the last
    part of each one's reply subject): which the stream answered, which it stored, and the
    sequence of each stored anew (0: not stored, or a duplicate; rule 5). An answer to a
    number outside the window (a store of an earlier window answered late, sent again
    since) or answered already changes nothing."""

    def __init__(self, first: int, size: int) -> None:
        self.first = first
        self.stored = [False] * size
        self.anew = [0] * size
        self.answered = [False] * size
        self._left = size
        #: Set once every store of the window is answered.
        self.done = asyncio.Event()
        if not size:
            self.done.set()

    def heard(self, number: int, stored: bool, anew: int = 0) -> None:
        i = number - self.first
        if not 0 <= i < len(self.stored) or self.answered[i]:
            return
        self.answered[i], self.stored[i] = True, stored
        self.anew[i] = anew if stored else 0
        self._left -= 1
        if not self._left:
            self.done.set()


class Events:
    def __init__(self, outbox: Outbox, clock: Callable[[], float] = time.time, *,
                 timing: Timing = _TIMING) -> None:
        self._outbox = outbox
        #: How long a store waits for its acknowledgement, and between tries (rule 3).
        self._ack_s = timing.ack_s
        self._retry_s = timing.retry_s
        self._clock = clock
        self.recent: deque[Event] = deque(maxlen=KEPT)
        #: Rule 3: (subject, payload, message id, published already: rule 4) waiting for the
        #: stream's acknowledgement.
        self.waiting: deque[tuple[str, bytes, str, bool]] = deque()
        self.dropped = 0
        self._dropping = False  # rule 3: said once while it drops
        self._on_wire = 0  # stores of the window `run` has on the wire
        #: Rule 3: the stores' inbox (made with the history), the window on the wire and
        #: the number its first store's reply subject carries; the message ids' prefix.
        self._inbox = ""
        self._window: Window | None = None
        self._numbered = 0
        self._id_prefix = uuid.uuid4().hex
        self._ids = 0
        #: Rule 5: the stream's sequence of this broker's newest store, while known.
        self.last: int | None = None
        #: How many of `recent` `load` read from the history (those first): the rest were
        #: heard by this broker.
        self.loaded = 0
        self._nc: Any = None
        self._more = asyncio.Event()
        #: Rule 4: while set, the history is asked for again by `run`, with this.
        self._later: Callable[[], Awaitable[tuple[Made, str]]] | None = None
        self._log = logging.getLogger("gavel.broker")

    def __iter__(self) -> Iterator[Event]:
        return iter(self.recent)

    def __len__(self) -> int:
        return len(self.recent)

    async def load(self, nc: Any, replicas: int, log: logging.Logger, *,
                   ha: bool = False) -> int:
        """Rule 2: the history made sure of, the newest `KEPT` of it put before what was
        recorded since start; how many were loaded. Rule 4 when JetStream cannot answer
        yet (`ha`: one leadership of several brokers)."""
        made, reason = await self._open(nc, replicas, log, ha)
        if made is Made.NEVER:
            _no_history(log, reason)
        elif made is Made.LATER:
            log.warning("JetStream cannot make the event history yet (%s): events wait "
                        "to be stored in it; asked again every %gs", reason, self._retry_s)
            self._later = functools.partial(self._open, nc, replicas, log, ha)
            self._log = log
        return self.loaded

    async def _open(self, nc: Any, replicas: int, log: logging.Logger, ha: bool
                    ) -> tuple[Made, str]:
        """One try of rule 2 (or 4): the history made and loaded."""
        try:
            await eventstream.ensure(nc, replicas, log)
        except Exception as exc:  # JetStream off or refused: memory only (rule 2)
            return verdict(exc, ha), why(exc)
        try:
            stored = await eventstream.recent(nc, KEPT)
        except Exception as exc:  # JetStream just answered: it is there, so later
            return Made.LATER, why(exc)
        if not self._inbox:
            inbox = nc.new_inbox()
            await nc.subscribe_direct(f"{inbox}.*", self._answered)
            self._inbox = inbox
        self._nc = nc
        since = list(self.recent)
        self.recent = deque([s.event for s in stored] + since, maxlen=KEPT)
        self.loaded = min(len(stored), KEPT - len(since))
        return Made.MADE, ""

    async def _until_history(self, later: Callable[[], Awaitable[tuple[Made, str]]]
                             ) -> None:
        """Rule 4: asked again until made (then what waited is stored) or never."""
        made, reason = await again(later, self._retry_s)
        self._later = None
        log = self._log
        if made:
            log.info("the event history is made now; %d events loaded from it",
                     self.loaded)
            self._more.set()
        else:
            _no_history(log, reason)
            self.dropped += len(self.waiting)
            self.waiting.clear()

    def record(self, ev: Event) -> None:
        self.recent.append(ev)
        subject = subjects.EVENTS.format(instance=ev.instance_id)
        if self._nc is None:
            self._outbox.publish(subject, ev)
            if self._later is None:
                return
        gate = self._outbox.gate
        if gate is not None and not gate():
            return  # rule 3: not leading, nothing goes out
        if len(self.waiting) >= WAITING_MAX:
            self.waiting.popleft()
            if not self._dropping:
                self._log.warning("%d events wait to be stored in the event history; the "
                                  "oldest waiting are dropped (gavel_events_dropped_total)",
                                  WAITING_MAX)
                self._dropping = True
            self.dropped += 1
        self._ids += 1
        self.waiting.append((subject, self._outbox.encode(ev), f"{self._id_prefix}.{self._ids}",
                             self._nc is None))
        self._more.set()

    async def run(self) -> None:
        """Rule 3: store what waits, oldest first, up to `_WINDOW` on the wire at once
        (one connection keeps their order), each again until acknowledged; first rule 4's
        asking, if `load` left the history for later."""
        if self._later is not None:
            await self._until_history(self._later)
        while True:
            await self._more.wait()
            self._more.clear()
            while self.waiting:
                gate = self._outbox.gate
                if gate is not None and not gate():  # no longer leading: never sent late
                    self.dropped += len(self.waiting)
                    self.waiting.clear()
                    break
                # the window leaves the queue while on the wire (what comes meanwhile goes
                # behind it); what was not stored goes back in front, in order: O(window),
                # not a rebuild of everything waiting per window
                window = [self.waiting.popleft()
                          for _ in range(min(_WINDOW, len(self.waiting)))]
                self._on_wire = len(window)
                try:
                    stored = await self._store(window)
                finally:
                    self._on_wire = 0
                again = [w for w, ok in zip(window, stored, strict=True) if not ok]
                self.waiting.extendleft(reversed(again))
                self._dropping = self._dropping and len(self.waiting) > WAITING_MAX // 2
                if again:
                    await asyncio.sleep(self._retry_s)

    async def settle(self, within_s: float) -> None:
        """Wait up to `within_s` for what waits to be stored (a broker closing): `run`
        stores it; what is still waiting then, or while NATS is away, is lost from the
        history."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within_s):
                while (self.waiting or self._on_wire) and self._nc is not None \
                        and self._nc.is_connected:
                    self._more.set()
                    await asyncio.sleep(self._retry_s / 4)

    async def _store(self, window: list[tuple[str, bytes, str, bool]]) -> list[bool]:
        """Rules 3 and 5: each of `window` published to the stream; whether the stream
        stored each within `ack_s`: under the last's answer while the stream's sequence is
        known and that answer says all were stored, else by an answer each."""
        last, n = self.last, len(window)
        self.last = None  # known again only from what the stream answers to these
        if last is not None:
            w = await self._send(window, last)
            if w.anew[0] == last + n:
                self.last = last + n
                return [True] * n
            if not w.answered[0]:  # rule 5: unanswered, the window waits to go again
                return [False] * n
        w = await self._send(window, None)
        if all(w.anew):  # each stored anew, in order: the newest is the stream's last
            self.last = w.anew[-1]
        return w.stored

    async def _send(self, window: list[tuple[str, bytes, str, bool]], last: int | None
                    ) -> Window:
        """One try of rule 3: `window` on the wire, each store asking for an answer (`last`
        None), or only the last, each expecting the stream's sequence `last` and the stores
        before it (rule 5); the window's answers within `ack_s`."""
        size = len(window) if last is None else 1
        w = self._window = Window(self._numbered, size)
        self._numbered += size
        try:
            stores = self._framed(window, w.first, last)
            try:
                batched = await wire.send_replied(self._nc, stores)
            except Exception:  # the connection failed as they were handed over: not stored
                batched = True
                for i in range(size):
                    w.heard(w.first + i, False)
            if not batched:
                for i, (subject, data, msg_id, published) in enumerate(window):
                    reply, expect = stores[i][1], None if last is None else last + i
                    try:
                        await self._nc.publish(subject, data, reply=reply,
                                               headers=_headers(msg_id, published, expect))
                    except Exception:  # reconnecting past its buffer, closed: not stored
                        w.heard(w.first + (0 if last is not None else i), False)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._ack_s):
                    await w.done.wait()
        finally:
            self._window = None
        return w

    def _framed(self, window: list[tuple[str, bytes, str, bool]], first: int,
                last: int | None) -> list[tuple[str, str, bytes, bytes]]:
        """`window` as `wire.send_replied` takes it: each store's reply subject numbered
        from `first` (`last` None), or the last's alone, each expecting `last` and the
        stores before it (rule 5)."""
        inbox = self._inbox
        if last is None:
            return [(subject, f"{inbox}.{first + i}", _head(msg_id, published), data)
                    for i, (subject, data, msg_id, published) in enumerate(window)]
        end = len(window) - 1
        return [(subject, f"{inbox}.{first}" if i == end else "",
                 _head(msg_id, published, last + i), data)
                for i, (subject, data, msg_id, published) in enumerate(window)]

    def _answered(self, msg: Inbound) -> None:
        """Rule 3: the stream's answer to a store of the window on the wire (no responders,
        its stream away, answers with no body: not stored)."""
        w, number = self._window, msg.subject.rpartition(".")[2]
        if w is None or not number.isdecimal():
            return
        ack = _ack(msg.data)
        if isinstance(ack, Malformed) or ack.error is not msgspec.UNSET \
                or ack.seq is msgspec.UNSET:
            w.heard(int(number), False)
            return
        seq = ack.seq
        w.heard(int(number), True, seq if type(seq) is int and seq > 0
                and ack.duplicate is not True else 0)

    def emit(self, instance_id: str, type_: EventType, node_id: str = "",
             reason: str = "", detail: str = "", exit_code: int | None = None,
             attempt: int = 0) -> None:
        self.record(Event(instance_id=instance_id, type=type_, node_id=node_id,
                          reason=reason, detail=detail, exit_code=exit_code,
                          attempt=attempt, at=self._clock()))


#: The header by which a store expects the stream's sequence before it (rule 5).
_EXPECT = "Nats-Expected-Last-Sequence"


def _headers(msg_id: str, published: bool, expect: int | None = None) -> dict[str, str]:
    """A store's headers (rule 3): its message id; marked if published already (rule 4);
    the stream's sequence it expects before it, if any (rule 5)."""
    headers = {"Nats-Msg-Id": msg_id}
    if published:  # rule 4: a follower without a history heard it already
        headers[eventstream.STORED_LATE] = "1"
    if expect is not None:
        headers[_EXPECT] = str(expect)
    return headers


_ID_LINE = b"NATS/1.0\r\nNats-Msg-Id: "
_LATE_LINE = f"\r\n{eventstream.STORED_LATE}: 1".encode()
_EXPECT_LINE = f"\r\n{_EXPECT}: ".encode()


def _head(msg_id: str, published: bool, expect: int | None = None) -> bytes:
    """`wire.header_block(_headers(msg_id, published, expect))`, built at once: a message
    id is a hex prefix and a count, a sequence a number, nothing the block's checks would
    refuse (rules 3 and 5)."""
    return b"%s%s%s%s\r\n\r\n" % (_ID_LINE, msg_id.encode(),
                                   _LATE_LINE if published else b"",
                                   b"" if expect is None else b"%s%d" % (_EXPECT_LINE, expect))


def _no_history(log: logging.Logger, reason: str) -> None:
    log.warning("no JetStream event history (%s): `gavel events` shows only what happened "
                "since this broker started", reason)
