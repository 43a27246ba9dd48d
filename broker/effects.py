"""Effects as data: what follows a broker decision once its commit is durable.

Rules:
1. A plan returns the change it made to a `View` and the effects that follow it, as values
   (`broker.ledger.committer.Planned.effects`): publish this message, emit this event,
   answer this request, release this instance's hold, arm this timer — or a part's own
   value for what it must note once the change landed. Values can be printed, compared and
   tested: a plan is tested as a pure function of the view it reads.
2. The committer is the one executor: it commits the change and, once it is durable
   (pushed, with HA), hands each plan's effects to `Effects.run` in commit order, then in
   the order the plan listed them. Nothing is told before it is durable, in this one place.
3. `Effects` carries out each kind of effect by the one handler registered for it: the
   world's (`world`: the outbox, the event log, the promise clocks) and a part's own
   (`Release` by the promises, a part's own values by that part). A kind registered twice
   is a bug, refused at once; an effect of a kind nobody handles is logged, never raised,
   so one missing handler does not keep the effects after it back.
4. What an item does if its commit is given up for good is effects too (`Item.gave_up`),
   carried out by the same handlers; one that must say why is a `Why`, whose `reason` and
   `detail` the committer fills in (`Refuse`: the waiting request is answered with them).
5. An `Answer` and a `Wake` depend on nothing but their commit being durable: those a plan
   lists first (before any effect of another kind, `prompt`) run as soon as the commit is
   durable, ahead of what earlier commits still have to carry out
   (`broker.ledger.afterlane` rule 2); the rest keep commit order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

import msgspec

from gavel.broker.events import Events
from gavel.broker.outbox import Outbox
from gavel.broker.watchdog import Timers
from gavel.shared.messages import ApiError, EventType

__all__ = ["PROMPT", "Answer", "Arm", "Effect", "Effects", "Emit", "Publish", "Refuse", "Release",
           "Timer", "Wake", "Why", "prompt", "world"]

log = logging.getLogger("gavel.broker")


@dataclass(frozen=True)
class Publish:
    """Put `message` on `subject` (through the outbox, in order)."""

    subject: str
    message: msgspec.Struct


@dataclass(frozen=True)
class Emit:
    """Record and publish an instance event; its time is when it goes out."""

    instance_id: str
    type: EventType
    node_id: str = ""
    reason: str = ""
    detail: str = ""


@dataclass(frozen=True)
class Answer:
    """Answer a request that waits for the commit (unless it was answered already)."""

    waiter: asyncio.Future[Any]
    message: msgspec.Struct | None


@dataclass(frozen=True, kw_only=True)
class Why:
    """Rule 4: an effect of giving up that hears why; the committer fills these in."""

    reason: str = ""
    detail: str = ""


@dataclass(frozen=True)
class Refuse(Why):
    """Answer a request whose commit was given up with why (unless it was answered)."""

    waiter: asyncio.Future[Any]


@dataclass(frozen=True)
class Release:
    """The instance holds nothing of the broker's any more: its clocks and notes go, and
    waiting work may fit in the room it leaves."""

    instance_id: str


class Timer(StrEnum):
    #: The grace a node has to confirm a cancel (`Timing.cancel_grace_s`).
    CANCEL_GRACE = "cancel grace"


@dataclass(frozen=True)
class Arm:
    """Start one of an instance's promise clocks, from the moment the effect runs."""

    timer: Timer
    instance_id: str
    node_id: str


@dataclass(frozen=True)
class Wake:
    """Run the broker's next pass now: the commit may leave work for it (a submission to
    auction, a service to keep)."""


#: Any effect: the world's kinds above, or a part's own frozen dataclass.
Effect = object
E = TypeVar("E")
#: Rule 5: the kinds that depend on nothing but their commit being durable.
PROMPT = (Answer, Wake)


def prompt(listed: Sequence[Effect]) -> int:
    """Rule 5: how many of `listed`, from its first, are prompt."""
    first = 0
    while first < len(listed) and type(listed[first]) in PROMPT:
        first += 1
    return first


class Effects:
    """Rule 3: one handler per kind of effect."""

    def __init__(self) -> None:
        self._handlers: dict[type, Callable[[Any, str], None]] = {}

    def on(self, kind: type[E], handler: Callable[[E, str], None]) -> None:
        """`handler(effect, sha)` carries out every effect of `kind` (sha: the commit's)."""
        if kind in self._handlers:
            raise ValueError(f"effects of kind {kind.__name__} already have a handler")
        self._handlers[kind] = handler

    def handles(self, kind: type) -> bool:
        return kind in self._handlers

    def run(self, effect: Effect, sha: str) -> None:
        handler = self._handlers.get(type(effect))
        if handler is None:
            log.error("no handler for the effect %r of commit %s", effect, sha[:12])
            return
        handler(effect, sha)


def world(effects: Effects, outbox: Outbox, events: Events, timers: Timers,
          now: Callable[[], float], wake: Callable[[], None] = lambda: None) -> None:
    """Register the handlers of the world's effects: messages, events, answers, clocks,
    and the broker's next pass."""
    effects.on(Publish, lambda e, _sha: outbox.publish(e.subject, e.message))
    effects.on(Emit, lambda e, _sha: events.emit(e.instance_id, e.type, node_id=e.node_id,
                                                 reason=e.reason, detail=e.detail))
    effects.on(Answer, _answer)
    effects.on(Refuse, _refuse)
    effects.on(Arm, lambda e, _sha: _arm(timers, e, now()))
    effects.on(Wake, lambda _e, _sha: wake())


def _answer(e: Answer, _sha: str) -> None:
    if not e.waiter.done():
        e.waiter.set_result(e.message)


def _refuse(e: Refuse, _sha: str) -> None:
    if not e.waiter.done():
        e.waiter.set_result(ApiError(error=f"{e.reason} ({e.detail})"))


def _arm(timers: Timers, e: Arm, now: float) -> None:
    match e.timer:
        case Timer.CANCEL_GRACE:
            timers.cancelling(e.instance_id, e.node_id, now)
