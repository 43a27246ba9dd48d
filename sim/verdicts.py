"""The report's verdicts: which policy is best at what, said only when the seeds agree.

Rules:
1. Each question names one steady-state figure and its better direction: most even load
   (lowest capacity-weighted CV), packs best (fewest nodes in use over the packing bound),
   least stranded cpu, most placed on their first auction, and, per workload class, the
   shortest p99 wait.
2. The best policy is the one with the best mean (ties to the earlier policy). It is named
   only when its 95% interval over seeds overlaps no other policy's (`sim.stats.differ`);
   otherwise the verdict is "no difference at N seeds" and lists the policies it cannot
   tell apart. One seed has no intervals, so it decides nothing: each verdict then names the
   best mean alone, and `ONE_SEED` says why once, above them all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import msgspec

from gavel.sim.metrics import PolicyResult
from gavel.sim.stats import Interval, differ

__all__ = ["ONE_SEED", "Question", "Verdict", "describe", "judge", "questions"]

#: Rule 2's one sentence for a run of one seed, said once above its verdicts.
ONE_SEED = ("No difference is told at 1 seed: one seed gives no interval (run --seeds 2 or "
            "more); each line names the best mean only.")


class Verdict(msgspec.Struct, kw_only=True):
    question: str
    figure: str
    #: the policy that is best beyond doubt, or "" when the intervals overlap
    best: str = ""
    #: the policies that cannot be told apart from the best mean ("" best only)
    undecided: list[str] = []
    sentence: str = ""


class Question(NamedTuple):
    title: str
    figure: str  # a key of `PolicyResult.intervals`
    lower_is_better: bool


def _pct(x: float) -> str:
    return f"{x:.1%}"


def _ratio(x: float) -> str:
    return f"{x:.3f}"


def _seconds(x: float) -> str:
    return f"{x:.2f} s" if x < 100 else f"{x:.0f} s"


def formatter(figure: str) -> Callable[[float], str]:
    """How a figure is written: shares in percent, waits in seconds, others as ratios."""
    leaf = figure.rsplit(".", 1)[-1]
    if leaf.startswith("wait_"):
        return _seconds
    if leaf in ("stranded_cpu", "stranded_memory", "empty_nodes", "first_auction"):
        return _pct
    if leaf in ("nodes_in_use", "packing_bound", "unschedulable", "abandoned", "queued_end"):
        return lambda x: f"{x:,.1f}" if x != int(x) else f"{int(x):,}"
    return _ratio


def describe(figure: str, i: Interval) -> str:
    """``0.214 ± 0.006``, or the bare mean for one seed."""
    fmt = formatter(figure)
    half = i.half
    if half is None:
        return fmt(i.mean)
    return f"{fmt(i.mean)} ± {fmt(half)}"


def questions(class_names: Sequence[str]) -> list[Question]:
    """Rule 1."""
    out = [Question("Most even load (capacity-weighted CV of utilisation)", "util_cv", True),
           Question("Packs best (nodes in use over the packing bound)", "packing_ratio", True),
           Question("Least stranded cpu", "stranded_cpu", True),
           Question("Most placed on their first auction", "all.first_auction", False)]
    out += [Question(f"Shortest {name} waits (p99)", f"classes.{name}.wait_p99", True)
            for name in class_names]
    return out


def judge(q: Question, policies: Sequence[PolicyResult], seeds: int) -> Verdict:
    """Rule 2, for one question."""
    have = [p for p in policies if q.figure in p.intervals]
    if len(have) < 2:
        return Verdict(question=q.title, figure=q.figure,
                       sentence=f"{q.title}: only one policy ran, nothing to compare.")
    sign = 1.0 if q.lower_is_better else -1.0
    order = {p.policy: k for k, p in enumerate(have)}
    ranked = sorted(have, key=lambda p: (sign * p.intervals[q.figure].mean, order[p.policy]))
    best = ranked[0]
    top = best.intervals[q.figure]
    close = [p for p in ranked[1:] if not differ(top, p.intervals[q.figure])]
    what = f"{best.policy} ({describe(q.figure, top)})"
    if seeds < 2:
        return Verdict(question=q.title, figure=q.figure, undecided=[p.policy for p in ranked],
                       sentence=f"{q.title}: best mean {what}.")
    if close:
        others = ", ".join(f"{p.policy} ({describe(q.figure, p.intervals[q.figure])})"
                           for p in close)
        return Verdict(question=q.title, figure=q.figure,
                       undecided=[best.policy, *(p.policy for p in close)],
                       sentence=f"{q.title}: no difference at {seeds} seeds between {what} "
                                f"and {others}.")
    runner = ranked[1]
    return Verdict(question=q.title, figure=q.figure, best=best.policy,
                   sentence=f"{q.title}: **{best.policy}** ({describe(q.figure, top)}; next "
                            f"{runner.policy}, {describe(q.figure, runner.intervals[q.figure])}"
                            f").")
