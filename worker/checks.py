"""An instance's health from its checks: a sans-IO state machine, fed results and `now`.

One machine watches one run of a process (a restart starts a new one). It says which checks
are due and when the next one is; the shell (`worker.probes.Prober`) runs them and hands
the results back.

Rules:
1. No check runs before `grace_s` after the process started; from then on each runs every
   `interval_s` (counted from the start of its previous run), never two runs of one check at
   once: a check still running when it is due again runs as soon as it has answered.
2. The instance is `checking` until every check has passed once, then `healthy`.
3. `failures` consecutive failures of one check make it `unhealthy`, from checking or
   healthy alike; unhealthy is final for this run (the supervisor restarts the process, or
   hands the instance back) and its change names the check and carries its last output.
4. No checks: healthy from the start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gavel.shared.messages import Health
from gavel.shared.spec import Check

__all__ = ["OUTPUT_MAX", "Change", "CheckMachine"]

#: A check's output is kept (and reported) up to this many characters.
OUTPUT_MAX = 512


@dataclass(frozen=True)
class Change:
    """The instance's health changed: to what, and for ``unhealthy`` the check's label and
    its last output."""

    health: Health
    check: str = ""
    output: str = ""


@dataclass
class _Check:
    check: Check
    next_at: float
    busy: bool = False
    passed: bool = False
    failures: int = 0
    output: str = ""


class CheckMachine:
    """The checks of one run of a process that started at `started` (the caller's clock)."""

    def __init__(self, checks: Sequence[Check], started: float) -> None:
        self._checks = [_Check(c, next_at=started + c.grace_s) for c in checks]
        self.health = Health.HEALTHY if not checks else Health.CHECKING

    @property
    def final(self) -> bool:
        return self.health is Health.UNHEALTHY

    def due(self, now: float) -> list[int]:
        """The checks to run now (rule 1), by index; each is running until its `result`."""
        if self.final:
            return []
        out = []
        for i, c in enumerate(self._checks):
            if not c.busy and now >= c.next_at:
                c.busy = True
                c.next_at = now + c.check.interval_s
                out.append(i)
        return out

    def wake_at(self) -> float | None:
        """When the next check is due; None when none can be (all running, or final)."""
        if self.final:
            return None
        times = [c.next_at for c in self._checks if not c.busy]
        return min(times) if times else None

    def result(self, i: int, ok: bool, output: str) -> Change | None:
        """Check `i` answered; the change of health it makes, if any (rules 2 and 3)."""
        c = self._checks[i]
        c.busy = False
        if self.final:
            return None
        c.output = output[:OUTPUT_MAX]
        if ok:
            c.passed, c.failures = True, 0
        else:
            c.failures += 1
            if c.failures >= c.check.failures:
                self.health = Health.UNHEALTHY
                return Change(Health.UNHEALTHY, c.check.label, c.output)
        if self.health is Health.CHECKING and all(x.passed for x in self._checks):
            self.health = Health.HEALTHY
            return Change(Health.HEALTHY)
        return None
