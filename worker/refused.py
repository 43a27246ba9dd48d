"""What a node's guards refuse: counted, and logged without flooding the log."""

from __future__ import annotations

import collections
import logging

from gavel.transport.rejects import Throttle

__all__ = ["Refused"]


class Refused:
    """The guards' sink on a node (`transport.inbound.Sink`): counted per endpoint and per
    reason; the log gets one line per reason (and peer, where one is named) a minute
    (`transport.rejects.Throttle`)."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.malformed_kinds: collections.Counter[str] = collections.Counter()
        self.ignored: collections.Counter[str] = collections.Counter()
        self.throttle = Throttle()

    def malformed(self, what: str, subject: str, exc: Exception, peer: str = "") -> None:
        self.malformed_kinds[what] += 1
        line = self.throttle.admit(f"malformed {what}", peer)
        if line is not None:
            self.log.warning("malformed %s on %s dropped (%s); %s", what, subject, exc,
                        self.throttle.note(line[0]))

    def count(self, why: str, what: str, peer: str = "") -> None:
        self.ignored[why] += 1
        line = self.throttle.admit(why, peer)
        if line is not None:
            self.log.info("ignored %s: %s; %s", why, what, self.throttle.note(line[0]))
        else:
            self.log.debug("ignored %s: %s", why, what)

