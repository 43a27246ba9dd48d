"""The retry times of waiting work, kept so that a pass skips what is parked without reading
each parked instance (`shared.auctioneer` rule 1).

Rules:
1. `at` maps an instance to the time its retry is due (the auctioneer's ``retry_at``).
   `parked` is exactly the instances whose time is still ahead as of the last `due(now)`: a
   pass drops them from the waiting work by set membership, in C, instead of comparing each
   one's time in Python - a hundred thousand waiting instances cost one filter, and only
   the due ones are read.
2. A heap of (time, instance) says which instances leave `parked` at `due(now)`. An entry
   that is no longer its instance's time (parked again, or everything cleared) is dropped
   as it surfaces, so a re-park never unparks an instance early.
3. `earliest` is the soonest time still ahead among the parked: until then, `due` unparks
   nothing.
"""

from __future__ import annotations

import heapq

__all__ = ["Retries"]


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
