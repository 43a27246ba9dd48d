"""One pass's commit in flight per name: the shell a part that keeps many things (services,
system jobs) submits its plans through.

Rules:
1. While a name's pass is submitted and not yet landed or given up, no other pass over it
   is submitted (`busy`): a pass plans on the freshest view anyway, and a second one queued
   behind it would only plan the same change again.
2. The name is free again once its pass's commit is durable (`Passed`, after the plan's own
   effects), when its plan found nothing to do (`Passed` its only effect, in commit order),
   or when the commit is given up for good. Planning frees nothing (`plan_pass`): a pass
   re-planned after a conflict still holds its name.
3. A pass's plan may read in steps (committer rule 12); it holds its name meanwhile.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from gavel.broker.ledger.committer import Committer, Item, Plan, Planned, and_then
from gavel.broker.ledger.plan import View
from gavel.broker.steps import Steps

__all__ = ["OnePass", "Passed", "plan_pass"]


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

    def submit(self, name: str, plan: Plan) -> None:
        """Rule 1: `plan` over `name`, in the committer, unless its last pass is in flight."""
        if name in self._busy:
            return
        self._busy.add(name)
        passed = Passed(self, name)
        self._committer.submit(Item(plan=plan_pass(plan, passed), retry=False,
                                    gave_up=[passed]))


def plan_pass(plan: Plan, passed: Passed) -> Callable[[View], Planned | Steps[Planned | None]]:
    """Rule 2: the pass's plan - `plan`'s change and effects, then `passed`; or `passed`
    alone."""
    return functools.partial(and_then, plan=plan, effects=(passed,))
