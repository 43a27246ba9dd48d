"""The events waiting for the event history (`broker.events` rule 3): bounded by
`WAITING_MAX`, the oldest dropped past it, counted for the metrics and said once per run of
drops. Nothing is stored here: the history is taken as made and `run` never runs, as when
the broker's loop is stalled or its stream away."""

from __future__ import annotations

import asyncio
import logging

import msgspec
import pytest

from gavel.broker import events as events_module
from gavel.broker.events import Events
from gavel.broker.outbox import Outbox
from gavel.shared.messages import Event
from gavel.shared.timing import Timing


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

    async def store(subject: str, data: bytes, msg_id: str, published: bool) -> bool:
        iid = msgspec.msgpack.decode(data, type=Event).instance_id
        tries[iid] = tries.get(iid, 0) + 1
        if iid == "i-0" and tries[iid] == 1:  # its first store is refused, then
            events.record(Event(instance_id="late", type="placed"))  # one comes meanwhile
            return False
        stored.append(iid)
        return True

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
