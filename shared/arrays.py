"""Batch arrays: a job with ``count = N`` runs N tasks (``ID-1`` .. ``ID-N``), at most
`parallelism` at once. Pure: the broker passes in the task records it holds.

Rules:
1. Every task is an instance record from the submission on (durable intent: a broker started
   again carries on from git); a task past the parallelism is *held* (`InstanceRecord.held`)
   and is never auctioned until released. `release` says how many to release now: enough to
   bring the running tasks (released and not ended) back to `parallelism`, lowest index first.
2. A task is retried as any job is: restarts in place, then new placements within its
   `attempts`. A task that still ends failed (or lost) spends one of the array's
   `max_failures` (default `DEFAULT_MAX_FAILURES`: the first such failure stops the array -
   a task that failed through all its own retries points at the job, not at luck). Past the
   budget no task is released and the held ones are cancelled (`Reason.ARRAY_FAILED`); the
   running ones finish.
3. The array has ended when no task is held or running; it succeeded when every task did.
   Its outcome names how many failed and the first failure's reason (the earliest end).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gavel.shared.messages import InstanceState
from gavel.shared.reasons import render
from gavel.shared.records import InstanceRecord
from gavel.shared.spec import Spec

__all__ = ["DEFAULT_MAX_FAILURES", "Tally", "release", "tally", "to_release"]

#: Tasks that may end failed before an array stops, when the spec does not say (rule 2).
DEFAULT_MAX_FAILURES = 0

_FAILED = frozenset({InstanceState.FAILED, InstanceState.LOST})


@dataclass(frozen=True)
class Tally:
    """An array's tasks by where they are (rule 3)."""

    count: int
    parallelism: int
    max_failures: int
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    running: int = 0
    held: int = 0
    #: The first task to fail, and why (its reason and detail as one sentence).
    first_failure: str = ""

    @property
    def spent(self) -> bool:
        """More tasks failed than the budget allows (rule 2)."""
        return self.failed > self.max_failures

    @property
    def ended(self) -> bool:
        return self.held == 0 and self.running == 0

    @property
    def ok(self) -> bool:
        return self.ended and self.succeeded == self.count

    def outcome(self) -> str:
        """One sentence: how the array stands or how it ended."""
        parts = f"{self.succeeded}/{self.count} succeeded"
        if self.failed:
            parts += f", {self.failed} failed (first: {self.first_failure})"
        if self.cancelled:
            parts += f", {self.cancelled} cancelled"
        if not self.ended:
            parts += f", {self.running} running, {self.held} pending"
        return parts


def tally(spec: Spec, tasks: Iterable[InstanceRecord]) -> Tally:
    """Count `tasks` (the array's records that the state still holds)."""
    counts = {"succeeded": 0, "failed": 0, "cancelled": 0, "running": 0, "held": 0}
    first: tuple[str, str, str] | None = None
    for rec in tasks:
        if rec.held and not rec.state.terminal:
            counts["held"] += 1
        elif not rec.state.terminal:
            counts["running"] += 1
        elif rec.state is InstanceState.SUCCEEDED:
            counts["succeeded"] += 1
        elif rec.state in _FAILED:
            counts["failed"] += 1
            key = (rec.ended_at or "~", rec.instance_id, render(rec.reason, rec.detail)
                   or str(rec.state))
            first = key if first is None or key < first else first
        else:
            counts["cancelled"] += 1
    budget = spec.max_failures if spec.max_failures is not None else DEFAULT_MAX_FAILURES
    return Tally(count=spec.count, parallelism=spec.parallelism or spec.count,
                 max_failures=budget, first_failure=f"{first[1]}: {first[2]}" if first else "",
                 **counts)


def release(t: Tally) -> int:
    """How many held tasks to release now (rule 1); 0 once the budget is spent (rule 2)."""
    if t.spent:
        return 0
    return max(0, min(t.held, t.parallelism - t.running))


def to_release(held: Iterable[str], n: int) -> list[str]:
    """Which `n` of the held task ids go first: the lowest index (``ID-2`` before ``ID-10``)."""
    def index(iid: str) -> tuple[int, str]:
        tail = iid.rpartition("-")[2]
        return (int(tail) if tail.isdigit() else 0, iid)
    return sorted(held, key=index)[:max(0, n)]
