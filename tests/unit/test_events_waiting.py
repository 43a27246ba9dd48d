"""The events waiting for the event history (`broker.events` rule 3): bounded by
`WAITING_MAX`, the oldest dropped past it, counted for the metrics and said once per run of
drops; a window's stores told apart by their reply subjects (`Window`). Nothing is stored
here: the history is taken as made, and the stream's answers are handed in as a direct
subscription hands them over."""

from __future__ import annotations

import asyncio
import logging

import msgspec
import pytest

from gavel.broker import events as events_module
from gavel.broker.events import Events, Window
from gavel.broker.outbox import Outbox
from gavel.shared.messages import Event
from gavel.shared.timing import Timing
from gavel.transport.eventstream import STORED_LATE
from gavel.transport.wire import Inbound, header_block


def test_past_the_bound_the_oldest_waiting_are_dropped_counted_and_said_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(events_module, "WAITING_MAX", 50)
    events = Events(Outbox(lambda _s, _e: None))
    events._nc = object()  # the history is made: every event waits to be stored
    with caplog.at_level(logging.WARNING, logger="gavel.broker"):
        for i in range(60):
            events.record(Event(instance_id=f"i-{i}", type="placed"))
    assert events.dropped == 10 and len(events.waiting) == 50
    first = msgspec.msgpack.decode(events.waiting[0][1], type=Event)
    assert first.instance_id == "i-10"  # the oldest went
    assert caplog.text.count("the oldest waiting are dropped") == 1
    assert len(events.recent) == 60  # what `gavel events` answers from is not touched



async def test_a_window_not_stored_goes_back_in_front_in_order_and_what_came_meanwhile_after(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`run` takes a window off the front; what was not stored returns to the front, in
    order, before what was recorded while the window was on the wire."""
    monkeypatch.setattr(events_module, "_WINDOW", 4)
    events = Events(Outbox(lambda _s, _e: None), timing=Timing(retry_s=0.01))
    events._nc = object()
    stored: list[str] = []
    tries: dict[str, int] = {}

    async def store(window: list[tuple[str, bytes, str, bool]]) -> list[bool]:
        ok = []
        for _subject, data, _msg_id, _published in window:
            iid = msgspec.msgpack.decode(data, type=Event).instance_id
            tries[iid] = tries.get(iid, 0) + 1
            if iid == "i-0" and tries[iid] == 1:  # its first store is refused, then
                events.record(Event(instance_id="late", type="placed"))  # one comes meanwhile
                ok.append(False)
                continue
            stored.append(iid)
            ok.append(True)
        return ok

    monkeypatch.setattr(events, "_store", store)
    for i in range(6):
        events.record(Event(instance_id=f"i-{i}", type="placed"))
    task = asyncio.create_task(events.run())
    try:
        for _ in range(200):
            if len(stored) == 7:
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
    assert stored == ["i-1", "i-2", "i-3", "i-0", "i-4", "i-5", "late"]
    assert not events.waiting and events.dropped == 0


def test_a_window_is_done_once_each_store_is_answered_in_any_order() -> None:
    w = Window(first=10, size=3)
    w.heard(12, True)
    w.heard(10, False)  # answered, not stored (an error, no responders)
    assert not w.done.is_set()
    w.heard(10, True)  # answered already: the first answer stands
    w.heard(9, True)  # an earlier window's store, answered late: not this window's
    w.heard(13, True)
    assert not w.done.is_set() and w.stored == [False, False, True]
    w.heard(11, True)
    assert w.done.is_set() and w.stored == [False, True, True]


def test_a_window_keeps_the_sequence_of_each_store_stored_anew() -> None:
    """Rule 5: what the stream stored anew carries its sequence; a duplicate or a refusal
    none."""
    events = Events(Outbox(lambda _s, _e: None))
    w = events._window = Window(first=0, size=4)
    for n, body in enumerate([b'{"stream":"E","seq":7}', b'{"stream":"E","seq":3,'
                              b'"duplicate":true}', b'{"error":{"code":10071},"seq":8}',
                              b'{"stream":"E","seq":true}']):
        events._answered(Inbound(f"_INBOX.x.{n}", body))
    assert w.stored == [True, True, False, True] and w.anew == [7, 0, 0, 0]


class _Wire:
    """What `Events._store` publishes with: each store's subject, reply and headers."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, dict[str, str]]] = []

    async def publish(self, subject: str, data: bytes, reply: str,
                      headers: dict[str, str]) -> None:
        self.sent.append((subject, reply, headers))


async def test_each_store_of_a_window_is_told_apart_by_its_reply_subject() -> None:
    """Two windows: the stream's answers come back by reply subject, an answer to the first
    window arriving after it is over changes nothing in the second, and what the stream
    refused or did not answer within `ack_s` is not stored."""
    events = Events(Outbox(lambda _s, _e: None), timing=Timing(ack_s=0.2))
    wire = _Wire()
    events._nc, events._inbox = wire, "_INBOX_broker.x"
    for i in range(3):
        events.record(Event(instance_id=f"i-{i}", type="placed"))
    first = [events.waiting.popleft() for _ in range(2)]
    storing = asyncio.create_task(events._store(first))
    await asyncio.sleep(0)
    assert [(s, r) for s, r, _h in wire.sent] == [
        ("gavel.events.i-0", "_INBOX_broker.x.0"), ("gavel.events.i-1", "_INBOX_broker.x.1")]
    ids = [h["Nats-Msg-Id"] for _s, _r, h in wire.sent]
    assert len(set(ids)) == 2 and ids == [first[0][2], first[1][2]]
    events._answered(Inbound("_INBOX_broker.x.1", b'{"stream":"EVENTS","seq":7}'))
    events._answered(Inbound("_INBOX_broker.x.0", b"", headers=b"NATS/1.0 503\r\n\r\n"))
    assert await storing == [False, True]  # no responders: not stored

    refused = [events.waiting[0]] * 2
    storing = asyncio.create_task(events._store(refused))
    await asyncio.sleep(0)
    events._answered(Inbound("_INBOX_broker.x.2", b'{"error":{"code":503,"description":'
                             b'"no stream"},"seq":9}'))
    events._answered(Inbound("_INBOX_broker.x.3", b"[1]"))  # no JSON object: no answer
    assert await storing == [False, False]  # an error said, or nothing it reads: not stored

    second = [events.waiting.popleft()]
    storing = asyncio.create_task(events._store(second))
    await asyncio.sleep(0)
    assert wire.sent[-1][1] == "_INBOX_broker.x.4"
    events._answered(Inbound("_INBOX_broker.x.1", b'{"stream":"EVENTS","seq":7}'))  # late
    assert await storing == [False]  # unanswered within ack_s
    storing = asyncio.create_task(events._store(second))  # sent again, the same message id
    await asyncio.sleep(0)
    assert wire.sent[-1][2]["Nats-Msg-Id"] == second[0][2]
    events._answered(Inbound("_INBOX_broker.x.5",
                             b'{"stream":"EVENTS","seq":8,"duplicate":true}'))
    assert await storing == [True]  # stored once: the stream's duplicate window


@pytest.mark.parametrize("expect", [None, 0, 12345678901])
@pytest.mark.parametrize("published", [False, True])
def test_a_stores_header_block_is_the_one_its_headers_make(published: bool,
                                                           expect: int | None) -> None:
    """Rules 3 and 5: the block a window's store carries, built at once, is byte for byte
    what `wire.header_block` makes of the headers the same store is published with one by
    one, the stream's sequence it expects included."""
    events = Events(Outbox(lambda _s, _e: None))
    events._nc = object()  # the history made: what is recorded waits to be stored
    events.record(Event(instance_id="i-0", type="placed"))
    msg_id = events.waiting[0][2]
    headers = events_module._headers(msg_id, published, expect)
    assert headers["Nats-Msg-Id"] == msg_id and (STORED_LATE in headers) is published
    assert headers.get("Nats-Expected-Last-Sequence") == (None if expect is None
                                                          else str(expect))
    assert events_module._head(msg_id, published, expect) == header_block(headers)
