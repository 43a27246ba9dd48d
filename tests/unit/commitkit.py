"""A test's own effects, as a part defines them (`broker.effects` rule 3): `Then(fn)` calls
`fn(sha)` once its commit is durable, `Failed(fn)` calls `fn(reason, detail)` when it is
given up for good, so a committer test observes when, in what order and why the committer
carries effects out; `Gate` is a `Durable` whose pushes land when the test says so."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from gavel.broker.effects import Why
from gavel.broker.ledger.committer import Committer

__all__ = ["Failed", "Gate", "Then", "heard"]


@dataclass(frozen=True)
class Then:
    fn: Callable[[str], None]


@dataclass(frozen=True)
class Failed(Why):
    fn: Callable[[str, str], None]


def heard(committer: Committer) -> Committer:
    """`committer`, carrying out `Then` and `Failed` effects."""
    committer.effects.on(Then, lambda e, sha: e.fn(sha))
    committer.effects.on(Failed, lambda e, _sha: e.fn(e.reason, e.detail))
    return committer


class Gate:
    """A `Durable` whose pushes land when the test says so."""

    def __init__(self) -> None:
        self.notified = 0
        self.landed = 0
        self._moved = asyncio.Event()

    def mark(self) -> int:
        return self.notified

    async def wait(self, mark: int) -> None:
        while self.landed < mark:
            self._moved.clear()
            await self._moved.wait()

    def land(self) -> None:
        self.landed = self.notified
        self._moved.set()
