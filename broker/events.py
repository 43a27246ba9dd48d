"""Instance events: each published on its instance's subject and kept for `gavel events`.

Rules:
1. An event is published as it happens (``gavel.events.<instance>``, for whoever follows
   it) and the newest `KEPT` stay in memory for the API.
2. With JetStream, what is published is also stored in the event history
   (`transport.eventstream`: bounded by age and size, replicated like the KV), and `load`
   fills the memory from it at start, so a restarted broker (or nats-server, the history
   being on file) answers `gavel events` with what happened before it. Without JetStream
   the history starts empty at each start (said once); git holds the outcomes either way.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from gavel.broker.outbox import Outbox
from gavel.shared import subjects
from gavel.shared.messages import Event, EventType
from gavel.transport import eventstream

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

    async def load(self, nc: Any, replicas: int, log: logging.Logger) -> int:
        """Rule 2: the history made sure of, the newest `KEPT` of it put before what was
        recorded since start; how many were loaded."""
        try:
            await eventstream.ensure(nc, replicas, log)
            stored = await eventstream.recent(nc, KEPT)
        except Exception as exc:  # JetStream off or refused: memory only
            log.warning("no JetStream event history (%s): `gavel events` shows only what "
                        "happened since this broker started", str(exc) or type(exc).__name__)
            return 0
        since = list(self.recent)
        self.recent = deque([s.event for s in stored] + since, maxlen=KEPT)
        return len(stored)

    def record(self, ev: Event) -> None:
        self.recent.append(ev)
        self._outbox.publish(subjects.EVENTS.format(instance=ev.instance_id), ev)

    def emit(self, instance_id: str, type_: EventType, node_id: str = "",
             reason: str = "", detail: str = "", exit_code: int | None = None,
             attempt: int = 0) -> None:
        self.record(Event(instance_id=instance_id, type=type_, node_id=node_id,
                          reason=reason, detail=detail, exit_code=exit_code,
                          attempt=attempt, at=self._clock()))
