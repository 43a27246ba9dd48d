"""The order of the auctioneer's queue (`shared.auctioneer` rule 1), sans-IO.

Rules:
1. Waiting work is taken by priority (`Spec.priority`), highest first, and oldest first
   within a priority: the order is total and deterministic, so the broker and the
   simulator, driving the same core, take the same work.
2. Past the work a pass can take, only work above the lowest priority taken can displace
   some of it. When that lowest is the default or above, such work is all above the
   default: `Urgent` keeps those ids, reading only what was added to the queue since its
   last look (work is added at the end; should the newest it saw have left, it reads the
   whole queue once), so a queue at the default priority costs no more than what is taken.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Reversible, Sequence
from typing import cast

from gavel.shared.records import InstanceRecord

__all__ = ["DEFAULT_PRIORITY", "Urgent", "ranked"]

#: The priority a spec has when it names none (`Spec.priority`).
DEFAULT_PRIORITY = 50


def _urgency(r: InstanceRecord) -> int:
    return -r.spec.priority


def ranked(pending: list[InstanceRecord], want: int, mixed: bool) -> list[InstanceRecord]:
    """Rule 1: the first `want` of `pending` (oldest first) by priority; `mixed`: whether
    the priorities differ at all (when not, nothing is sorted)."""
    if mixed:
        pending.sort(key=_urgency)  # stable: oldest first within a priority
        del pending[want:]
    return pending


class Urgent:
    """Rule 2: the queued ids above the default priority, in the order they came."""

    __slots__ = ("_seen", "ids")

    def __init__(self) -> None:
        self.ids: dict[str, None] = {}
        self._seen: str | None = None  # the newest queued id looked at

    def note(self, queue: Mapping[str, object] | Sequence[str],
             record: Callable[[str], InstanceRecord]) -> dict[str, None]:
        if self.ids:
            self.ids = {i: None for i in self.ids if i in queue}
        seen, new = self._seen, []
        for iid in reversed(cast("Reversible[str]", queue)):  # a dict or a list
            if iid == seen:
                break
            if record(iid).spec.priority > DEFAULT_PRIORITY:
                new.append(iid)
        self._seen = next(reversed(cast("Reversible[str]", queue)), None)
        for iid in reversed(new):
            self.ids.setdefault(iid, None)
        return self.ids
