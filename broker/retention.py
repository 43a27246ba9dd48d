"""Retention: the record of an instance that ended more than `timing.retention_s` ago leaves
the state repository's tree (git history keeps it), so a broker placing thousands of
instances a second does not hold, read and rewrite every instance it ever ran.

Rules:
1. An end is stamped once, by the commit that records it (`InstanceRecord.ended_at`, see
   `broker.committer`). A terminal record without a stamp (written by hand, or by an older
   gavel), or with one in the future (a clock stepped back, a typo), counts from when this
   broker first read it - it never holds the others back for longer than the window.
2. A pass walks `State.ended` (end order) from the oldest and stops at the first record still
   inside the window: it costs what it forgets, never a scan of every instance.
3. One forget commit is in flight at a time, at most `FORGET_MAX` records. Its plan re-checks
   each record (still ended, same stamp, in no node.json): a record rewritten meanwhile stays.
4. ``retention_s = 0`` keeps every record for ever; a pinned deployment forgets nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from broker.committer import Item, Planned
from broker.ledger import State, parse_stamp
from broker.plan import View, forget
from shared.reasons import Reason

if TYPE_CHECKING:
    from broker.service import Broker

__all__ = ["FORGET_MAX", "Retention", "due"]

FORGET_MAX = 1000


def due(state: State, now: datetime, keep_s: float, first_seen: dict[str, datetime],
        limit: int = FORGET_MAX) -> list[tuple[str, str]]:
    """The oldest ended instances past the window, with the stamp each was judged by (rule
    2); a record without a readable one is timed from `first_seen` (`now` when first met)."""
    if keep_s <= 0:
        return []
    cutoff = now - timedelta(seconds=keep_s)
    out: list[tuple[str, str]] = []
    for iid in state.ended:
        stamp = state.instances[iid].ended_at
        at = parse_stamp(stamp)
        if at is None or at > now:
            at = first_seen.setdefault(iid, now)
        if at > cutoff or len(out) >= limit:
            break
        out.append((iid, stamp))
    return out


class Retention:
    def __init__(self, broker: Broker, wall: Callable[[], datetime]) -> None:
        self.b = broker
        self.wall = wall
        self.forgotten_total = 0
        self._first_seen: dict[str, datetime] = {}
        self._seen_state: State | None = None
        self._busy = False

    def watch(self) -> None:
        """One pass: submit a forget commit for what is due, unless one is in flight."""
        b = self.b
        if self._busy or b.ledger.pinned or b.timing.retention_s <= 0:
            return
        state = b.ledger.state()
        now = self.wall()
        if state is not self._seen_state:  # read afresh: time unstamped ends from now on
            self._seen_state = state
            self._first_seen = {k: v for k, v in self._first_seen.items() if k in state.ended}
            for iid in state.ended:
                at = parse_stamp(state.instances[iid].ended_at)
                if at is None or at > now:
                    self._first_seen.setdefault(iid, now)
        batch = due(state, now, b.timing.retention_s, self._first_seen)
        if not batch:
            return
        self._busy = True
        b.committer.submit(Item(plan=functools.partial(self._plan, batch=batch),
                                failed=self._failed))

    def _plan(self, view: View, batch: list[tuple[str, str]]) -> Planned | None:
        lines = []
        for iid, stamp in batch:
            rec = forget(view, iid, stamp)
            if rec is not None:
                at = f", ended {stamp}" if stamp else ""
                lines.append(f"forget {iid} ({rec.state}{at}): {Reason.RETAINED}")
        if not lines:
            self._busy = False
            return None
        return Planned(lines=lines, after=[functools.partial(self._forgotten, batch=batch)])

    def _forgotten(self, _sha: str, batch: list[tuple[str, str]]) -> None:
        self._busy = False
        state = self.b.ledger.state()
        for iid, _stamp in batch:
            if iid not in state.instances:
                self._first_seen.pop(iid, None)
                self.forgotten_total += 1
                self.b.metrics.forgotten.inc()

    def _failed(self, _reason: Reason, _detail: str) -> None:
        self._busy = False
