"""Counting what the broker refuses from the wire.

Rule: every rejected message is counted under a fixed kind; the first of each kind is
logged with its subject, later ones only counted — a flood of garbage cannot flood the log.
"""

from __future__ import annotations

import logging
from typing import Any

from gavel.shared.messages import OTHER_PROTOCOL

__all__ = ["Rejects"]


class Rejects:
    def __init__(self, log: logging.Logger, counter: Any = None) -> None:
        self.log = log
        self.counter = counter  # a labelled prometheus Counter, or None
        self.counts: dict[str, int] = {}

    def malformed(self, what: str, subject: str, exc: Exception) -> None:
        """Count an undecodable message: as one of another protocol version when that is
        why (a mixed-version cluster must say so), else as a malformed `what`."""
        if OTHER_PROTOCOL in str(exc):
            self.count("message of another protocol version", f"{subject} ({exc})")
        else:
            self.count(f"malformed {what}", subject)

    def count(self, kind: str, subject: str) -> None:
        n = self.counts.get(kind, 0) + 1
        self.counts[kind] = n
        if self.counter is not None:
            self.counter.labels(kind=kind).inc()
        if n == 1:
            self.log.warning("rejected %s on %s (logged once; counted after)", kind, subject)
