"""What a run measures, and the result it reports.

Rules:
1. Node statistics are taken every ``sample_s`` (`sim.snapshot`). The whole-run figures
   (``util_mean``, ``stranded_cpu``, ``imbalance``, ...) average every sample over live
   nodes, as they always have: ``stranded_cpu`` there is free cpu on nodes no waiting
   shape fits, for whatever reason, and ``imbalance`` is max over mean utilisation, which
   the fullest node sets — a curiosity, not a verdict. The figures that decide are in
   ``steady`` (`sim.steady`): the steady-state window only, stranded capacity counted only
   where a waiting request could run, evenness and packing measured against the fleet.
2. ``largest_fits`` is the share of nodes that could still take the workload's largest
   shape. Every number is rounded to 6 places, so ``results.json`` is stable.
3. Per class, the series hold what is queued, how many were ever unschedulable, and the
   p50 and p99 wait of the first placements made since the previous sample (None: none).
"""

from __future__ import annotations

from array import array
from collections import Counter

import msgspec
import numpy as np

from gavel.sim.cluster import Cluster
from gavel.sim.snapshot import Fleet, take
from gavel.sim.stats import Interval
from gavel.sim.steady import ClassSteady, Steady
from gavel.sim.workload import Catalogue

__all__ = ["ClassSeries", "PolicyResult", "Recorder", "Series", "StrategyShare", "percentile"]


class ClassSeries(msgspec.Struct, kw_only=True):
    queued: list[float] = []
    unschedulable: list[float] = []
    wait_p50: list[float | None] = []
    wait_p99: list[float | None] = []


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
    util_cv: list[float] = []
    util_jain: list[float] = []
    #: stranded as `sim.snapshot` rule 3 counts it (free where a waiting request could run)
    stranded_usable_cpu: list[float] = []
    nodes_in_use: list[float] = []
    packing_bound: list[float] = []
    classes: dict[str, ClassSeries] = {}


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
    #: the steady-state figures of this run (the first seed's, with several)
    steady: Steady = msgspec.field(default_factory=Steady)
    #: every steady figure over the seeds run (`sim.steady.flatten` names them)
    intervals: dict[str, Interval] = {}
    #: the production auctioneer's own counts (`sim.market`; empty on the fast path)
    market: dict[str, int] = {}
    #: re-auctions by how they ended (`shared.reauction.Outcome`; empty without rebalance)
    rebalance: dict[str, int] = {}


def percentile(sorted_xs: list[float] | array[float], q: float) -> float:
    """Nearest rank on sorted data; 0 for none."""
    if not sorted_xs:
        return 0.0
    return sorted_xs[min(len(sorted_xs) - 1, int(q * len(sorted_xs)))]


def _r(x: float) -> float:
    return round(x, 6)


def _largest(catalogue: Catalogue) -> int:
    return max(range(len(catalogue)),
               key=lambda i: (catalogue.shapes[i].cpu_milli, catalogue.shapes[i].memory_mb, i))


class _ClassWindow:
    """One class's instances that arrived in the steady window (`sim.steady` rule 2)."""

    __slots__ = ("abandoned", "arrivals", "first", "unschedulable", "waits")

    def __init__(self) -> None:
        self.arrivals = self.first = self.unschedulable = self.abandoned = 0
        self.waits: array[float] = array("d")

    def result(self, queued: int) -> ClassSteady:
        waits = array("d", sorted(self.waits))
        return ClassSteady(
            arrivals=self.arrivals, placed=len(waits),
            first_auction=_r(self.first / self.arrivals) if self.arrivals else 0.0,
            wait_p50=_r(percentile(waits, 0.5)), wait_p99=_r(percentile(waits, 0.99)),
            unschedulable=self.unschedulable, abandoned=self.abandoned, queued_end=queued)


class Recorder:
    def __init__(self, name: str, kind: str, description: str, cluster: Cluster,
                 catalogue: Catalogue, labels: list[str], class_names: list[str],
                 window: tuple[float, float]) -> None:
        self.result = PolicyResult(policy=name, kind=kind, description=description)
        self.cluster = cluster
        self.catalogue = catalogue
        self.labels = labels
        self.class_names = class_names
        self.start, self.end = window
        self.fleet = Fleet(cluster, catalogue)
        self.reasons: Counter[str] = Counter()
        self.by_class: Counter[str] = Counter()
        self.wins: Counter[str] = Counter()
        self.latencies: array[float] = array("d")
        self.series = Series(classes={c: ClassSeries() for c in class_names})
        self.samples: list[tuple[float, ...]] = []
        self.steady_samples: list[tuple[float, ...]] = []
        self._largest = _largest(catalogue)
        size = len(cluster)
        self._util_sum = np.zeros(size)
        self._util_n = np.zeros(size, dtype=np.int64)
        self._steady_sum = np.zeros(size)
        self._steady_n = np.zeros(size, dtype=np.int64)
        self._free_sum = [0.0, 0.0]
        self._window = [_ClassWindow() for _ in class_names]
        self._recent: list[array[float]] = [array("d") for _ in class_names]
        self._ever: list[int] = [0] * len(class_names)
        self._moves = 0  # re-auction moves in the steady window

    def _in_window(self, arrived: float) -> bool:
        return self.start <= arrived <= self.end

    # -- events -----------------------------------------------------------------------------
    def arrived(self, cls: int, at: float) -> None:
        if self._in_window(at):
            self._window[cls].arrivals += 1

    def placed(self, node: int, latency: float, tie: bool, kind: str, cls: int = 0,
               arrived: float = -1.0, first_auction: bool = False) -> None:
        """An award; for a first placement `latency` is the instance's wait."""
        r = self.result
        if kind == "first":
            r.placements += 1
            self._recent[cls].append(latency)
            if self._in_window(arrived):
                window = self._window[cls]
                window.waits.append(latency)
                window.first += first_auction
        elif kind == "replace":
            r.replacements += 1
        else:
            r.migrations += 1
        r.ties += tie
        self.wins[self.labels[node]] += 1
        self.latencies.append(latency)

    def moved(self, at: float) -> None:
        """A re-auction moved a running instance (counted in ``migrations`` too)."""
        self.result.migrations += 1
        self._moves += self.start <= at <= self.end

    def unschedulable(self, reason: str, cls: int, first: bool, arrived: float = -1.0) -> None:
        self.result.unschedulable_rounds += 1
        self.reasons[reason] += 1
        if first:
            self.result.unschedulable += 1
            self.by_class[self.class_names[cls]] += 1
            self._ever[cls] += 1
            if self._in_window(arrived):
                self._window[cls].unschedulable += 1

    def abandoned(self, cls: int, arrived: float) -> None:
        self.result.abandoned += 1
        if self._in_window(arrived):
            self._window[cls].abandoned += 1

    # -- samples ----------------------------------------------------------------------------
    def sample(self, now: float, pending: int, waiting: list[int],
               queued: list[int] | None = None) -> None:
        """Node statistics now; `waiting` lists the shapes with queued requests and
        `queued` how many instances of each class wait."""
        snap = take(self.fleet, self.cluster, waiting, self._largest)
        n = len(snap.nodes)
        utils = np.sort(snap.util).tolist()
        self._util_sum[snap.nodes] += snap.util
        self._util_n[snap.nodes] += 1
        mean = sum(utils) / n if n else 0.0
        cap_cpu, cap_mem = snap.cap_cpu, snap.cap_mem
        point = (now, float(pending), float(self.result.unschedulable), mean,
                 percentile(utils, 0.5), percentile(utils, 0.99),
                 utils[-1] / mean if n and mean > 0 else 0.0,
                 snap.unfit_cpu / cap_cpu if cap_cpu else 0.0,
                 snap.unfit_mem / cap_mem if cap_mem else 0.0,
                 snap.empty / n if n else 0.0, snap.largest_fits / n if n else 0.0)
        self.samples.append(point)
        self._free_sum[0] += snap.free_cpu / cap_cpu if cap_cpu else 0.0
        self._free_sum[1] += snap.free_mem / cap_mem if cap_mem else 0.0
        o_cap = self.fleet.cap_cpu[snap.nodes[snap.open]]
        o_mem = self.fleet.cap_mem[snap.nodes[snap.open]]
        o_util = snap.util[snap.open]
        weighted = ((float((o_cap * o_util).sum()) / cap_cpu if cap_cpu else 0.0)
                    + (float((o_mem * o_util).sum()) / cap_mem if cap_mem else 0.0)) / 2.0
        stranded = (snap.stranded_cpu / cap_cpu if cap_cpu else 0.0,
                    snap.stranded_mem / cap_mem if cap_mem else 0.0)
        if self.start <= now <= self.end:
            self._steady_sum[snap.nodes[snap.open]] += o_util
            self._steady_n[snap.nodes[snap.open]] += 1
            self.steady_samples.append((
                weighted, snap.util_cv, snap.util_jain, *stranded, snap.empty / n if n else 0.0,
                float(snap.in_use), float(snap.bound),
                snap.in_use / snap.bound if snap.bound else 1.0))
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
        s.util_cv.append(_r(snap.util_cv))
        s.util_jain.append(_r(snap.util_jain))
        s.stranded_usable_cpu.append(_r(stranded[0]))
        s.nodes_in_use.append(float(snap.in_use))
        s.packing_bound.append(float(snap.bound))
        for k, name in enumerate(self.class_names):
            series = s.classes[name]
            series.queued.append(float(queued[k]) if queued else 0.0)
            series.unschedulable.append(float(self._ever[k]))
            recent = sorted(self._recent[k])
            series.wait_p50.append(_r(percentile(recent, 0.5)) if recent else None)
            series.wait_p99.append(_r(percentile(recent, 0.99)) if recent else None)
            self._recent[k] = array("d")

    # -- the result -------------------------------------------------------------------------
    def finish(self, pending: int, queued_arrivals: list[tuple[int, float]] | None = None
               ) -> PolicyResult:
        """The result; `queued_arrivals` is (class, arrival time) of what still waits."""
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
        r.steady = self._steady(queued_arrivals or [])
        return r

    def _steady(self, queued_arrivals: list[tuple[int, float]]) -> Steady:
        queued = [0] * len(self.class_names)
        for cls, at in queued_arrivals:
            queued[cls] += self._in_window(at)
        classes = {name: w.result(queued[k])
                   for k, (name, w) in enumerate(zip(self.class_names, self._window,
                                                     strict=True))}
        every = _ClassWindow()
        for w in self._window:
            every.arrivals += w.arrivals
            every.first += w.first
            every.unschedulable += w.unschedulable
            every.abandoned += w.abandoned
            every.waits.extend(w.waits)
        k = len(self.steady_samples)
        avg = [sum(p[i] for p in self.steady_samples) / k if k else 0.0 for i in range(9)]
        seen = self._steady_n > 0
        per_node = np.sort(self._steady_sum[seen] / self._steady_n[seen]).tolist()
        return Steady(
            start_s=self.start, end_s=self.end, samples=k,
            util_mean=_r(avg[0]), util_cv=_r(avg[1]), util_jain=_r(avg[2]),
            stranded_cpu=_r(avg[3]), stranded_memory=_r(avg[4]), empty_nodes=_r(avg[5]),
            nodes_in_use=_r(avg[6]), packing_bound=_r(avg[7]), packing_ratio=_r(avg[8]),
            moves_per_hour=_r(self._moves * 3600.0 / (self.end - self.start))
            if self.end > self.start else 0.0,
            all=every.result(sum(queued)), classes=classes,
            node_utilisation=[_r(percentile(per_node, q / 100)) for q in range(101)])

    def node_utilisation(self) -> list[float]:
        """Each node's utilisation averaged over the samples it was alive for, sorted."""
        seen = self._util_n > 0
        per_node: list[float] = np.sort(self._util_sum[seen] / self._util_n[seen]).tolist()
        return per_node

    def _shares(self) -> dict[str, StrategyShare]:
        present = [i for i, n in enumerate(self._util_n.tolist()) if n]
        total_nodes = len(present) or 1
        total_wins = sum(self.wins.values()) or 1
        out: dict[str, StrategyShare] = {}
        for label in sorted(set(self.labels[i] for i in present) | set(self.wins)):
            members = [i for i in present if self.labels[i] == label]
            util = (sum(float(self._util_sum[i] / self._util_n[i]) for i in members)
                    / len(members) if members else 0.0)
            out[label] = StrategyShare(nodes=len(members),
                                       node_share=_r(len(members) / total_nodes),
                                       wins=self.wins[label],
                                       win_share=_r(self.wins[label] / total_wins),
                                       utilisation=_r(util))
        return out
