"""A comparison of two settings in one sitting: its segments, its pairs and its verdict
(`bench.tuning` rule 6).

Rules:
1. A comparison's segments alternate sides; each pair of neighbouring segments, one a side,
   has the ratio of the defaults' figure to the reference's (none when a side closed no
   round in it). The verdict is the median of those ratios against the bound; the ratio of
   the sides' figures pooled over all their segments is printed beside it.
2. `interval`: the k-th smallest and k-th largest pair ratio for the largest k that leaves at
   most 1 - `CONFIDENCE` of the chance the median of the distribution the pairs are drawn
   from lies outside (a binomial count alone: nothing assumed of their spread). A verdict
   whose bound lies inside it is one the sitting could not tell, and says so.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from gavel.bench.bare import p99

__all__ = ["CONFIDENCE", "Comparison", "Report", "Segment"]

#: Rule 2: how surely a comparison's `interval` holds the median its pairs are drawn from.
CONFIDENCE = 0.9


@dataclass
class Segment:
    """One stretch under one side's settings: its seconds, what it placed, its rounds."""

    side: str  # "defaults" or "reference"
    seconds: float
    placed: int
    round_ms: list[float]
    #: The tuner's level and changes as the segment ended (`bench.tuning` rule 6).
    level: int = 0
    changes: int = 0


@dataclass
class Comparison:
    """One interleaved comparison (`bench.tuning` rules 3, 4): its figure, bound and
    segments."""

    name: str
    key: str  # "round_p99_ms" or "placements_per_s"
    limit: float
    most: bool
    rate: float = 0.0
    #: An open loop's: the capacity whose fraction `rate` is (`bench.tuning` rule 2: the
    #: median of those measured so far, the last just before it).
    capacity: float = 0.0
    segments: list[Segment] = field(default_factory=list)
    #: The 1-minute load average as the comparison began and ended.
    load: tuple[float, float] = (0.0, 0.0)

    def figure(self, side: str, segments: list[Segment] | None = None) -> float:
        """The side's figure over `segments` (all of them by default)."""
        mine = [s for s in (self.segments if segments is None else segments) if s.side == side]
        if self.key == "round_p99_ms":
            return p99([ms for s in mine for ms in s.round_ms])
        seconds = sum(s.seconds for s in mine)
        return sum(s.placed for s in mine) / seconds if seconds else 0.0

    @property
    def ratio(self) -> float:
        """Rule 1: the median of the pairs' ratios."""
        pairs = self.pair_ratios
        return round(statistics.median(pairs), 3) if pairs else 0.0

    @property
    def pooled(self) -> float:
        """Rule 1: defaults over reference, each side's segments pooled."""
        return _ratio(self.figure("defaults"), self.figure("reference"))

    @property
    def pair_ratios(self) -> list[float]:
        """Rule 1: each pair of segments' ratio, in order; a pair one of whose sides has no
        figure (no round closed in its segment) has none."""
        segs, out = self.segments, []
        for k in range(0, len(segs) - 1, 2):
            mine = self.figure("defaults", segs[k:k + 2])
            theirs = self.figure("reference", segs[k:k + 2])
            if mine and theirs:
                out.append(_ratio(mine, theirs))
        return out

    @property
    def interval(self) -> tuple[float, float] | None:
        """Rule 2: the `k`-th smallest and `k`-th largest pair ratio for the largest `k`
        that leaves at most 1 - `CONFIDENCE` of the chance that the median lies outside
        (each pair falls either side of it as a fair coin would); None with fewer than
        five pairs, too few to hold it at that confidence."""
        pairs = sorted(self.pair_ratios)
        n, k = len(pairs), 0
        while 2 * _below(k + 1, n) <= 1 - CONFIDENCE:  # the (k+1)-th from each end holds it too
            k += 1
        return (pairs[k - 1], pairs[n - k]) if k else None

    @property
    def decisive(self) -> bool:
        """Rule 2: whether the bound lies outside the `interval` (without one: no)."""
        span = self.interval
        return span is not None and not span[0] <= self.limit <= span[1]

    @property
    def met(self) -> bool:
        """Judged by rule 1; a comparison without a pair that measured both sides meets
        nothing."""
        if not self.pair_ratios:
            return False
        return self.ratio <= self.limit if self.most else self.ratio >= self.limit

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "rate": self.rate,
                "capacity": self.capacity, "limit": self.limit,
                "at_most": self.most, "ratio": self.ratio, "pooled": self.pooled,
                "met": self.met,
                "defaults": round(self.figure("defaults"), 2),
                "reference": round(self.figure("reference"), 2),
                "pair_ratios": self.pair_ratios, "interval": self.interval,
                "decisive": self.decisive, "load": list(self.load),
                "segments": [{"side": s.side, "seconds": round(s.seconds, 3),
                              "placed": s.placed, "rounds": len(s.round_ms),
                              "round_p99_ms": round(p99(s.round_ms), 2), "level": s.level,
                              "changes": s.changes}
                             for s in self.segments]}

    def line(self) -> str:
        op = "<=" if self.most else ">="
        pairs = ", ".join(f"{r:g}" for r in self.pair_ratios)
        span = self.interval
        within = "" if span is None else (
            f", {CONFIDENCE:.0%} interval {span[0]:g}-{span[1]:g}"
            f"{'' if self.decisive else ': the bound lies inside it, this sitting cannot tell'}")
        return (f"{self.name:<26} {self.key} defaults {self.figure('defaults'):,.1f} vs "
                f"{self.figure('reference'):,.1f} pooled ({self.pooled:g}); median of the pairs "
                f"{self.ratio:g} {op} {self.limit:g} {'met' if self.met else 'MISSED'}{within} "
                f"(pairs {pairs}; load {self.load[0]:.1f}-{self.load[1]:.1f})")


def _below(k: int, n: int) -> float:
    """The chance that fewer than `k` of `n` fair coins come up heads."""
    return sum(math.comb(n, j) for j in range(k)) / float(2 ** n)


def _ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else 0.0


@dataclass
class Report:
    #: The capacities measured, one just before each open loop (`bench.tuning` rule 2).
    capacities: list[float]
    comparisons: list[Comparison]

    @property
    def met(self) -> bool:
        return all(c.met for c in self.comparisons)

    def as_dict(self) -> dict[str, Any]:
        return {"capacities_per_s": self.capacities, "all_met": self.met,
                "comparisons": [c.as_dict() for c in self.comparisons]}
