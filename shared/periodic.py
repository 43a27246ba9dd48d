"""Periodic jobs: a job with a `schedule` (cron, `gavel.shared.cron`) whose every run is an
ordinary job instance the broker submits at its time. Pure: the broker passes in `now`, the
job's position and whether an earlier run still runs; the simulator could do the same.

Rules:
1. The schedule's position is the fire time of the latest run made or skipped
   (`PeriodicRecord.last_run`), or, before the first, the time the job was submitted:
   nothing before it is due. The position is committed with each run's record, in one
   commit, so a broker started again resumes from git and makes no run twice; a run's id
   is its job's name and its fire time, so one fire time can never make two instances.
2. Due: the fire times after the position up to `now`. At most one run is made per
   decision, for the latest of them.
3. Catch-up: fire times that passed while no broker led (or the broker could not act) are
   not each run: the latest runs once, as soon as a broker leads again, and the earlier
   ones are counted in its history entry as missed. A job that runs nightly still runs
   after an outage (the run that was due is late, not lost), while a backlog of every
   missed run at once would put N copies of one job on the fleet together, each doing
   the work the next one repeats (Nomad makes at most one catch-up run for the same reason).
4. Overlap: with ``skip`` (the default) a fire time that comes while an earlier run of the
   job is still live (not ended) is skipped, with its reason, and the position moves on:
   a run that takes longer than its period does not pile up copies of itself. With
   ``allow`` it runs all the same.
5. A stopped job (`gavel cancel NAME`) makes nothing; its history stays.
6. The history keeps the latest `HISTORY` entries, newest last, and every older run that
   has not ended (overlap is judged from it: a long run must not fall out of the history
   behind its own skips).
"""

from __future__ import annotations

from dataclasses import dataclass

from gavel.shared.cron import OVERLAP, fires_after, latest_at_or_before, stamp
from gavel.shared.reasons import Reason

__all__ = ["HISTORY", "MISSED_MAX", "OVERLAP", "Due", "decide", "next_fire", "run_id"]

#: History entries a periodic job keeps (rule 6).
HISTORY = 10
#: Missed fire times counted one by one at most (rule 3); more are reported as this many.
MISSED_MAX = 1000


@dataclass(frozen=True)
class Due:
    """What a decision makes of a due fire time."""

    #: The fire time acted on: the new position (rule 1).
    at: int
    #: Why the run at `at` is skipped instead of made (rule 4); None: it runs.
    skipped: Reason | None = None
    #: Earlier fire times collapsed into this one (rule 3), at most `MISSED_MAX`.
    missed: int = 0


def decide(schedule: str, time_zone: str | None, overlap: str | None, position: int,
           now: int, *, live: bool, stopped: bool = False) -> Due | None:
    """What the job does at `now` (rules 1-5): None for nothing; `live`: an earlier run of
    the job has not ended."""
    if stopped:
        return None
    latest = latest_at_or_before(schedule, time_zone, now)
    if latest is None or latest <= position:
        return None
    missed = 0
    at = fires_after(schedule, time_zone, position)
    while at is not None and at < latest and missed < MISSED_MAX:
        missed += 1
        at = fires_after(schedule, time_zone, at)
    if live and (overlap or OVERLAP[0]) == "skip":
        return Due(at=latest, skipped=Reason.PERIODIC_OVERLAP, missed=missed)
    return Due(at=latest, missed=missed)


def next_fire(schedule: str, time_zone: str | None, position: int, now: int) -> int | None:
    """When the job next fires after both its position and `now` (what status shows)."""
    return fires_after(schedule, time_zone, max(position, now))


def run_id(name: str, at: int) -> str:
    """The id of the run of job `name` for fire time `at`: ``nightly-20261202t020000z``
    (rule 1: one fire time, one id)."""
    return f"{name}-" + stamp(at).replace("-", "").replace(":", "").lower()
