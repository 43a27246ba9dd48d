"""What arrives and when: request shapes and the arrival stream.

Rules: every policy replays the identical arrival stream — it is a pure function of the
scenario and the seed, drawn from its own `random.Random` streams (one for times, one for
sizes and durations), never from a policy's. Sizes are discrete, so the whole set of request
shapes (cpu, memory, ports, labels) is known before the run: the `Catalogue`.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator
from itertools import accumulate
from typing import NamedTuple

from gavel.shared.affinity import Affinity
from gavel.shared.messages import Request
from gavel.sim.distributions import Choice, pick_weighted
from gavel.sim.scenario import Scenario, WorkloadClass

__all__ = ["Arrival", "Catalogue", "Shape", "arrivals", "stream"]


class Shape(NamedTuple):
    """Everything in a `Request` that its award may depend on (all of it but the instance
    id): what the nodes bid on, and the soft affinities the award ranks their bids with."""

    cpu_milli: int
    memory_mb: int
    ports: int
    labels: tuple[tuple[str, str], ...]
    #: (label, value, weight) of each affinity, sorted (`shared.affinity`)
    affinities: tuple[tuple[str, str, int], ...] = ()

    def request(self, instance_id: str) -> Request:
        return Request(instance_id=instance_id, cpu=self.cpu_milli / 1000.0,
                       memory_mb=self.memory_mb, ports=self.ports, labels=dict(self.labels),
                       affinities=self.affinity_list())

    def affinity_list(self) -> tuple[Affinity, ...]:
        return tuple(Affinity(label=k, value=v, weight=w) for k, v, w in self.affinities)

    def describe(self) -> str:
        labels = "".join(f" {k}={v}" for k, v in self.labels)
        prefers = "".join(f" ~{k}={v}:{w:+d}" for k, v, w in self.affinities)
        return f"{self.cpu_milli / 1000:g} cpu/{self.memory_mb} MB{labels}{prefers}"


def _affinities(cls: WorkloadClass) -> tuple[tuple[str, str, int], ...]:
    return tuple(sorted((a.label, a.value, a.weight) for a in cls.affinities))


class Arrival(NamedTuple):
    at: float
    seq: int
    shape: int
    duration: float
    cls: int


def _sizes(size: float | Choice) -> tuple[list[float], list[float]]:
    return size.table() if isinstance(size, Choice) else ([size], [1.0])


class _ClassTable(NamedTuple):
    cpu: list[float]
    cpu_cum: list[float]
    mem: list[float]
    mem_cum: list[float]
    shape_of: dict[tuple[int, int], int]


class Catalogue:
    """Every shape the workload can ask for, indexed in a fixed (sorted) order."""

    def __init__(self, classes: list[WorkloadClass]) -> None:
        found: set[Shape] = set()
        for cls in classes:
            labels = tuple(sorted(cls.labels.items()))
            for cpu in _sizes(cls.cpu)[0]:
                for mem in _sizes(cls.memory_mb)[0]:
                    found.add(Shape(round(cpu * 1000), int(mem), cls.ports, labels,
                                    _affinities(cls)))
        self.shapes: list[Shape] = sorted(found)
        index = {s: i for i, s in enumerate(self.shapes)}
        self.requests = [s.request(f"shape-{i}") for i, s in enumerate(self.shapes)]
        self.classes = classes
        self.tables: list[_ClassTable] = []
        for cls in classes:
            labels = tuple(sorted(cls.labels.items()))
            cpus, cpu_cum = _sizes(cls.cpu)
            mems, mem_cum = _sizes(cls.memory_mb)
            shape_of = {(i, j): index[Shape(round(c * 1000), int(m), cls.ports, labels,
                                            _affinities(cls))]
                        for i, c in enumerate(cpus) for j, m in enumerate(mems)}
            self.tables.append(_ClassTable(cpus, cpu_cum, mems, mem_cum, shape_of))
        self.class_cum = list(accumulate(c.weight for c in classes))

    def __len__(self) -> int:
        return len(self.shapes)

    def draw(self, rng: random.Random, cls: int) -> tuple[int, float]:
        """(shape index, duration) of one instance of class `cls`."""
        table = self.tables[cls]
        i = pick_weighted(rng, table.cpu_cum)
        j = pick_weighted(rng, table.mem_cum)
        return table.shape_of[(i, j)], self.classes[cls].duration_s.sample(rng)


def _poisson(rate: float, until: float, rng: random.Random) -> Iterator[float]:
    if rate <= 0:
        return
    t = rng.expovariate(rate)
    while t < until:
        yield t
        t += rng.expovariate(rate)


def _bursts(scenario: Scenario) -> list[tuple[float, int]]:
    """(time, class or -1) of every burst arrival, in time order."""
    names = [c.name for c in scenario.workload.classes]
    out: list[tuple[float, int]] = []
    for burst in scenario.workload.bursts:
        cls = names.index(burst.workload_class) if burst.workload_class else -1
        step = burst.over_s / burst.count
        out.extend((burst.at_s + k * step, cls) for k in range(burst.count))
    return sorted(t for t in out if t[0] < scenario.duration_s)


def arrivals(scenario: Scenario, catalogue: Catalogue, seed: int) -> Iterator[Arrival]:
    """The arrival stream, in time order, capped at ``workload.max_arrivals``."""
    times = random.Random(f"{seed}/arrival-times")
    sizes = random.Random(f"{seed}/arrival-sizes")
    poisson = ((t, -1) for t in _poisson(scenario.workload.rate, scenario.duration_s, times))
    cap = scenario.workload.max_arrivals
    for seq, (at, fixed) in enumerate(heapq.merge(poisson, _bursts(scenario))):
        if cap is not None and seq >= cap:
            return
        cls = fixed if fixed >= 0 else pick_weighted(sizes, catalogue.class_cum)
        shape, duration = catalogue.draw(sizes, cls)
        yield Arrival(at, seq, shape, duration, cls)


def stream(scenario: Scenario, seed: int) -> tuple[Catalogue, Iterator[Arrival]]:
    catalogue = Catalogue(scenario.workload.classes)
    return catalogue, arrivals(scenario, catalogue, seed)
