"""A window of the event history's stores acknowledged once (`broker.events` rule 5), against
a real nats-server: with the stream's sequence known, only the window's last store is
answered, and a store the stream did not take (here a duplicate of one stored before, or
one over the stream's size limit) makes the stream refuse every store after it, so the
window goes again with an answer each. Read back, the history holds every event once, in
order."""

from __future__ import annotations

from typing import Any

import pytest

from gavel.broker.events import Events
from gavel.broker.outbox import Outbox
from gavel.shared.messages import Event, EventType
from gavel.shared.timing import Timing
from gavel.transport import eventstream, wire

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


class _Counted:
    """The stores' answers as the history's direct subscription hands them over, counted."""

    def __init__(self, events: Events) -> None:
        self.answers = 0
        self._answered = events._answered
        events._answered = self  # type: ignore[method-assign]

    def __call__(self, msg: wire.Received) -> None:
        self.answers += 1
        self._answered(msg)


async def _history(url: str) -> tuple[Any, Events, _Counted]:
    nc = wire.Client()
    await nc.connect(url)
    events = Events(Outbox(lambda _s, _e: None), timing=Timing(ack_s=5.0))
    counted = _Counted(events)
    await eventstream.ensure(nc, 1, events._log)
    inbox = nc.new_inbox()
    await nc.subscribe_direct(f"{inbox}.*", counted)
    events._nc, events._inbox = nc, inbox
    return nc, events, counted


def _window(events: Events, *details: str) -> list[tuple[str, bytes, str, bool]]:
    for d in details:
        events.emit("i-w", EventType.SCHEDULED, detail=d)
    return [events.waiting.popleft() for _ in details]


async def _stored_details(nc: Any) -> list[str]:
    return [s.event.detail for s in await eventstream.recent(nc, 100)]


async def test_a_window_is_stored_under_its_last_answer_once_the_sequence_is_known(
        nats_url: str) -> None:
    nc, events, counted = await _history(nats_url)
    try:
        assert await events._store(_window(events, "a", "b")) == [True, True]
        assert counted.answers == 2 and events.last == 2  # an answer each: learnt
        assert await events._store(_window(events, "c", "d", "e")) == [True] * 3
        assert counted.answers == 3 and events.last == 5  # one answer for three
        assert await _stored_details(nc) == ["a", "b", "c", "d", "e"]
    finally:
        await nc.close()


async def test_a_store_the_stream_did_not_take_sends_the_window_again_answered_each(
        nats_url: str) -> None:
    nc, events, counted = await _history(nats_url)
    try:
        first = _window(events, "a", "b")
        assert await events._store(first) == [True, True] and events.last == 2
        again = [_window(events, "c")[0], first[1], _window(events, "d")[0]]
        assert await events._store(again) == [True] * 3  # "b" a duplicate: refused after
        assert counted.answers == 2 + 1 + 3  # the covered answer, then one each
        assert events.last is None  # a duplicate answered: not learnt from that window
        assert await events._store(_window(events, "e")) == [True]
        assert events.last == 5
        events.emit("i-w", EventType.SCHEDULED, detail="f")
        _too_big(events)
        events.emit("i-w", EventType.SCHEDULED, detail="g")
        stored = await events._store([events.waiting.popleft() for _ in range(3)])
        assert stored == [True, False, True]  # refused alone once answered each
        assert await _stored_details(nc) == ["a", "b", "c", "d", "e", "f", "g"]
    finally:
        await nc.close()


def _too_big(events: Events) -> None:
    events.record(Event(instance_id="i-w", type=EventType.SCHEDULED,
                        detail="x" * (eventstream.MAX_MSG_BYTES + 1)))


async def test_a_stale_sequence_is_refused_not_taken(nats_url: str) -> None:
    """A sequence believed known but wrong (the stream moved on by two without this
    broker), and two stores of the window lost: the last would land at the sequence the
    window means, but the first store expects the stale one and is refused, and every
    store after it."""
    nc, events, counted = await _history(nats_url)
    try:
        assert await events._store(_window(events, "a", "b", "c")) == [True] * 3
        events.last = 1  # as if "b" and "c" were another broker's
        events.emit("i-w", EventType.SCHEDULED, detail="d")
        _too_big(events)
        _too_big(events)
        events.emit("i-w", EventType.SCHEDULED, detail="e")
        window = [events.waiting.popleft() for _ in range(4)]
        assert await events._store(window) == [True, False, False, True]
        assert counted.answers == 3 + 1 + 4 and events.last is None
        assert await _stored_details(nc) == ["a", "b", "c", "d", "e"]
    finally:
        await nc.close()
