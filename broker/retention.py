"""Retention: the record of an instance that ended more than `timing.retention_s` ago, or
beyond the newest `ended_max` ended ones, leaves the state repository's tree (git history
keeps it), so a broker placing thousands of instances a second does not hold, read and
rewrite every instance it ever ran. The window is for people (how long `gavel status`
answers); the count bounds memory whatever the rate (at 1,000 ends a second a day's window
is 86 million records, and the broker holds every one in memory).

Rules:
1. An end is stamped once, by the commit that records it (`InstanceRecord.ended_at`, see
   `broker.committer`). A terminal record without a stamp (written by hand, or by an older
   gavel), or with one in the future (a clock stepped back, a typo), counts from when this
   broker first read it - it never holds the others back for longer than the window.
2. A pass walks `State.ended` (end order) from the oldest and stops at the first record still
   inside the window and within the count: it costs what it forgets, never a scan of every
   instance.
3. One forget commit is in flight at a time, at most `FORGET_MAX` records; a full one is
   followed at once by the next pass, so forgetting keeps up with any rate of ends. Its plan
   re-checks each record (still ended, same stamp, in no node.json): a record rewritten
   meanwhile stays.
4. ``retention_s = 0`` and ``ended_max = 0`` keep every record for ever; either alone
   bounds what is kept; a pinned deployment forgets nothing.
5. The forget commit is a pure plan (`plan_forget`): the records it drops and one effect,
   `Forgotten`, which the part notes once the commit is durable (`broker.effects`); a plan
   that finds nothing left to forget has only the empty `Forgotten` (`or_only`), in commit
   order: the next batch is queued once it ran.
6. The ended tasks of a batch array still running are kept (passed over, not a stop of the
   walk): its tally - the failure budget, the outcome `submit --wait` reports - counts them.
   Whether an array still runs is read once a walk (its every task is looked at).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from gavel.broker.context import Context
from gavel.broker.ledger.committer import Item, Planned, or_only
from gavel.broker.ledger.plan import View, forget
from gavel.broker.ledger.state import State, parse_stamp
from gavel.shared.reasons import Reason

__all__ = ["FORGET_MAX", "Forgotten", "Retention", "due", "plan_forget"]

#: Records one forget commit drops at most. A forget commit rewrites the shards it touches
#: whatever it drops from each, so bigger batches are cheaper a record, while the cap bounds
#: the planning and encoding one costs on the loop; a much smaller cap falls behind a broker
#: ending thousands of instances a second (one batch a commit: the ended records kept pile
#: up far past `ended_max`; docs/performance.md).
FORGET_MAX = 5000

#: An ended instance due to leave the tree: its id, the stamp it was judged by, and why.
Due = tuple[str, str, Reason]


@dataclass(frozen=True)
class Forgotten:
    """The effect of a forget commit: `batch` was due, and is out of the tree unless a plan
    re-checking it kept it (rule 3). Empty: the commit was given up, nothing left."""

    batch: tuple[Due, ...]


def plan_forget(view: View, batch: list[Due] | tuple[Due, ...]) -> Planned | None:
    """Rule 3 and 5: drop each record of `batch` still as it was judged; None if none is."""
    lines = []
    for iid, stamp, why in batch:
        rec = forget(view, iid, stamp)
        if rec is not None:
            at = f", ended {stamp}" if stamp else ""
            lines.append(f"forget {iid} ({rec.state}{at}): {why}")
    if not lines:
        return None
    return Planned(lines=lines, effects=[Forgotten(tuple(batch))])


def due(state: State, now: datetime, keep_s: float, first_seen: dict[str, datetime],
        limit: int = FORGET_MAX, keep_max: int = 0) -> list[Due]:
    """The oldest ended instances past the window or beyond the newest `keep_max`, with the
    stamp each was judged by and why (rule 2); a record without a readable stamp is timed
    from `first_seen` (`now` when first met)."""
    excess = len(state.ended) - keep_max if keep_max > 0 else 0
    if keep_s <= 0 and excess <= 0:
        return []
    cutoff = now - timedelta(seconds=keep_s)
    out: list[Due] = []
    live: dict[str, bool] = {}  # batch arrays by id: still running (rule 6)
    for i, iid in enumerate(state.ended):
        if len(out) >= limit:
            break
        rec = state.instances[iid]
        if rec.array:
            running = live.get(rec.array)
            if running is None:  # once an array a walk: a scan of its tasks each
                running = live[rec.array] = _running(state, rec.array)
            if running:
                continue
        stamp = rec.ended_at
        if i < excess:
            out.append((iid, stamp, Reason.RETAINED_MAX))
            continue
        if keep_s <= 0:
            break
        at = parse_stamp(stamp)
        if at is None or at > now:
            at = first_seen.setdefault(iid, now)
        if at > cutoff:
            break
        out.append((iid, stamp, Reason.RETAINED))
    return out


def _running(state: State, array: str) -> bool:
    """A batch array with a task held or not yet ended."""
    return any(r.held or not r.state.terminal for r in state.tasks_of(array))


class Retention:
    def __init__(self, ctx: Context, wall: Callable[[], datetime], ended_max: int) -> None:
        self.ctx = ctx
        self.wall = wall
        #: Ended records kept in the tree at most, newest first (0: no cap).
        self.ended_max = ended_max
        self.forgotten_total = 0
        self._first_seen: dict[str, datetime] = {}
        self._seen_state: State | None = None
        self._busy = False
        ctx.committer.effects.on(Forgotten, self._forgotten)

    def watch(self) -> None:
        """One pass: submit a forget commit for what is due, unless one is in flight."""
        ctx = self.ctx
        if self._busy or ctx.ledger.pinned or (ctx.timing.retention_s <= 0 and self.ended_max <= 0):
            return
        state = ctx.ledger.state()
        now = self.wall()
        if state is not self._seen_state:  # read afresh: time unstamped ends from now on
            self._seen_state = state
            self._first_seen = {k: v for k, v in self._first_seen.items() if k in state.ended}
            for iid in state.ended:
                at = parse_stamp(state.instances[iid].ended_at)
                if at is None or at > now:
                    self._first_seen.setdefault(iid, now)
        batch = due(state, now, ctx.timing.retention_s, self._first_seen,
                    keep_max=self.ended_max)
        if not batch:
            return
        self._busy = True
        ctx.committer.submit(Item(
            plan=functools.partial(or_only, plan=functools.partial(plan_forget, batch=batch),
                                   effects=(Forgotten(()),)),
            gave_up=[Forgotten(())]))

    def _forgotten(self, done: Forgotten, _sha: str) -> None:
        self._busy = False
        state = self.ctx.ledger.state()
        for iid, _stamp, _why in done.batch:
            if iid not in state.instances:
                self._first_seen.pop(iid, None)
                self.forgotten_total += 1
                self.ctx.metrics.forgotten.inc()
        if len(done.batch) >= FORGET_MAX:
            self.watch()  # more may be due: keep up with ends faster than a batch a pass
