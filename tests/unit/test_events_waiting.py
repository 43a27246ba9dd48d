"""The events waiting for the event history (`broker.events` rule 3): bounded by
`WAITING_MAX`, the oldest dropped past it, counted for the metrics and said once per run of
drops. Nothing is stored here: the history is taken as made and `run` never runs, as when
the broker's loop is stalled or its stream away."""

from __future__ import annotations

import logging

import msgspec
import pytest

from gavel.broker import events as events_module
from gavel.broker.events import Events
from gavel.broker.outbox import Outbox
from gavel.shared.messages import Event


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

