"""The after-commit lane: what a landed commit promised, carried out once it is durable.

Rules:
1. Nothing is carried out before its commit is durable: with `durable` (a leader of several
   brokers, `broker.ledger.committer` rule 10) once a push covering it was accepted, and
   `on_durable` (the KV mirror) hears of each commit before any of its effects runs;
   without, as it lands. Commits become durable in the order they landed.
2. As a commit becomes durable, each plan's leading prompt effects (`broker.effects` rule 5:
   its answers and wake-ups, up to the first effect of another kind) run at once, ahead of
   what earlier commits still have to carry out: a request is answered, and the next pass
   auctions what it submitted, as soon as its commit is durable, not after the thousands
   of awards that landed before it went out (docs/performance.md). One listed after
   another effect waits for it: what a plan tells before it answers is told first.
3. The rest run in commit order, then in the order each plan listed them, on a task of
   their own in slices of `slice_s` with the loop's other work between them (a commit of
   thousands of awards must not stall the bid replies of open auctions; `None` runs a
   commit's effects in one go, the alternative the slices are measured against:
   docs/performance.md), while the next commit is already being planned and written.
4. An effect that fails is logged with its commit: one broken promise does not keep the
   later ones back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from gavel.broker.effects import Effect, Effects, prompt
from gavel.broker.ledger.state import Change

__all__ = ["AFTER_SLICE_S", "AfterLane", "Durable"]

log = logging.getLogger("gavel.ledger")

#: Rule 3: after-commit work runs in slices of this many seconds, with the loop's other work
#: (bid replies above all) in between, so a large group commit does not stall open auctions.
#: Shorter slices keep the slowest bid rounds shorter, and the yields between them cost the
#: broker no CPU a placement worth counting (docs/performance.md).
AFTER_SLICE_S = 0.0005


class Durable(Protocol):
    """Rule 1: where commits become durable off this host (the pusher)."""

    def mark(self) -> int:
        """A token for every commit written so far."""
        ...

    async def wait(self, mark: int) -> None:
        """Return once the commits `mark` covers are durable."""
        ...


T = TypeVar("T")
#: One landed commit: each plan's effects, the commit, its change (None: nothing written).
_Landed = tuple[list[list[Effect]], str, Change | None]


class AfterLane:
    """Rules 1-4 for one committer's commits."""

    def __init__(self, effects: Effects, slice_s: float | None = AFTER_SLICE_S,
                 durable: Durable | None = None,
                 on_durable: Callable[[Change, str], None] | None = None) -> None:
        self.effects = effects
        self.slice_s = slice_s
        self.durable = durable
        self.on_durable = on_durable
        #: Rule 1: landed and waiting to be durable, oldest first, with its `durable` mark.
        self._landing: deque[tuple[_Landed, int]] = deque()
        self._landing_kick = asyncio.Event()
        #: Rule 3: durable, the effects left after the prompt ones, oldest first.
        self._left: deque[tuple[list[list[Effect]], str]] = deque()
        self._left_kick = asyncio.Event()

    def landed(self, effects: list[list[Effect]], sha: str, change: Change | None) -> None:
        """A commit landed (`change` None: its plans decided without writing)."""
        if self.durable is None:
            self._durable((effects, sha, change))
        else:
            self._landing.append(((effects, sha, change), self.durable.mark()))
            self._landing_kick.set()

    @property
    def busy(self) -> bool:
        """Some landed commit has effects not yet carried out."""
        return bool(self._landing or self._left)

    async def run(self, drained: Callable[[], None]) -> None:
        """Carry out what lands until cancelled; `drained` hears each time nothing is left."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._serve(self._landing, self._landing_kick,
                                          self._become_durable, drained), name="durable")
            group.create_task(self._serve(self._left, self._left_kick, self._in_slices,
                                          drained), name="after-commit")

    async def _serve(self, queue: deque[T], kick: asyncio.Event,
                     handle: Callable[[T], Awaitable[None]],
                     drained: Callable[[], None]) -> None:
        """Handle `queue`'s entries oldest first, each left in it until handled."""
        while True:
            await kick.wait()
            kick.clear()
            while queue:
                await handle(queue[0])
                queue.popleft()
            if not self.busy:
                drained()

    async def _become_durable(self, entry: tuple[_Landed, int]) -> None:
        landed, mark = entry
        if self.durable is not None:
            await self.durable.wait(mark)
        self._durable(landed)

    def _durable(self, landed: _Landed) -> None:
        """Rules 1 and 2: the mirror hears of it, the prompt effects run, the rest queue."""
        effects, sha, change = landed
        if change is not None and self.on_durable is not None:
            self.on_durable(change, sha)
        left = []
        for listed in effects:
            first = prompt(listed)
            for effect in listed[:first]:
                self._run(effect, sha)
            left.append(listed[first:] if first else listed)  # no copy of a commit's awards
        self._left.append((left, sha))
        self._left_kick.set()

    async def _in_slices(self, entry: tuple[list[list[Effect]], str]) -> None:
        """Rule 3: a commit's effects in order, in slices of `slice_s` (None: in one go)."""
        effects, sha = entry
        slice_s = self.slice_s
        deadline = time.perf_counter() + slice_s if slice_s is not None else float("inf")
        for listed in effects:
            for effect in listed:
                self._run(effect, sha)
                if time.perf_counter() >= deadline:
                    await asyncio.sleep(0)
                    deadline = time.perf_counter() + (slice_s or 0.0)

    def _run(self, effect: Effect, sha: str) -> None:
        try:
            self.effects.run(effect, sha)
        except Exception:  # rule 4
            log.exception("effect %r of %s failed", effect, sha[:12] or "no commit")
