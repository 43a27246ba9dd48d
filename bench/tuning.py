"""`gavel bench --tuning`: the self-tuning defaults against the hand-tuned settings, side by
side in one sitting.

Rules:
1. Capacity is the closed-loop placements/s of the latency-tuned settings (`LATENCY`),
   measured first in the same sitting: the load the latency target is claimed at. Above it
   the latency-tuned broker no longer keeps up, and its round p99 stops saying what a user
   waits.
2. Each comparison is a pair of runs made one after the other, the order alternating from
   pair to pair so neither side always gets the warmer machine: the defaults (nothing
   given: `shared.tuning` chooses) against the latency-tuned settings open loop at each
   fraction of capacity in `FRACTIONS` (round p99, defaults over latency-tuned: target at
   most `LATENCY_RATIO`), and against the throughput-tuned settings (`THROUGHPUT`) closed
   loop (placements/s, defaults over throughput-tuned: target at least
   `THROUGHPUT_RATIO`).
3. With several pairs each ratio is the median of the pairs' ratios; a ratio is judged, never
   an absolute figure, so a verdict holds in a slow hour as in a fast one.
4. An open-loop run submits for about `OPEN_S` seconds at its rate (at least 500 placements).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gavel.bench.run import Options, Result

__all__ = ["FRACTIONS", "LATENCY", "LATENCY_RATIO", "OPEN_S", "THROUGHPUT",
           "THROUGHPUT_RATIO", "Comparison", "Report", "compare"]

#: The hand-tuned settings (`bench.run.Options` fields).
LATENCY: dict[str, Any] = {"max_auctions": 1, "batch_max": 24, "commit_gap_ms": 20.0}
THROUGHPUT: dict[str, Any] = {"max_auctions": 16, "batch_max": 256, "commit_gap_ms": 0.0}
#: What the defaults are held to (rule 2).
FRACTIONS = (0.2, 0.5, 0.8)
LATENCY_RATIO = 1.5
THROUGHPUT_RATIO = 0.9
OPEN_S = 8.0


@dataclass
class Comparison:
    """One side-by-side comparison: its name, the figure compared, and each pair's runs."""

    name: str
    key: str
    #: The bound on defaults over reference, and whether it is an upper bound.
    limit: float
    most: bool
    rate: float = 0.0
    pairs: list[tuple[Result, Result]] = field(default_factory=list)  # (defaults, reference)

    @property
    def ratios(self) -> list[float]:
        out = []
        for tuned, ref in self.pairs:
            a, b = float(getattr(tuned, self.key)), float(getattr(ref, self.key))
            out.append(round(a / b, 3) if b else 0.0)
        return out

    @property
    def ratio(self) -> float:
        """Rule 3."""
        return round(statistics.median(self.ratios), 3) if self.pairs else 0.0

    @property
    def met(self) -> bool:
        return self.ratio <= self.limit if self.most else self.ratio >= self.limit

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "rate": self.rate, "limit": self.limit,
                "at_most": self.most, "ratios": self.ratios, "ratio": self.ratio,
                "met": self.met,
                "defaults": [t.as_dict() for t, _ in self.pairs],
                "reference": [r.as_dict() for _, r in self.pairs]}

    def line(self) -> str:
        tuned = [float(getattr(t, self.key)) for t, _ in self.pairs]
        ref = [float(getattr(r, self.key)) for _, r in self.pairs]
        op = "<=" if self.most else ">="
        return (f"{self.name:<26} {self.key} defaults {_figs(tuned)} vs {_figs(ref)}: ratio "
                f"{self.ratio:g} {op} {self.limit:g} {'met' if self.met else 'MISSED'}")


def _figs(values: list[float]) -> str:
    return "/".join(f"{v:,.1f}" for v in values)


@dataclass
class Report:
    capacity: float
    capacity_runs: list[Result]
    comparisons: list[Comparison]

    @property
    def met(self) -> bool:
        return all(c.met for c in self.comparisons)

    def as_dict(self) -> dict[str, Any]:
        return {"capacity_per_s": self.capacity, "all_met": self.met,
                "capacity_runs": [r.as_dict() for r in self.capacity_runs],
                "comparisons": [c.as_dict() for c in self.comparisons]}


Runner = Callable[[Options], Result]
Say = Callable[[str], None]


def compare(base: Options, run: Runner, pairs: int = 1, say: Say = lambda _: None) -> Report:
    """Rules 1-4 on `base` (agents, mode, placements of the closed loops); `run` makes one
    run and `say` hears each run's name as it starts."""
    def one(name: str, opts: Options) -> Result:
        say(name)
        return run(opts)

    def pair(k: int, tuned: Options, ref: Options, name: str) -> tuple[Result, Result]:
        if k % 2:  # rule 2: the order alternates
            r = one(f"{name} (reference)", ref)
            return one(f"{name} (defaults)", tuned), r
        t = one(f"{name} (defaults)", tuned)
        return t, one(f"{name} (reference)", ref)

    closed = dataclasses.replace(base, rate=0.0, batch_max=None, max_auctions=None,
                                 commit_gap_ms=None)
    capacity_runs = [one("capacity: latency-tuned, closed loop",
                         dataclasses.replace(closed, **LATENCY)) for _ in range(pairs)]
    capacity = statistics.median(r.placements_per_s for r in capacity_runs)
    comparisons = []
    for frac in FRACTIONS:
        rate = round(frac * capacity, 1)
        placements = max(500, round(rate * OPEN_S))
        c = Comparison(f"open loop {frac:.0%} ({rate:,.0f}/s)", "round_p99_ms",
                       LATENCY_RATIO, most=True, rate=rate)
        opened = dataclasses.replace(closed, rate=rate, placements=placements)
        for k in range(pairs):
            c.pairs.append(pair(k, opened, dataclasses.replace(opened, **LATENCY), c.name))
        comparisons.append(c)
    c = Comparison("closed loop", "placements_per_s", THROUGHPUT_RATIO, most=False)
    for k in range(pairs):
        c.pairs.append(pair(k, closed, dataclasses.replace(closed, **THROUGHPUT), c.name))
    comparisons.append(c)
    return Report(capacity, capacity_runs, comparisons)
