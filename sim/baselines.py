"""Central schedulers to compare gavel against, on the same arrivals and the same failures.

Rules: each baseline sees the seed rule's (least-loaded's) order books, so feasibility is
exactly `shared.feasibility.check`; they differ only in which feasible node they take.
- random: a uniformly random node that fits (drawn from the bidders in index order).
- nomad-binpack: Nomad's ``ScoreFitBinPack`` (``20 - (10^free_cpu + 10^free_mem)`` after
  placement, higher is better) over ``max(2, ceil(log2 n))`` random feasible nodes, the
  way Nomad's limit iterator visits a shuffled node list; ties go to the lower node id.
- central-stale: least-loaded on heartbeat snapshots. Each node's snapshot is refreshed
  every heartbeat (phases staggered across nodes); placements are *not* added to it, so
  the scheduler keeps choosing a node it believes empty until the node refuses. A refusal
  (no room, or the node is dead) returns the node's true state and the scheduler retries,
  up to `ATTEMPTS` times. Drains and joins reach the scheduler at once (it is told).
(central-fresh and power-of-d are `sim.gavel.GavelPlacer` with ``omniscient=True``.)
- central-preempting (`central_preempting`, for `sim.preemption`): a scheduler that sees every
  node's instances; the least-utilised node that fits, else the cheapest displacement over
  every node (`shared.preemption.offer_key` over what `shared.preemption.victims` frees).
"""

from __future__ import annotations

import math
import random

from gavel.shared.feasibility import NodeView, check, shortfall
from gavel.shared.messages import Shape
from gavel.shared.preemption import Offer, offer_key, victims
from gavel.shared.reasons import Reason
from gavel.sim.cluster import Cluster
from gavel.sim.placer import Outcome, Placer, Why
from gavel.sim.workload import Catalogue

__all__ = ["ATTEMPTS", "NomadPlacer", "RandomPlacer", "StalePlacer", "central_preempting",
           "nomad_score"]

ATTEMPTS = 5
_PHASES = 10


class RandomPlacer(Placer):
    def __init__(self, name: str, cluster: Cluster, catalogue: Catalogue,
                 rng: random.Random) -> None:
        super().__init__(name, cluster, catalogue)
        self.rng = rng

    def place(self, shape: int, now: float) -> Outcome:
        self.next_round()
        bidders = self.books[shape].ranked.bidders()
        if not len(bidders):
            return self.unschedulable(shape, now, False)
        return Outcome(int(bidders[self.rng.randrange(len(bidders))]))


def nomad_score(cpu_free: float, memory_free: float) -> float:
    """Nomad's binpack fit: free shares after placement, fuller scores higher (max 18)."""
    return 20.0 - (math.pow(10.0, cpu_free) + math.pow(10.0, memory_free))


class NomadPlacer(Placer):
    def __init__(self, name: str, cluster: Cluster, catalogue: Catalogue,
                 rng: random.Random) -> None:
        super().__init__(name, cluster, catalogue)
        self.rng = rng

    def place(self, shape: int, now: float) -> Outcome:
        self.next_round()
        bidders = self.books[shape].ranked.bidders()
        if not len(bidders):
            return self.unschedulable(shape, now, False)
        limit = max(2, math.ceil(math.log2(max(len(self.cluster.alive), 1))))
        want = self.catalogue.shapes[shape]
        best: tuple[float, int] | None = None
        for pos in self.rng.sample(range(len(bidders)), min(limit, len(bidders))):
            idx = int(bidders[pos])
            node = self.cluster.nodes[idx]
            cpu_free = 1.0 - (node.used_milli + want.cpu_milli) / node.cap_milli
            mem_free = 1.0 - (node.used_memory + want.memory_mb) / node.group.memory_mb
            key = (-nomad_score(cpu_free, mem_free), idx)
            if best is None or key < best:
                best = key
        assert best is not None
        return Outcome(best[1])


class StalePlacer(Placer):
    def __init__(self, name: str, cluster: Cluster, catalogue: Catalogue,
                 heartbeat_s: float) -> None:
        super().__init__(name, cluster, catalogue)
        self.period = heartbeat_s / _PHASES
        self._phase = 0
        self._seen = [-1] * len(cluster)

    def _refresh(self, idx: int) -> None:
        node = self.cluster.nodes[idx]
        self._seen[idx] = node.version
        self.books.update(idx, self.strategies[idx], node.view() if node.alive else None)

    def changed(self, idx: int, why: str) -> None:
        node = self.cluster.nodes[idx]
        if why in (Why.JOIN, Why.DRAIN) or not node.eligible:
            self._refresh(idx)
            if not node.eligible:
                self.books.update(idx, self.strategies[idx], None)

    def tick(self, now: float) -> None:
        """One heartbeat phase: the nodes whose heartbeat lands now report their state."""
        del now
        nodes = self.cluster.nodes
        for idx in range(self._phase, len(nodes), _PHASES):
            node = nodes[idx]
            if node.alive and node.version != self._seen[idx]:
                self._refresh(idx)
        self._phase = (self._phase + 1) % _PHASES

    def place(self, shape: int, now: float) -> Outcome:
        self.next_round()
        book = self.books[shape]
        refused = 0
        while book.ranked and refused < ATTEMPTS:
            idx = book.ranked[0][1]
            node = self.cluster.nodes[idx]
            if node.alive and check(book.request, node.view()) is None:
                return Outcome(idx, rejections=refused)
            refused += 1
            self._refresh(idx)
        if not book.ranked:
            return self.unschedulable(shape, now, False)._replace(rejections=refused)
        return Outcome(-1, Reason.NOT_ACCEPTED, rejections=refused)


def central_preempting(views: dict[str, NodeView], shape: Shape
                       ) -> tuple[str, list[str]] | None:
    """The central scheduler with preemption: (node, instances to evict) or None."""
    best: tuple[float, str] | None = None
    for node, view in views.items():
        if shortfall(shape, view.capacity - view.committed) is None:
            key = (view.committed.cpu / view.capacity.cpu if view.capacity.cpu else 1.0, node)
            if best is None or key < best:
                best = key
    if best is not None:
        return best[1], []
    offers = [Offer(node_id=node, load=0.0, victims=tuple(chosen))
              for node, view in views.items() if (chosen := victims(shape, view))]
    if not offers:
        return None
    cheapest = min(offers, key=offer_key)
    return cheapest.node_id, [v.instance_id for v in cheapest.victims]
