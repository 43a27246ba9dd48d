"""Counting what the broker refuses from the wire.

Rule: every rejected message is counted under a fixed kind; the first of each kind is
logged with its subject, later ones only counted — a flood of garbage cannot flood the log.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["Rejects"]


class Rejects:
    def __init__(self, log: logging.Logger, counter: Any = None) -> None:
        self.log = log
        self.counter = counter  # a labelled prometheus Counter, or None
        self.counts: dict[str, int] = {}

    def count(self, kind: str, subject: str) -> None:
        n = self.counts.get(kind, 0) + 1
        self.counts[kind] = n
        if self.counter is not None:
            self.counter.labels(kind=kind).inc()
        if n == 1:
            self.log.warning("rejected %s on %s (logged once; counted after)", kind, subject)
