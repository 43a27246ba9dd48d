"""Counting what a role refuses from the wire, and how much of it reaches the log.

Rules:
1. Every rejected message is counted under a fixed kind (and in the Prometheus counter, by
   kind); the counts never reset.
2. The log gets one line per (kind, peer) per `interval_s`: the first at once, later ones
   only counted until the interval has passed, when the next one is logged with how many
   went unlogged since. The peer is the node a per-node subject names
   (`gavel.shared.subjects.peer_of`), or whoever the caller names (the requester, for a
   reply). A flood of garbage cannot flood the log, and one noisy node cannot hide another.
3. The log keeps track of at most `MAX_TRACKED` (kind, peer) pairs: past that, pairs not
   logged within an interval are forgotten, and if all are recent a new peer shares the
   line of "other peers" — senders that name a new peer on every message cannot grow it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from gavel.shared import subjects
from gavel.shared.messages import OTHER_PROTOCOL

__all__ = ["INTERVAL_S", "MAX_TRACKED", "OTHERS", "Rejects", "Throttle"]

#: One log line per (kind, peer) in this many seconds (rule 2).
INTERVAL_S = 60.0
#: (kind, peer) pairs the throttle remembers (rule 3).
MAX_TRACKED = 1024
#: The peer of every line past rule 3's limit.
OTHERS = "other peers"


class Throttle:
    """Rules 2 and 3: whether a (kind, peer) may log now, and how many it held back."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 interval_s: float = INTERVAL_S) -> None:
        self.clock = clock
        self.interval_s = interval_s
        #: (kind, peer) -> [when its last line was logged, how many since went unlogged].
        self._last: dict[tuple[str, str], list[float]] = {}

    def admit(self, kind: str, peer: str) -> tuple[int, str] | None:
        """None: stay quiet (counted as held back). Else log now: how many were held back
        since this pair's last line, and the peer the line speaks for (`peer`, or "other
        peers" past rule 3's limit)."""
        now = self.clock()
        key = (kind, peer)
        seen = self._last.get(key)
        if seen is None:
            if len(self._last) >= MAX_TRACKED:
                self._forget(now)
            if len(self._last) >= MAX_TRACKED and peer != OTHERS:
                return self.admit(kind, OTHERS)  # one line per kind for them all
            self._last[key] = [now, 0]
            return 0, peer
        if now - seen[0] < self.interval_s:
            seen[1] += 1
            return None
        held = int(seen[1])
        seen[0], seen[1] = now, 0
        return held, peer

    def note(self, held: int) -> str:
        """The tail of a log line `admit` let through: how many went unlogged since."""
        more = f"{held} more since its last line; " if held else ""
        return f"{more}one line per kind and peer every {self.interval_s:g}s, all counted"

    def _forget(self, now: float) -> None:
        for key in [k for k, (at, _) in self._last.items() if now - at >= self.interval_s]:
            del self._last[key]


class Rejects:
    """The broker's sink for refused messages (`transport.inbound.Sink`)."""

    def __init__(self, log: logging.Logger, counter: Any = None,
                 clock: Callable[[], float] = time.monotonic,
                 interval_s: float = INTERVAL_S) -> None:
        self.log = log
        self.counter = counter  # a labelled prometheus Counter, or None
        self.counts: dict[str, int] = {}
        self.throttle = Throttle(clock, interval_s)

    def malformed(self, what: str, subject: str, exc: Exception, peer: str = "") -> None:
        """Count an undecodable message: as one of another protocol version when that is
        why (a mixed-version cluster must say so), else as a malformed `what`."""
        if OTHER_PROTOCOL in str(exc):
            self.count("message of another protocol version", f"{subject} ({exc})",
                       peer or subjects.peer_of(subject))
        else:
            self.count(f"malformed {what}", subject, peer)

    def count(self, kind: str, subject: str, peer: str = "") -> None:
        """Rule 1, then rule 2 for the log; `peer` defaults to the node `subject` names."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if self.counter is not None:
            self.counter.labels(kind=kind).inc()
        line = self.throttle.admit(kind, peer or subjects.peer_of(subject))
        if line is None:
            return
        held, who = line
        self.log.warning("rejected %s on %s from %s (%s)", kind, subject,
                         who or "an unnamed peer", self.throttle.note(held))
