"""The pictures: utilisation, unschedulable over time, win share, stranded capacity.

Rules: matplotlib with the Agg backend only (no display, no GUI toolkit); every plot is
drawn from a `SimResult` alone, so a saved ``results.json`` can be drawn again; file names
are fixed (`sim.report.PLOTS`), so ``report.md`` can embed them.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from gavel.sim.policies import SimResult

__all__ = ["draw_all"]

_DPI = 110


def _save(fig: object, path: Path) -> None:
    fig.savefig(path, dpi=_DPI, bbox_inches="tight",  # type: ignore[attr-defined]
                metadata={"Software": None})
    plt.close(fig)  # type: ignore[arg-type]


def _utilisation(result: SimResult, path: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), width_ratios=[3, 2])
    xs = [q / 20 for q in range(21)]
    for p in result.policies:
        style = "-" if p.kind == "gavel" else "--"
        left.plot([x * 100 for x in xs], p.node_utilisation, style, marker=".", label=p.policy)
    left.set_xlabel("nodes, least to most utilised (percentile)")
    left.set_ylabel("time-averaged utilisation (committed share)")
    left.set_ylim(0, 1.02)
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    left.set_title("How load is spread across nodes")
    names = [p.policy for p in result.policies]
    pos = range(len(names))
    width = 0.27
    right.bar([i - width for i in pos], [p.util_mean for p in result.policies], width,
              label="mean")
    right.bar(list(pos), [p.util_p99 for p in result.policies], width, label="p99")
    right.bar([i + width for i in pos], [p.imbalance for p in result.policies], width,
              label="max/mean")
    right.set_xticks(list(pos), names, rotation=30, ha="right", fontsize=8)
    right.grid(axis="y", alpha=0.3)
    right.legend(fontsize=8)
    right.set_title("Utilisation per policy (averaged over samples)")
    fig.suptitle(f"{result.scenario}: utilisation by policy")
    _save(fig, path)


def _unschedulable(result: SimResult, path: Path) -> None:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    for p in result.policies:
        style = "-" if p.kind == "gavel" else "--"
        top.plot(p.series.t, p.series.pending, style, label=p.policy)
        bottom.plot(p.series.t, p.series.unschedulable, style, label=p.policy)
    top.set_ylabel("instances queued")
    top.set_title("Queued (unschedulable, waiting for room)")
    bottom.set_ylabel("instances ever unschedulable")
    bottom.set_xlabel("virtual time (s)")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    top.legend(fontsize=8)
    fig.suptitle(f"{result.scenario}: unschedulable over time")
    _save(fig, path)


def _winshare(result: SimResult, path: Path) -> None:
    gavel = [p for p in result.policies if p.kind == "gavel"] or result.policies[:1]
    gavel = [p for p in gavel if len(p.strategies) > 1] or gavel  # one strategy wins all
    fig, axes = plt.subplots(1, len(gavel), figsize=(5.5 * len(gavel), 4.5), squeeze=False)
    for ax, p in zip(axes[0], gavel, strict=True):
        names = list(p.strategies)
        pos = range(len(names))
        shares = [p.strategies[n] for n in names]
        ax.bar([i - 0.2 for i in pos], [s.node_share for s in shares], 0.4, label="share of nodes")
        ax.bar([i + 0.2 for i in pos], [s.win_share for s in shares], 0.4, label="share of wins")
        ax.plot(list(pos), [s.utilisation for s in shares], "ko", label="mean utilisation")
        ax.set_xticks(list(pos), names)
        ax.set_xlim(-0.8, len(names) - 0.2)
        ax.set_ylim(0, 1.0)
        ax.grid(axis="y", alpha=0.3)
        ax.set_title(p.policy)
        ax.legend(fontsize=8)
    fig.suptitle(f"{result.scenario}: who wins the auctions")
    _save(fig, path)


def _stranded(result: SimResult, path: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [p.policy for p in result.policies]
    pos = range(len(names))
    width = 0.16
    bars = [("stranded cpu", [p.stranded_cpu for p in result.policies]),
            ("stranded memory", [p.stranded_memory for p in result.policies]),
            ("free cpu", [p.free_cpu for p in result.policies]),
            ("empty nodes", [p.empty_nodes for p in result.policies]),
            ("nodes the largest shape fits", [p.largest_fits for p in result.policies])]
    for k, (label, values) in enumerate(bars):
        left.bar([i + (k - 2) * width for i in pos], values, width, label=label)
    left.set_xticks(list(pos), names, rotation=30, ha="right", fontsize=8)
    left.set_ylabel("fraction of capacity / of nodes")
    left.set_ylim(0, max([0.05, *(v for _, vs in bars for v in vs)]) * 1.45)
    left.grid(axis="y", alpha=0.3)
    left.legend(fontsize=7, ncol=2, loc="upper center")
    left.set_title("Averaged over the run")
    for p in result.policies:
        style = "-" if p.kind == "gavel" else "--"
        right.plot(p.series.t, p.series.stranded_cpu, style, label=p.policy)
    right.set_xlabel("virtual time (s)")
    right.set_ylabel("stranded cpu (share of capacity)")
    right.grid(alpha=0.3)
    right.legend(fontsize=8)
    right.set_title("Stranded cpu over time")
    fig.suptitle(f"{result.scenario}: free capacity no waiting request can use")
    _save(fig, path)


def draw_all(result: SimResult, out: Path) -> list[str]:
    """Draw every plot into `out`; returns the file names written."""
    out.mkdir(parents=True, exist_ok=True)
    drawers = {"utilisation.png": _utilisation, "unschedulable.png": _unschedulable,
               "winshare.png": _winshare, "stranded.png": _stranded}
    for name, draw in drawers.items():
        draw(result, out / name)
    return list(drawers)
