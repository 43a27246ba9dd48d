"""What a node tells the broker of its instances' lives: each event numbered, and its newest
ends kept for the heartbeats after it.

Rules:
1. Every event a node sends is numbered from 1 since its agent started (`Event.seq`); each
   heartbeat says how many were sent when it was taken (`Heartbeat.reported`).
2. An end (``exited``, ``failed``, ``cancelled``) is told again by every heartbeat for
   `Timing.unreachable_s` after it was sent, the newest `shared.bounds.ENDED_MAX` of them,
   its detail cut to `shared.bounds.ENDED_DETAIL`: an event written as its NATS server went
   away is lost, and the broker would otherwise never hear how that attempt ended
   (`broker.promises` rule 8).
"""

from __future__ import annotations

import collections
import time

import msgspec

from gavel.shared.bounds import ENDED_DETAIL, ENDED_MAX
from gavel.shared.messages import NODE_ENDS, Event

__all__ = ["Reports"]


class Reports:
    """The node's event numbers and its recent ends (rules 1 and 2)."""

    def __init__(self, node_id: str, keep_s: float) -> None:
        self.node_id = node_id
        self.keep_s = keep_s
        #: Events made so far (the last `Event.seq`).
        self.sent = 0
        self._ended: collections.deque[tuple[float, Event]] = collections.deque(
            maxlen=ENDED_MAX)

    def event(self, instance_id: str, attempt: int, type_: str, reason: str, detail: str,
              exit_code: int | None, *, ports: dict[str, int] | None = None,
              taken: list[int] | None = None, check: str = "", restarts: int = 0) -> Event:
        """The next event, numbered; an end is kept for the heartbeats (rule 2)."""
        self.sent += 1
        event = Event(
            instance_id=instance_id, type=type_, node_id=self.node_id, reason=reason,
            detail=detail, exit_code=exit_code, attempt=attempt, at=time.time(),
            ports=dict(ports or {}), taken=list(taken or []), check=check,
            restarts=restarts, seq=self.sent)
        if type_ in NODE_ENDS:
            self._ended.append((time.monotonic(), msgspec.structs.replace(
                event, detail=detail[-ENDED_DETAIL:])))
        return event

    def recent_ends(self) -> list[Event]:
        """The ends sent within `keep_s` (rule 2)."""
        since = time.monotonic() - self.keep_s
        return [e for at, e in self._ended if at >= since]
