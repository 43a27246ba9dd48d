"""The end-to-end bench's figures (`bench.endtoend`): per kind, submit -> placed, -> running
and -> healthy, each a p50 and a p99, beside the run's offered load and load average.

Rules:
1. A percentile is the nearest rank of the sorted samples (the p99 of 20 is the largest):
   no interpolation between two starts that happened.
2. Each kind's p50s are also given over the p50 of raw NATS request/replies made one at a
   time over the same seconds (`bench.ceilings.Probe`): how many of the machine's own round
   trips, under the same load, a start takes as a user sees it. The absolute figures move
   with the hour; the ratio moves less (docs/performance.md, "End to end").
3. A kind that was not measured says why in one sentence (`skipped`) and has no figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["KINDS", "STAGES", "KindFigures", "Report", "percentile", "summarize"]

#: What is measured, in the order each round submits them.
KINDS = ("process", "container-warm", "container-cold")
#: The events each submission is timed to.
STAGES = ("placed", "running", "healthy")


def percentile(samples: Sequence[float], q: float) -> float:
    """Rule 1: the `q` quantile (0 to 1) of `samples`, which must not be empty."""
    if not samples:
        raise ValueError("a percentile of no samples")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass(frozen=True)
class KindFigures:
    """One kind's figures in ms (rule 3: `skipped` instead, with no figures)."""

    kind: str
    n: int = 0
    placed_p50_ms: float = 0.0
    placed_p99_ms: float = 0.0
    running_p50_ms: float = 0.0
    running_p99_ms: float = 0.0
    healthy_p50_ms: float = 0.0
    healthy_p99_ms: float = 0.0
    #: Rule 2.
    running_p50_in_reqreply_p50: float = 0.0
    healthy_p50_in_reqreply_p50: float = 0.0
    #: Starts not timed because an event of theirs never came (`bench.endtoend` rule 6).
    lost_events: int = 0
    skipped: str = ""


def summarize(kind: str, samples: dict[str, list[float]], reqreply_p50_ms: float,
              lost_events: int = 0) -> KindFigures:
    """A kind's figures from its samples (ms) of each stage in `STAGES`, and the starts
    that were not timed (`lost_events`)."""
    lengths = {len(samples[s]) for s in STAGES}
    if len(lengths) != 1 or not samples["running"]:
        raise ValueError(f"{kind}: every stage needs the same number of samples, at least one")
    p50 = {stage: round(percentile(samples[stage], 0.5), 1) for stage in STAGES}
    p99 = {stage: round(percentile(samples[stage], 0.99), 1) for stage in STAGES}

    def over(ms: float) -> float:
        return round(ms / reqreply_p50_ms, 1) if reqreply_p50_ms > 0 else 0.0

    return KindFigures(kind=kind, n=len(samples["running"]), placed_p50_ms=p50["placed"],
                       placed_p99_ms=p99["placed"], running_p50_ms=p50["running"],
                       running_p99_ms=p99["running"], healthy_p50_ms=p50["healthy"],
                       healthy_p99_ms=p99["healthy"],
                       running_p50_in_reqreply_p50=over(p50["running"]),
                       healthy_p50_in_reqreply_p50=over(p50["healthy"]),
                       lost_events=lost_events)


@dataclass
class Report:
    """One end-to-end run."""

    #: Measured submissions of each kind, after the uncounted first round.
    n: int
    #: Submissions a second of the background load asked for, what was sent over the
    #: measured seconds, and how many the broker refused (a full machine shows here).
    offered_per_s: float
    sent_per_s: float
    load_refused: int
    #: The 1-minute load average as the measurement began and as it ended, and the cores.
    loadavg_start: float
    loadavg_end: float
    cores: int
    #: Rule 2's unit, and the broker's own round figures over the run (information).
    nats_reqreply_p50_ms: float
    nats_reqreply_p99_ms: float
    round_p50_ms: float
    round_p99_ms: float
    seconds: float
    kinds: list[KindFigures] = field(default_factory=list)
    #: Messages the broker refused over the run, by kind (`gavel nodes`; a healthy run has
    #: none): a lost event may show here.
    rejected: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """The report as a table, the load it was measured at first."""
        out = [f"offered load {self.offered_per_s:g} submits/s (sent {self.sent_per_s:g}/s, "
               f"{self.load_refused} refused); load average {self.loadavg_start:.1f} -> "
               f"{self.loadavg_end:.1f} on {self.cores} cores; {self.seconds:g} s",
               f"raw NATS request/reply p50 {self.nats_reqreply_p50_ms:g} ms, p99 "
               f"{self.nats_reqreply_p99_ms:g} ms; the broker's round p50 "
               f"{self.round_p50_ms:g} ms, p99 {self.round_p99_ms:g} ms",
               f"  {'kind':<15} {'n':>3}  {'placed p50/p99':>17}  {'running p50/p99':>17}  "
               f"{'healthy p50/p99':>17}  {'/ req-reply p50':>15}"]
        for k in self.kinds:
            if k.skipped:
                out.append(f"  {k.kind:<15} skipped: {k.skipped}"
                           + (f" ({k.lost_events})" if k.lost_events else ""))
                continue
            pairs = [f"{getattr(k, s + '_p50_ms'):,.1f}/{getattr(k, s + '_p99_ms'):,.1f}"
                     for s in STAGES]
            out.append(f"  {k.kind:<15} {k.n:>3}  {pairs[0]:>17}  {pairs[1]:>17}  "
                       f"{pairs[2]:>17}  {k.running_p50_in_reqreply_p50:>6g}/"
                       f"{k.healthy_p50_in_reqreply_p50:g}"
                       + (f"  ({k.lost_events} not timed: an event lost)"
                          if k.lost_events else ""))
        if self.rejected:
            out.append("the broker refused: " + ", ".join(
                f"{n} {why}" for why, n in sorted(self.rejected.items())))
        out.append("(ms from the submit request to each event; the last column: the running "
                   "and healthy p50 in raw request/reply p50s)")
        return out
