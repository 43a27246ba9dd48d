"""Instance events: each published on its instance's subject and kept for `gavel events`.

Rule: an event is published as it happens (``gavel.events.<instance>``, for whoever follows
it) and the newest `KEPT` stay in memory for the API; events are not durable - git holds the
outcomes, the events only narrate them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator

from gavel.broker.outbox import Outbox
from gavel.shared import subjects
from gavel.shared.messages import Event, EventType

__all__ = ["KEPT", "Events"]

#: Events kept in memory for `gavel events`.
KEPT = 2000


class Events:
    def __init__(self, outbox: Outbox, clock: Callable[[], float] = time.time) -> None:
        self._outbox = outbox
        self._clock = clock
        self.recent: deque[Event] = deque(maxlen=KEPT)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.recent)

    def __len__(self) -> int:
        return len(self.recent)

    def record(self, ev: Event) -> None:
        self.recent.append(ev)
        self._outbox.publish(subjects.EVENTS.format(instance=ev.instance_id), ev)

    def emit(self, instance_id: str, type_: EventType, node_id: str = "",
             reason: str = "", detail: str = "", exit_code: int | None = None,
             attempt: int = 0) -> None:
        self.record(Event(instance_id=instance_id, type=type_, node_id=node_id,
                          reason=reason, detail=detail, exit_code=exit_code,
                          attempt=attempt, at=self._clock()))
