"""What the broker's parts share, and only that.

Rule: a part of the broker - the auctioneer, the promises, the API, retention, metrics - takes
this context and the few collaborators it calls by name, never the `Broker` itself: what a
part can touch is what its constructor says, and no part imports the service that holds them
all (the service imports the parts, never the other way round).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gavel.broker.effects import world
from gavel.broker.events import Events
from gavel.broker.ledger.committer import Committer, Durable
from gavel.broker.ledger.repository import Ledger
from gavel.broker.metrics import Metrics
from gavel.broker.outbox import Outbox
from gavel.broker.watchdog import Timers
from gavel.shared.health import Liveness
from gavel.shared.timing import Timing
from gavel.transport.rejects import Rejects

__all__ = ["Context", "Leadership"]


def _always() -> bool:
    return True


async def _confirmed() -> bool:
    return True


@dataclass(eq=False)
class Leadership:
    """Who leads, since when (UTC, ISO 8601) and in which epoch: what the API and the metrics
    say. Without HA the broker leads alone, in epoch 0, for as long as it runs; with HA
    (`broker.ha`) `leading` is its lease's own-clock verdict, asked before the broker
    speaks for the leader at all, and `epoch` goes on every award, cancel and KV entry."""

    broker_id: str
    epoch: int = 0
    since: str = ""
    leading: Callable[[], bool] = field(default=_always)
    #: With HA, asks the lease server whether we still lead (a renewal now): for a
    #: surprise that may mean another broker leads (`broker.fencedkv` rule 3).
    confirm: Callable[[], Awaitable[bool]] = field(default=_confirmed)
    #: Set with HA: the broker answers and publishes only while `leading()`.
    ha: bool = False


@dataclass(eq=False)
class Context:
    timing: Timing
    #: The state repository and the group committer that writes it.
    ledger: Ledger
    committer: Committer
    #: Node health from heartbeats, and the per-instance promise clocks.
    liveness: Liveness
    timers: Timers
    #: Out: messages (in order) and instance events.
    outbox: Outbox
    events: Events
    #: Counted: what the wire sent that was refused, and the Prometheus registry.
    rejects: Rejects
    metrics: Metrics
    #: The broker's clock (injectable: tests and replays run it) and its reconcile kick.
    now: Callable[[], float]
    wake: Callable[[], None]
    log: logging.Logger
    #: Who leads (`Leadership`), and with HA where commits become durable off this host:
    #: what the broker tells a node waits for it (`broker.ledger.committer` rule 10).
    leader: Leadership = field(default_factory=lambda: Leadership(broker_id=""))
    durable: Durable | None = None

    def __post_init__(self) -> None:
        # The committer carries out the world's effects through this context's outbox,
        # event log and promise clocks (`broker.effects` rule 3); the parts add their own.
        world(self.committer.effects, self.outbox, self.events, self.timers, self.now,
              self.wake)
