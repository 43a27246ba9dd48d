"""The pictures: how load is spread, how well work is packed, how each class waits.

Rules: matplotlib with the Agg backend only (no display, no GUI toolkit); every plot is
drawn from a `SimResult` alone, so a saved ``results.json`` can be drawn again; file names
are fixed (`sim.report.PLOTS`), so ``report.md`` can embed them. Every axis carries one
quantity and says which; a policy keeps its colour in every plot, and every plot with more
than one policy names them in a legend; time plots shade the warm-up; bars carry the 95%
interval over seeds when there is one, and no error bar at all when there is none (one seed).
A time series of nodes in use beside its packing bound is drawn once per policy, as small
multiples on shared axes: all of them in one panel were a tangle no one could read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from gavel.sim.metrics import PolicyResult
from gavel.sim.policies import SimResult

__all__ = ["draw_all", "figures"]

_DPI = 110
Axes = Any


def _save(fig: Any, path: Path) -> None:
    fig.savefig(path, dpi=_DPI, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)


def _colour(k: int) -> Any:
    return plt.get_cmap("tab10")(k % 10)


def _style(p: PolicyResult) -> str:
    return "-" if p.kind == "gavel" else "--"


def _warmup(ax: Axes, result: SimResult) -> None:
    start = result.window_s[0]
    if start > 0:
        ax.axvspan(0, start, color="0.92", zorder=0, label="_warm-up")


def _intervals(result: SimResult, errors: list[list[float]]) -> list[list[float]] | None:
    """The error bars to draw: none at one seed (there is no interval to show)."""
    return errors if len(result.seeds) > 1 else None


def _bars(ax: Axes, result: SimResult, figure: str, ylabel: str, title: str) -> None:
    """One bar per policy: the mean of `figure`, with its interval when it has one."""
    names = [p.policy for p in result.policies]
    means = [p.intervals[figure].mean if figure in p.intervals else 0.0
             for p in result.policies]
    errors = [[0.0 if (i := p.intervals.get(figure)) is None or i.low is None
               else i.mean - i.low for p in result.policies],
              [0.0 if (i := p.intervals.get(figure)) is None or i.high is None
               else i.high - i.mean for p in result.policies]]
    ax.bar(range(len(names)), means, yerr=_intervals(result, errors), capsize=4,
           color=[_colour(k) for k in range(len(names))])
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)


def _over_time(ax: Axes, result: SimResult, values: Callable[[PolicyResult], list[Any]],
               ylabel: str, title: str, legend: bool = False) -> None:
    _warmup(ax, result)
    for k, p in enumerate(result.policies):
        ys = [math.nan if v is None else v for v in values(p)]
        ax.plot(p.series.t, ys, _style(p), color=_colour(k), label=p.policy, linewidth=1.2,
                marker=".", markersize=2.5)
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=7)


def _utilisation(result: SimResult) -> Any:
    fig, (cdf, cv, jain) = plt.subplots(1, 3, figsize=(15, 4.5), width_ratios=[3, 2, 2],
                                       layout="constrained")
    shares = [q / 100 for q in range(101)]
    for k, p in enumerate(result.policies):
        cdf.step(p.steady.node_utilisation, shares, _style(p), where="post", color=_colour(k),
                 label=p.policy)
    cdf.set_xlabel("node utilisation, averaged over the steady state (committed share)")
    cdf.set_ylabel("share of nodes at or below it")
    cdf.set_xlim(0, 1.02)
    cdf.set_ylim(0, 1.0)
    cdf.grid(alpha=0.3)
    cdf.legend(fontsize=8)
    cdf.set_title("Utilisation across nodes (CDF)", fontsize=10)
    _bars(cv, result, "util_cv", "coefficient of variation (capacity-weighted)",
          "Unevenness: CV of utilisation (lower is more even)")
    _bars(jain, result, "util_jain", "Jain's index", "Evenness: Jain's index (1 is equal)")
    fig.suptitle(f"{result.scenario}: how load is spread (steady state)")
    return fig


def _packing(result: SimResult) -> Any:
    n = len(result.policies)
    cols = min(4, n)
    rows = -(-n // cols)
    fig = plt.figure(figsize=(13, 2.4 * rows + 4.2), layout="constrained")
    halves: Any = fig.subfigures(2, 1, height_ratios=[2.4 * rows, 4.2])
    top, bottom = halves
    multiples = top.subplots(rows, cols, sharex=True, sharey=True, squeeze=False)
    for k, (ax, p) in enumerate(zip(multiples.flat, result.policies, strict=False)):
        _warmup(ax, result)
        ax.plot(p.series.t, p.series.nodes_in_use, _style(p), color=_colour(k),
                label="nodes in use", linewidth=1.2)
        ax.plot(p.series.t, p.series.packing_bound, ":", color="0.25",
                label="packing bound", linewidth=1.0)
        ax.set_title(p.policy, fontsize=9, color=_colour(k))
        ax.grid(alpha=0.3)
    for ax in multiples.flat[n:]:
        ax.set_visible(False)
    for ax in multiples[:, 0]:
        ax.set_ylabel("nodes")
    for ax in multiples[-1, :]:
        ax.set_xlabel("virtual time (s)")
    handles, labels = multiples.flat[0].get_legend_handles_labels()
    top.legend(handles, labels, loc="outside upper right", fontsize=8, ncol=2)
    top.suptitle("Nodes in use against the packing bound, one panel per policy", fontsize=10)
    ratio, empty, stranded = bottom.subplots(1, 3)
    _bars(ratio, result, "packing_ratio", "nodes in use / packing bound",
          "Packing: nodes in use over the bound (1 is perfect)")
    ratio.axhline(1.0, color="0.3", linewidth=0.8)
    _over_time(empty, result, lambda p: p.series.empty_nodes, "empty nodes (share of live nodes)",
               "Empty nodes")
    _over_time(stranded, result, lambda p: p.series.stranded_usable_cpu,
               "stranded cpu (share of capacity)",
               "Stranded cpu: free where a waiting request could run,\nyet none fits",
               legend=True)
    fig.suptitle(f"{result.scenario}: packing against the bound (grey: warm-up)")
    return fig


def _classes(result: SimResult) -> Any:
    names = list(result.policies[0].series.classes)
    fig, axes = plt.subplots(len(names), 3, figsize=(15, 2.6 * len(names) + 0.8),
                             squeeze=False, layout="constrained")
    for row, name in zip(axes, names, strict=True):
        wait, queued, unsched = row

        def p99(p: PolicyResult, n: str = name) -> list[Any]:
            return list(p.series.classes[n].wait_p99)

        def waiting(p: PolicyResult, n: str = name) -> list[Any]:
            return list(p.series.classes[n].queued)

        def ever(p: PolicyResult, n: str = name) -> list[Any]:
            return list(p.series.classes[n].unschedulable)

        _over_time(wait, result, p99, "p99 wait (s)", f"{name}: p99 wait of placements per sample")
        wait.set_yscale("symlog", linthresh=1.0)
        _over_time(queued, result, waiting, "instances queued", f"{name}: queued now")
        _over_time(unsched, result, ever, "instances ever unschedulable",
                   f"{name}: unschedulable so far")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 6),
               fontsize=8)
    fig.suptitle(f"{result.scenario}: each workload class over time (grey: warm-up)")
    return fig


def _waits(result: SimResult) -> Any:
    names = list(result.policies[0].steady.classes)
    fig, (wait, first) = plt.subplots(2, 1, figsize=(max(8.0, 1.6 * len(names) + 3), 8),
                                   layout="constrained")
    count = len(result.policies)
    width = 0.8 / max(count, 1)
    for k, p in enumerate(result.policies):
        for ax, leaf in ((wait, "wait_p99"), (first, "first_auction")):
            xs, ys, lo, hi = [], [], [], []
            for c, name in enumerate(names):
                i = p.intervals.get(f"classes.{name}.{leaf}")
                if i is None:
                    continue
                xs.append(c - 0.4 + (k + 0.5) * width)
                ys.append(i.mean)
                lo.append(0.0 if i.low is None else i.mean - i.low)
                hi.append(0.0 if i.high is None else i.high - i.mean)
            ax.bar(xs, ys, width, yerr=_intervals(result, [lo, hi]), capsize=2,
                   color=_colour(k), label=p.policy)
    wait.set_ylabel("p99 wait, arrival to award (s)")
    wait.set_yscale("symlog", linthresh=1.0)
    wait.set_title("Steady-state p99 wait per workload class", fontsize=10)
    first.set_ylabel("share placed on its first auction")
    first.set_ylim(0, 1.05)
    first.set_title("Steady-state share placed on arrival, per workload class", fontsize=10)
    for ax in (wait, first):
        ax.set_xticks(range(len(names)), names)
        ax.grid(axis="y", alpha=0.3)
    wait.legend(fontsize=7, ncol=3)
    fig.suptitle(f"{result.scenario}: how each class waits")
    return fig


def _winshare(result: SimResult) -> Any:
    gavel = [p for p in result.policies if p.kind == "gavel"] or result.policies[:1]
    gavel = [p for p in gavel if len(p.strategies) > 1] or gavel  # one strategy wins all
    fig, axes = plt.subplots(1, len(gavel), figsize=(5.5 * len(gavel), 4.5), squeeze=False)
    for ax, p in zip(axes[0], gavel, strict=True):
        names = list(p.strategies)
        pos = range(len(names))
        shares = [p.strategies[n] for n in names]
        ax.bar([i - 0.2 for i in pos], [s.node_share for s in shares], 0.4, label="share of nodes")
        ax.bar([i + 0.2 for i in pos], [s.win_share for s in shares], 0.4, label="share of wins")
        ax.set_xticks(list(pos), names)
        ax.set_xlim(-0.8, len(names) - 0.2)
        ax.set_ylim(0, 1.0)
        ax.set_ylabel("share (of nodes, of wins)")
        ax.grid(axis="y", alpha=0.3)
        ax.set_title(p.policy)
        ax.legend(fontsize=8)
    fig.suptitle(f"{result.scenario}: who wins the auctions (first seed)")
    return fig


def figures(result: SimResult) -> dict[str, Any]:
    """Every plot, by its file name, as a matplotlib figure (closed by `draw_all`)."""
    if not result.policies:
        return {}
    drawers: dict[str, Callable[[SimResult], Any]] = {
        "utilisation.png": _utilisation, "packing.png": _packing, "classes.png": _classes,
        "waits.png": _waits, "winshare.png": _winshare}
    return {name: draw(result) for name, draw in drawers.items()}


def draw_all(result: SimResult, out: Path) -> list[str]:
    """Draw every plot into `out`; returns the file names written."""
    out.mkdir(parents=True, exist_ok=True)
    drawn = figures(result)
    for name, fig in drawn.items():
        _save(fig, out / name)
    return list(drawn)
