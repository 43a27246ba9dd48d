"""The dashboard's usage graphs: each running instance's measured cpu and memory over the last
minutes, as the overview's refreshes hear them (`feed` rule 2).

Rules:
1. A point (when, cpus busy, memory in MB: the status API's figures, measured from the
   instance's cgroup by its node) is kept at most every `EVERY_S` per instance, the last
   `POINTS` of them: the last five minutes.
2. Only running instances on a node are kept; one that is no longer is forgotten at the next
   refresh. At most `INSTANCES_MAX` are kept, the first heard first (the bound the metrics
   keep too): the dashboard's memory does not grow with the fleet.
3. `of` gives an instance's points, oldest first, as the instance page draws them; an
   instance never heard running has none.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from gavel.shared.api import InstanceStatus

__all__ = ["EVERY_S", "INSTANCES_MAX", "POINTS", "History"]

#: Rule 1.
EVERY_S = 2.0
POINTS = 150
#: Rule 2.
INSTANCES_MAX = 500


class History:
    """Rules 1 to 3."""

    def __init__(self, every_s: float = EVERY_S, points: int = POINTS,
                 instances_max: int = INSTANCES_MAX) -> None:
        self.every_s, self.points, self.instances_max = every_s, points, instances_max
        self._kept: dict[str, deque[tuple[float, float, float]]] = {}

    def record(self, now: float, instances: Iterable[InstanceStatus]) -> None:
        running = {i.instance_id: i for i in instances
                   if i.state == "running" and i.node_id}
        for gone in [iid for iid in self._kept if iid not in running]:
            del self._kept[gone]
        for iid, inst in running.items():
            kept = self._kept.get(iid)
            if kept is None:
                if len(self._kept) >= self.instances_max:
                    continue
                kept = self._kept[iid] = deque(maxlen=self.points)
            if kept and now - kept[-1][0] < self.every_s:
                continue
            kept.append((now, inst.cpu_used, inst.memory_used_mb))

    def of(self, instance_id: str) -> list[list[float]]:
        return [list(p) for p in self._kept.get(instance_id, ())]
