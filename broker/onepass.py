"""One pass's commit in flight per name: the shell a part that keeps many things (services,
system jobs) submits its plans through.

Rules:
1. While a name's pass is submitted and not yet landed or given up, no other pass over it
   is submitted (`busy`): a pass plans on the freshest view anyway, and a second one queued
   behind it would only plan the same change again.
2. The name is free again when its plan finds nothing to do, once its commit is durable
   (`Passed`, after the plan's own effects), or when the commit is given up for good.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from gavel.broker.ledger.committer import Committer, Item, Planned
from gavel.broker.ledger.plan import View

__all__ = ["OnePass", "Passed"]


@dataclass(frozen=True, eq=False)
class Passed:
    """Rule 2: the pass over `name` by `owner` is over."""

    owner: OnePass
    name: str


class OnePass:
    def __init__(self, committer: Committer) -> None:
        self._committer = committer
        self._busy: set[str] = set()
        if not committer.effects.handles(Passed):  # one handler for every part's passes
            committer.effects.on(Passed, lambda e, _sha: e.owner.done(e.name))

    def busy(self, name: str) -> bool:
        return name in self._busy

    def done(self, name: str) -> None:
        self._busy.discard(name)

    def submit(self, name: str, plan: Callable[[View], Planned | None]) -> None:
        """Rule 1: `plan` over `name`, in the committer, unless its last pass is in flight."""
        if name in self._busy:
            return
        self._busy.add(name)
        passed = Passed(self, name)
        self._committer.submit(Item(plan=functools.partial(self._pass, plan, passed),
                                    retry=False, gave_up=[passed]))

    def _pass(self, plan: Callable[[View], Planned | None], passed: Passed,
              view: View) -> Planned | None:
        planned = plan(view)
        if planned is None:
            self.done(passed.name)
            return None
        planned.effects.append(passed)
        return planned
