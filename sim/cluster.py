"""The simulated nodes and the script of what happens to them (failures, joins, drains).

Rules: a node's index order is its id order (ids are zero-padded), so ``(load, index)``
ranks exactly like the award rule's ``(load, node_id)``. Resources are counted in integers
(milli-cpu, MB, ports), so a node's committed state never drifts with float rounding and
equal histories give equal views. The script is a pure function of the scenario and the
seed, shared by every policy: the same nodes fail at the same times under each.
"""

from __future__ import annotations

import random
from typing import NamedTuple

from gavel.shared.feasibility import NodeView
from gavel.shared.messages import Capacity, HostStats
from gavel.sim.scenario import Drain, Fail, Join, NodeGroup, Scenario, ScenarioError
from gavel.sim.workload import Shape

__all__ = ["Cluster", "IndexedSet", "ScriptEvent", "SimNode", "node_ids", "script"]


def node_ids(total: int) -> list[str]:
    width = max(4, len(str(max(total - 1, 0))))
    return [f"n{i:0{width}d}" for i in range(total)]


class SimNode:
    """One node's real state in one policy's run."""

    __slots__ = (
        "_view",
        "alive",
        "cap_milli",
        "capacity",
        "draining",
        "eligible",
        "group",
        "idx",
        "instances",
        "labels",
        "node_id",
        "stats",
        "used_memory",
        "used_milli",
        "used_ports",
        "version",
    )

    def __init__(self, idx: int, node_id: str, group: NodeGroup) -> None:
        self.idx = idx
        self.node_id = node_id
        self.group = group
        self.cap_milli = round(group.cpu * 1000)
        self.capacity = Capacity(cpu=self.cap_milli / 1000.0, memory_mb=group.memory_mb,
                                 ports=group.ports)
        self.labels = dict(group.labels)
        self.stats = HostStats(cpu_ratio=group.background_cpu,
                               memory_ratio=group.background_memory)
        self.used_milli = 0
        self.used_memory = 0
        self.used_ports = 0
        self.alive = True
        #: asked to bid: alive, or failed so recently that liveness has not noticed
        self.eligible = True
        self.draining = False
        self.instances: set[int] = set()
        self.version = 0
        self._view: NodeView | None = None

    def view(self) -> NodeView:
        """What the node itself knows when it bids (cached until its state changes)."""
        if self._view is None:
            committed = Capacity(cpu=self.used_milli / 1000.0, memory_mb=self.used_memory,
                                 ports=self.used_ports)
            self._view = NodeView(node_id=self.node_id, capacity=self.capacity,
                                  committed=committed, stats=self.stats, labels=self.labels,
                                  draining=self.draining)
        return self._view

    def touch(self) -> None:
        self.version += 1
        self._view = None

    def charge(self, shape: Shape, sign: int) -> None:
        self.used_milli += sign * shape.cpu_milli
        self.used_memory += sign * shape.memory_mb
        self.used_ports += sign * shape.ports
        self.touch()

    def utilisation(self) -> float:
        """Committed share: the mean of the cpu and memory fractions reserved."""
        return (self.used_milli / self.cap_milli
                + self.used_memory / self.group.memory_mb) / 2.0


class IndexedSet:
    """A set of node indexes with O(1) add, remove and uniform sampling."""

    def __init__(self, items: range | list[int] = range(0)) -> None:
        self.items: list[int] = list(items)
        self._pos = {x: i for i, x in enumerate(self.items)}

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, x: int) -> bool:
        return x in self._pos

    def add(self, x: int) -> None:
        if x not in self._pos:
            self._pos[x] = len(self.items)
            self.items.append(x)

    def discard(self, x: int) -> None:
        i = self._pos.pop(x, None)
        if i is not None:
            last = self.items.pop()
            if last != x:
                self.items[i] = last
                self._pos[last] = i

    def sample(self, rng: random.Random, k: int) -> list[int]:
        items = self.items
        return [items[i] for i in rng.sample(range(len(items)), min(k, len(items)))]


class ScriptEvent(NamedTuple):
    at: float
    kind: str  # "fail" | "drain" | "drain-migrate" | "join"
    nodes: tuple[int, ...]


class Cluster:
    """Every node that exists or will join, in id order."""

    def __init__(self, scenario: Scenario) -> None:
        ids = node_ids(scenario.total_nodes())
        groups = [g for g in scenario.nodes for _ in range(g.count)]
        groups += [e.group for e in sorted(_joins(scenario), key=lambda e: e.at_s)
                   for _ in range(e.group.count)]
        self.nodes = [SimNode(i, ids[i], g) for i, g in enumerate(groups)]
        self.initial = scenario.initial_nodes()
        for node in self.nodes[self.initial:]:
            node.alive = node.eligible = False
        self.by_id = {n.node_id: n.idx for n in self.nodes}
        self.ids = [n.node_id for n in self.nodes]
        self.alive = IndexedSet(range(self.initial))
        #: asked to bid (alive, or failed but not yet noticed by liveness)
        self.eligible = IndexedSet(range(self.initial))

    def fail(self, idx: int) -> None:
        self.nodes[idx].alive = False
        self.alive.discard(idx)

    def unreachable(self, idx: int) -> None:
        self.nodes[idx].eligible = False
        self.eligible.discard(idx)

    def join(self, idx: int) -> None:
        node = self.nodes[idx]
        node.alive = node.eligible = True
        self.alive.add(idx)
        self.eligible.add(idx)

    @property
    def silent_eligible(self) -> int:
        """Failed nodes still asked to bid: every broadcast round waits for the deadline."""
        return len(self.eligible) - len(self.alive)

    def __len__(self) -> int:
        return len(self.nodes)


def _joins(scenario: Scenario) -> list[Join]:
    return [e for e in scenario.events if isinstance(e, Join)]


def script(scenario: Scenario, seed: int) -> list[ScriptEvent]:
    """Failures, drains and joins with the concrete nodes they hit, in time order."""
    rng = random.Random(f"{seed}/cluster-events")
    ids = node_ids(scenario.total_nodes())
    by_id = {n: i for i, n in enumerate(ids)}
    live = set(range(scenario.initial_nodes()))
    next_join = scenario.initial_nodes()
    planned: list[tuple[float, int, str, Fail | Drain | Join]] = []
    for order, event in enumerate(scenario.events):
        planned.append((event.at_s, order, type(event).__name__, event))
    out: list[ScriptEvent] = []
    for at, _, _, event in sorted(planned, key=lambda p: (p[0], p[1])):
        if isinstance(event, Join):
            new = tuple(range(next_join, next_join + event.group.count))
            next_join += event.group.count
            live.update(new)
            out.append(ScriptEvent(at, "join", new))
            continue
        chosen = _choose(event.nodes, event.count, live, by_id, rng)
        live.difference_update(chosen)
        if isinstance(event, Fail):
            step = event.over_s / max(len(chosen), 1)
            out.extend(ScriptEvent(at + k * step, "fail", (n,)) for k, n in enumerate(chosen))
        else:
            out.append(ScriptEvent(at, "drain-migrate" if event.migrate else "drain", chosen))
    return sorted(out, key=lambda e: e.at)


def _choose(named: list[str], count: int, live: set[int], by_id: dict[str, int],
            rng: random.Random) -> tuple[int, ...]:
    if named:
        unknown = [n for n in named if n not in by_id]
        if unknown:
            raise ScenarioError(f"events: node {unknown[0]!r} does not exist "
                                f"(ids run {min(by_id)}..{max(by_id)}).")
        return tuple(by_id[n] for n in named if by_id[n] in live)
    pool = sorted(live)
    return tuple(sorted(rng.sample(pool, min(count, len(pool)))))
