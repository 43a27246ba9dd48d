"""What a run measures, and the result it reports.

Rules: utilisation is a node's committed share (mean of cpu and memory reserved); node
statistics are taken every ``sample_s`` over live nodes and averaged over the samples.
Capacity is *stranded* when it is free on a live, non-draining node while requests wait in
the queue and none of the waiting shapes fits that node (`shared.feasibility.check`): free,
yet no pending request can use it — the bin-packing question. ``largest_fits`` is the
share of nodes that could still take the workload's largest shape. Every number is rounded
to 6 places, so ``results.json`` is stable.
"""

from __future__ import annotations

from array import array
from collections import Counter

import msgspec

from gavel.shared.feasibility import check
from gavel.shared.messages import Request
from gavel.sim.cluster import Cluster
from gavel.sim.workload import Catalogue, Shape

__all__ = ["PolicyResult", "Recorder", "Series", "StrategyShare", "percentile"]


class Series(msgspec.Struct, kw_only=True):
    t: list[float] = []
    pending: list[float] = []
    unschedulable: list[float] = []
    util_mean: list[float] = []
    util_p99: list[float] = []
    stranded_cpu: list[float] = []
    stranded_memory: list[float] = []
    empty_nodes: list[float] = []
    largest_fits: list[float] = []


class StrategyShare(msgspec.Struct, kw_only=True):
    nodes: int
    node_share: float
    wins: int
    win_share: float
    utilisation: float


class PolicyResult(msgspec.Struct, kw_only=True):
    policy: str
    kind: str
    description: str
    arrivals: int = 0
    placements: int = 0
    replacements: int = 0
    migrations: int = 0
    lost: int = 0
    abandoned: int = 0
    pending_end: int = 0
    unschedulable: int = 0
    unschedulable_rounds: int = 0
    reasons: dict[str, int] = {}
    unschedulable_by_class: dict[str, int] = {}
    rejections: int = 0
    ties: int = 0
    latency_mean: float = 0.0
    latency_p50: float = 0.0
    latency_p99: float = 0.0
    latency_max: float = 0.0
    util_mean: float = 0.0
    util_p50: float = 0.0
    util_p99: float = 0.0
    util_max: float = 0.0
    imbalance: float = 0.0
    stranded_cpu: float = 0.0
    stranded_memory: float = 0.0
    free_cpu: float = 0.0
    free_memory: float = 0.0
    empty_nodes: float = 0.0
    largest_fits: float = 0.0
    #: per-node time-averaged utilisation, the 0th, 5th, ... 100th percentile
    node_utilisation: list[float] = []
    strategies: dict[str, StrategyShare] = {}
    series: Series = msgspec.field(default_factory=Series)


def percentile(sorted_xs: list[float] | array[float], q: float) -> float:
    """Nearest rank on sorted data; 0 for none."""
    if not sorted_xs:
        return 0.0
    return sorted_xs[min(len(sorted_xs) - 1, int(q * len(sorted_xs)))]


def _r(x: float) -> float:
    return round(x, 6)


def _minimal(catalogue: Catalogue, wanted: list[int]) -> list[Request]:
    """The wanted shapes no other wanted shape covers: if any fits a node, one of these does."""
    shapes = catalogue.shapes

    def covers(a: Shape, b: Shape) -> bool:  # a fits wherever b fits
        return (a.cpu_milli <= b.cpu_milli and a.memory_mb <= b.memory_mb
                and a.ports <= b.ports and set(a.labels) <= set(b.labels))

    keep = [i for i in wanted
            if not any(j != i and covers(shapes[j], shapes[i])
                       and (not covers(shapes[i], shapes[j]) or j < i) for j in wanted)]
    return [catalogue.requests[i] for i in keep]


def _largest(catalogue: Catalogue) -> Request:
    biggest = max(range(len(catalogue)),
                  key=lambda i: (catalogue.shapes[i].cpu_milli, catalogue.shapes[i].memory_mb, i))
    return catalogue.requests[biggest]


class Recorder:
    def __init__(self, name: str, kind: str, description: str, cluster: Cluster,
                 catalogue: Catalogue, labels: list[str]) -> None:
        self.result = PolicyResult(policy=name, kind=kind, description=description)
        self.cluster = cluster
        self.catalogue = catalogue
        self.labels = labels
        self.reasons: Counter[str] = Counter()
        self.by_class: Counter[str] = Counter()
        self.wins: Counter[str] = Counter()
        self.latencies: array[float] = array("d")
        self.series = Series()
        self.samples: list[tuple[float, ...]] = []
        self._largest = _largest(catalogue)
        size = len(cluster)
        self._util_sum = [0.0] * size
        self._util_n = [0] * size
        self._free_sum = [0.0, 0.0]

    # -- events -----------------------------------------------------------------------------
    def placed(self, node: int, latency: float, tie: bool, kind: str) -> None:
        r = self.result
        if kind == "first":
            r.placements += 1
        elif kind == "replace":
            r.replacements += 1
        else:
            r.migrations += 1
        r.ties += tie
        self.wins[self.labels[node]] += 1
        self.latencies.append(latency)

    def unschedulable(self, reason: str, cls: str, first: bool) -> None:
        self.result.unschedulable_rounds += 1
        self.reasons[reason] += 1
        if first:
            self.result.unschedulable += 1
            self.by_class[cls] += 1

    # -- samples ----------------------------------------------------------------------------
    def sample(self, now: float, pending: int, waiting: list[int]) -> None:
        """Node statistics now; `waiting` lists the shapes with queued requests."""
        utils: list[float] = []
        cap_cpu = cap_mem = free_cpu = free_mem = lost_cpu = lost_mem = 0.0
        empty = big = 0
        wanted = _minimal(self.catalogue, waiting)
        nodes = self.cluster.nodes
        for idx in sorted(self.cluster.alive.items):
            node = nodes[idx]
            u = node.utilisation()
            utils.append(u)
            self._util_sum[idx] += u
            self._util_n[idx] += 1
            if node.draining:
                continue
            empty += node.used_milli == 0 and node.used_memory == 0
            cap_cpu += node.cap_milli
            cap_mem += node.group.memory_mb
            fc, fm = node.cap_milli - node.used_milli, node.group.memory_mb - node.used_memory
            free_cpu += fc
            free_mem += fm
            view = node.view()
            big += check(self._largest, view) is None
            if wanted and all(check(r, view) is not None for r in wanted):
                lost_cpu += fc
                lost_mem += fm
        utils.sort()
        n = len(utils)
        mean = sum(utils) / n if n else 0.0
        point = (now, float(pending), float(self.result.unschedulable), mean,
                 percentile(utils, 0.5), percentile(utils, 0.99),
                 utils[-1] / mean if n and mean > 0 else 0.0,
                 lost_cpu / cap_cpu if cap_cpu else 0.0, lost_mem / cap_mem if cap_mem else 0.0,
                 empty / n if n else 0.0, big / n if n else 0.0)
        self.samples.append(point)
        self._free_sum[0] += free_cpu / cap_cpu if cap_cpu else 0.0
        self._free_sum[1] += free_mem / cap_mem if cap_mem else 0.0
        s = self.series
        s.t.append(_r(now))
        s.pending.append(float(pending))
        s.unschedulable.append(float(self.result.unschedulable))
        s.util_mean.append(_r(mean))
        s.util_p99.append(_r(point[5]))
        s.stranded_cpu.append(_r(point[7]))
        s.stranded_memory.append(_r(point[8]))
        s.empty_nodes.append(_r(point[9]))
        s.largest_fits.append(_r(point[10]))

    # -- the result -------------------------------------------------------------------------
    def finish(self, pending: int) -> PolicyResult:
        r = self.result
        r.pending_end = pending
        r.reasons = dict(sorted(self.reasons.items()))
        r.unschedulable_by_class = dict(sorted(self.by_class.items()))
        lat = array("d", sorted(self.latencies))
        if lat:
            r.latency_mean = _r(sum(lat) / len(lat))
            r.latency_p50 = _r(percentile(lat, 0.5))
            r.latency_p99 = _r(percentile(lat, 0.99))
            r.latency_max = _r(lat[-1])
        k = len(self.samples)
        if k:
            avg = [sum(p[i] for p in self.samples) / k for i in range(11)]
            (r.util_mean, r.util_p50, r.util_p99, r.imbalance, r.stranded_cpu,
             r.stranded_memory, r.empty_nodes, r.largest_fits) = (
                _r(avg[i]) for i in (3, 4, 5, 6, 7, 8, 9, 10))
            r.util_max = _r(max(p[6] * p[3] for p in self.samples))
            r.free_cpu = _r(self._free_sum[0] / k)
            r.free_memory = _r(self._free_sum[1] / k)
        per_node = self.node_utilisation()
        r.node_utilisation = [_r(percentile(per_node, q / 20)) for q in range(21)]
        r.strategies = self._shares()
        r.series = self.series
        return r

    def node_utilisation(self) -> list[float]:
        """Each node's utilisation averaged over the samples it was alive for, sorted."""
        return sorted(s / n for s, n in zip(self._util_sum, self._util_n, strict=True) if n)

    def _shares(self) -> dict[str, StrategyShare]:
        present = [i for i, n in enumerate(self._util_n) if n]
        total_nodes = len(present) or 1
        total_wins = sum(self.wins.values()) or 1
        out: dict[str, StrategyShare] = {}
        for label in sorted(set(self.labels[i] for i in present) | set(self.wins)):
            members = [i for i in present if self.labels[i] == label]
            util = (sum(self._util_sum[i] / self._util_n[i] for i in members) / len(members)
                    if members else 0.0)
            out[label] = StrategyShare(nodes=len(members),
                                       node_share=_r(len(members) / total_nodes),
                                       wins=self.wins[label],
                                       win_share=_r(self.wins[label] / total_wins),
                                       utilisation=_r(util))
        return out
