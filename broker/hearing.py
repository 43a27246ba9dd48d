"""Whether the broker can hear its nodes, and what an outage does to their clocks.

Rules:
1. The broker is deaf while its node connection is down or its heartbeat feed lost its own
   probes (`shared.health.Deafness`: why, and since when); while deaf, no promise is judged
   (`broker.service` rule 7).
2. When it hears again, every node's silence is shifted by the outage (`shared.health`
   rule 3).
3. The API connection's outage is counted and said, never deafness: operators' requests
   are not what the node clocks run on.
4. Once the broker closes (`closing`), a connection that goes is one it closes: nothing is
   counted or said.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gavel.shared.health import Deafness, Liveness

__all__ = ["Hearing"]


class Hearing:
    def __init__(self, liveness: Liveness, now: Callable[[], float],
                 log: logging.Logger) -> None:
        self.liveness = liveness
        self.now = now
        self.log = log
        self.deafness = Deafness()
        #: Disconnects seen, per connection ("nodes", "api").
        self.disconnects: dict[str, int] = {"nodes": 0, "api": 0}
        self.closing = False

    async def disconnected(self, role: str) -> None:
        if self.closing:  # rule 4
            return
        self.disconnects[role] += 1
        if role != "nodes":  # rule 3
            self.log.warning("lost NATS on the API connection; reconnecting")
        elif self.deafness.begin("connection", self.now()):
            self.log.warning("lost NATS; node clocks pause until it is back")

    async def reconnected(self, role: str) -> None:
        if role != "nodes":
            self.log.info("the API connection is back")
            return
        outage = self.deafness.end("connection", self.now())
        if outage is not None:  # rule 2
            self.liveness.shift(outage)
            self.log.warning("NATS is back after %.1fs; node clocks shifted by it", outage)

    def feed_deaf(self, since: float) -> None:
        if self.deafness.begin("feed", since):
            self.log.warning("the heartbeat feed lost its own probe; node clocks pause "
                             "until it is back")

    def feed_hearing(self) -> None:
        outage = self.deafness.end("feed", self.now())
        if outage is not None:  # rule 2
            self.liveness.shift(outage)
            self.log.warning("the heartbeat feed is back after %.1fs; node clocks shifted "
                             "by it", outage)
