"""`gavel bench --targets`: the throughput targets, each checked by a run of its own.

Rules:
1. A target is one run's settings and the bounds that run's figures must meet. The settings
   are the ones docs/performance.md reports for it, kept here once (`TARGETS`), so "the
   command that produced the numbers" is one command.
2. A verdict compares figures with bounds and nothing else: equal to a bound meets it. A run
   that fails or does not verify itself is an error (`bench.run` raises), never a miss.
3. `scaled` shrinks agents and placements by a factor (a quick look, a test). The figures
   of a scaled run say nothing about the targets: its report says so and misses do not
   count against the exit status.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gavel.bench.run import Options, Result

__all__ = ["TARGETS", "Bound", "Check", "Target", "by_name", "checks", "report_line", "scaled"]

_RESULT_FIELDS = {f.name for f in dataclasses.fields(Result)}


@dataclass(frozen=True)
class Bound:
    """`key` (a `Result` field) at most `limit` (`most`) or at least `limit`."""

    key: str
    limit: float
    most: bool

    def __post_init__(self) -> None:
        if self.key not in _RESULT_FIELDS:
            raise ValueError(f"a bound on {self.key!r}, which no bench run reports")

    @property
    def op(self) -> str:
        return "<=" if self.most else ">="

    def holds(self, value: float) -> bool:
        return value <= self.limit if self.most else value >= self.limit

    def __str__(self) -> str:
        return f"{self.key} {self.op} {self.limit:g}"


def at_least(key: str, limit: float) -> Bound:
    return Bound(key, limit, most=False)


def at_most(key: str, limit: float) -> Bound:
    return Bound(key, limit, most=True)


@dataclass(frozen=True)
class Target:
    name: str
    #: The target as the issue states it.
    text: str
    #: `bench.run.Options` fields for its run (the rest stay at their defaults).
    settings: dict[str, Any]
    bounds: tuple[Bound, ...]

    def options(self, scale: float = 1.0) -> Options:
        return scaled(Options(**self.settings, progress=False), scale)


TARGETS: tuple[Target, ...] = (
    Target("sampled", "1,000 agents, sampled: >= 5,000 placements/s and bid round p99 <= 20 ms",
           {"agents": 1000, "placements": 20_000, "mode": "sampled", "max_auctions": 1,
            "batch_max": 24, "commit_gap_ms": 20.0, "idle_s": 0.0},
           (at_least("placements_per_s", 5000), at_most("round_p99_ms", 20))),
    Target("broadcast",
           "1,000 agents, full broadcast: >= 1,000 placements/s and round p99 <= 50 ms",
           {"agents": 1000, "placements": 20_000, "mode": "broadcast", "rate": 1100.0,
            "max_auctions": 1, "batch_wait_ms": 100.0, "idle_s": 0.0},
           (at_least("placements_per_s", 1000), at_most("round_p99_ms", 50))),
    Target("10k", "10,000 agents, sampled: completes, >= 2,000 placements/s, broker RSS <= "
           "300 MB", {"agents": 10_000, "placements": 50_000, "mode": "sampled",
                      "idle_s": 0.0},
           (at_least("placements_per_s", 2000), at_most("broker_rss_mb", 300))),
    Target("idle", "an idle `gavel worker`: <= 1% of a core and <= 40 MB RSS",
           {"agents": 100, "placements": 1000, "mode": "sampled", "idle_s": 10.0},
           (at_most("idle_worker_cpu_pct", 1), at_most("idle_worker_rss_mb", 40))),
)


def by_name(names: Iterable[str]) -> list[Target]:
    """The targets named, in `TARGETS` order; an unknown name is a ValueError saying which."""
    wanted = list(names)
    known = {t.name for t in TARGETS}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ValueError(f"no target named {unknown[0]!r} (the targets: "
                         f"{', '.join(t.name for t in TARGETS)})")
    return [t for t in TARGETS if t.name in wanted] if wanted else list(TARGETS)


def scaled(opts: Options, scale: float) -> Options:
    """`opts` with agents and placements times `scale` (at least 4 agents, 40 placements,
    no more agent processes than agents); 1 returns `opts` as it is."""
    if scale == 1.0:
        return opts
    agents = max(4, round(opts.agents * scale))
    return dataclasses.replace(opts, agents=agents, processes=min(opts.processes, agents),
                               placements=max(40, round(opts.placements * scale)))


@dataclass(frozen=True)
class Check:
    bound: Bound
    value: float

    @property
    def met(self) -> bool:
        return self.bound.holds(self.value)

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.bound.key, "limit": self.bound.limit,
                "at_most": self.bound.most, "value": self.value, "met": self.met}


def checks(target: Target, result: Result) -> list[Check]:
    figures = result.as_dict()
    return [Check(b, float(figures[b.key])) for b in target.bounds]


def report_line(target: Target, run: int, runs: int, found: Sequence[Check]) -> str:
    parts = [f"{c.bound.key} {c.value:,.2f} {c.bound.op} {c.bound.limit:,g} "
             f"{'met' if c.met else 'MISSED'}" for c in found]
    return f"{target.name:<10} run {run}/{runs}  " + "  ·  ".join(parts)
