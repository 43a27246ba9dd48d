"""What of the waiting work an auctioneer's pass must read (`shared.auctioneer` rule 1):
parked instances are dropped without being read, and after a pass that found nothing due,
only the work added since is.

Rules:
1. `Retries.at` maps an instance to the time its retry is due (the auctioneer's
   ``retry_at``). `Retries.parked` is exactly the instances whose time is still ahead as of
   the last `due(now)`: a pass drops them from the waiting work by set membership, in C,
   instead of comparing each one's time in Python - only the due ones are read.
2. A heap of (time, instance) says which instances leave `parked` at `due(now)`. An entry
   that is no longer its instance's time (parked again, or everything cleared) is dropped
   as it surfaces, so a re-park never unparks an instance early.
3. `earliest` is the soonest time still ahead among the parked: until then, `due` unparks
   nothing.
4. Pending work is an ordered set, new work added at its end. `tail` tells one from the
   next (its size and newest entry); `added` is what a later one holds past an earlier
   tail, read from the end - or None when anything but additions happened between them
   (the earlier newest gone, or the sizes not adding up), or more than `most` were added:
   then the pass reads it whole.
5. `backlog` is how much of the pending work waits, less what the auctioneer holds of it (in
   flight, parked): counted by the sizes, nothing read.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence, Sized
from collections.abc import Set as AbstractSet

__all__ = ["Retries", "Tail", "added", "backlog", "tail"]

#: Rule 4: a pending set's size and newest entry.
Tail = tuple[int, object]


class Retries:
    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.parked: set[str] = set()
        self._heap: list[tuple[float, str]] = []

    def park(self, iid: str, at: float) -> None:
        self.at[iid] = at
        self.parked.add(iid)
        heapq.heappush(self._heap, (at, iid))

    def due(self, now: float) -> None:
        """Rule 2: unpark every instance whose time is `now` or earlier."""
        heap, at = self._heap, self.at
        while heap and heap[0][0] <= now:
            t, iid = heapq.heappop(heap)
            if at.get(iid) == t:
                self.parked.discard(iid)

    def earliest(self) -> float:
        """Rule 3: the soonest retry time still ahead (inf: none)."""
        heap, at = self._heap, self.at
        while heap and (at.get(heap[0][1]) != heap[0][0] or heap[0][1] not in self.parked):
            heapq.heappop(heap)
        return heap[0][0] if heap else float("inf")

    def clear(self) -> None:
        self.at.clear()
        self.parked.clear()
        self._heap.clear()


def tail(ids: Iterable[str]) -> Tail | None:
    """Rule 4, or None for pending work that is no sequence."""
    if isinstance(ids, Mapping | Sequence):
        return len(ids), next(reversed(ids), None)
    return None


def added(ids: Iterable[str], since: Tail, most: int) -> list[str] | None:
    """Rule 4: the ids added after `since`, oldest first; None when that cannot be told."""
    if not isinstance(ids, Mapping | Sequence):
        return None
    n = len(ids) - since[0]
    if n < 0 or n > most:
        return None
    out: list[str] = []
    for iid in reversed(ids):
        if iid == since[1]:
            return out[::-1] if len(out) == n else None
        if len(out) == n:
            return None
        out.append(iid)
    return out[::-1] if since[1] is None and len(out) == n else None


def backlog(ids: Iterable[str], *held: AbstractSet[str]) -> int:
    """Rule 5 (0 for pending work that is no sized collection)."""
    return max(0, len(ids) - sum(map(len, held))) if isinstance(ids, Sized) else 0
