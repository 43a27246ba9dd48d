"""Batch arrays: a job with ``count = N`` runs N tasks (``ID-1`` .. ``ID-N``), at most
`parallelism` at once. Pure: the broker passes in the task records it holds.

Rules:
1. Every task is an instance record from the submission on (durable intent: a broker started
   again carries on from git); a task past the parallelism is *held* (`InstanceRecord.held`)
   and is never auctioned until released. `release` says how many to release now: enough to
   bring the running tasks (released and not ended) back to `parallelism`, lowest index first.
2. A task is retried as any job is: restarts in place, then new placements within its
   `attempts`. A task that still ends failed (or lost) spends one of the array's
   `max_failures` and, while the budget holds, runs again as a new instance ``ID-K-rM`` (its
   M-th run), held like any task until a slot frees (`retries`). The default,
   `DEFAULT_MAX_FAILURES`, is 0: the first such failure stops the array - a task that failed
   through all its own retries points at the job, not at luck. Past the budget nothing is
   released or run again, the held tasks are cancelled (`Reason.ARRAY_FAILED`), and the
   running ones finish.
3. A task is where its latest run is. The array has ended when no task is held, running or
   due to run again; it succeeded when every task did. Its outcome names how many tasks
   failed and the first failure's reason (the earliest end).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gavel.shared.messages import InstanceState
from gavel.shared.reasons import render
from gavel.shared.records import InstanceRecord
from gavel.shared.spec import Spec

__all__ = ["DEFAULT_MAX_FAILURES", "Tally", "release", "run_of", "tally", "to_release"]

#: Tasks that may end failed before an array stops, when the spec does not say (rule 2).
DEFAULT_MAX_FAILURES = 0

_FAILED = frozenset({InstanceState.FAILED, InstanceState.LOST})


@dataclass(frozen=True)
class Tally:
    """An array's tasks by where their latest run is (rule 3)."""

    count: int
    parallelism: int
    max_failures: int
    succeeded: int = 0
    #: Tasks whose latest run failed (or was lost).
    failed: int = 0
    cancelled: int = 0
    running: int = 0
    held: int = 0
    #: Failed runs, every one (what the budget counts, rule 2).
    failures: int = 0
    #: The first run to fail, and why (its id, reason and detail as one sentence).
    first_failure: str = ""
    #: Tasks to run again (rule 2), as the id of their next run; none once spent.
    retries: tuple[str, ...] = ()

    @property
    def spent(self) -> bool:
        """More runs failed than the budget allows (rule 2)."""
        return self.failures > self.max_failures

    @property
    def ended(self) -> bool:
        return self.held == 0 and self.running == 0 and not self.retries

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
            parts += f", {self.running} running, {self.held + len(self.retries)} pending"
        return parts


def run_of(iid: str) -> tuple[int, int]:
    """A task's index and run: ``ID-7`` is (7, 1), ``ID-7-r3`` (7, 3); (0, 0) for neither."""
    head, _, tail = iid.rpartition("-")
    run = 1
    if tail.startswith("r") and tail[1:].isdigit():
        run = int(tail[1:])
        head, _, tail = head.rpartition("-")
    return (int(tail), run) if tail.isdigit() else (0, 0)


def tally(spec: Spec, tasks: Iterable[InstanceRecord], array: str = "") -> Tally:
    """Count `tasks` (the array's records the state still holds), each task at its latest
    run; `array`: the array's id, to name the retries (none without it)."""
    latest: dict[int, tuple[int, InstanceRecord]] = {}
    failures = 0
    first: tuple[str, str, str] | None = None
    for rec in tasks:
        k, run = run_of(rec.instance_id)
        if k not in latest or run > latest[k][0]:
            latest[k] = (run, rec)
        if rec.state in _FAILED:
            failures += 1
            key = (rec.ended_at or "~", rec.instance_id, render(rec.reason, rec.detail)
                   or str(rec.state))
            first = key if first is None or key < first else first
    budget = spec.max_failures if spec.max_failures is not None else DEFAULT_MAX_FAILURES
    counts = {"succeeded": 0, "failed": 0, "cancelled": 0, "running": 0, "held": 0}
    retries: list[str] = []
    for k, (run, rec) in sorted(latest.items()):
        if rec.held and not rec.state.terminal:
            counts["held"] += 1
        elif not rec.state.terminal:
            counts["running"] += 1
        elif rec.state is InstanceState.SUCCEEDED:
            counts["succeeded"] += 1
        elif rec.state in _FAILED:
            counts["failed"] += 1
            if array and failures <= budget:
                retries.append(f"{array}-{k}-r{run + 1}")
        else:
            counts["cancelled"] += 1
    return Tally(count=spec.count, parallelism=spec.parallelism or spec.count,
                 max_failures=budget, failures=failures, retries=tuple(retries),
                 first_failure=f"{first[1]}: {first[2]}" if first else "", **counts)


def release(t: Tally) -> int:
    """How many held tasks to release now (rule 1); 0 once the budget is spent (rule 2)."""
    if t.spent:
        return 0
    return max(0, min(t.held, t.parallelism - t.running))


def to_release(held: Iterable[str], n: int) -> list[str]:
    """Which `n` of the held task ids go first: the lowest index (``ID-2`` before ``ID-10``,
    a run again in its task's place)."""
    return sorted(held, key=lambda iid: (run_of(iid), iid))[:max(0, n)]
