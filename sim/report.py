"""Writing a run down: ``results.json``, ``results.csv`` and ``report.md``.

Rules:
1. ``results.json`` holds only what the simulation computed — never a wall-clock time or a
   path — so the same scenario and seeds give the same bytes. Wall-clock speed goes to the
   terminal only.
2. Files are replaced whole (written aside, then renamed), so a run stopped at any moment
   leaves the last complete version: the policies finished so far.
3. report.md's verdicts come from `sim.verdicts` alone — a policy is called best only when
   its interval over seeds clears every other's. Max over mean utilisation is shown as a
   labelled curiosity, never judged on.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

import msgspec

from gavel.sim.metrics import PolicyResult
from gavel.sim.policies import SimResult
from gavel.sim.tables import class_tables, markdown_table, run_table, steady_table
from gavel.sim.verdicts import ONE_SEED

__all__ = ["PLOTS", "csv_text", "report_md", "write_results"]

#: plot file -> caption, in the order report.md shows them
PLOTS = {
    "utilisation.png": "How load is spread: utilisation across nodes, CV and Jain's index",
    "packing.png": "Nodes in use against the packing bound, empty nodes, stranded cpu",
    "classes.png": "Per workload class: p99 wait, queued and unschedulable over time",
    "waits.png": "Per workload class: p99 wait and share placed on the first auction",
    "winshare.png": "Win share by strategy against its share of the nodes",
}

_SCALARS = [f for f in PolicyResult.__struct_fields__
            if f not in ("node_utilisation", "strategies", "series", "reasons",
                         "unschedulable_by_class", "steady", "intervals")]

_DEFINITIONS = [
    "*Steady state*: figures over the window after the warm-up, node figures averaged "
    "over the samples in it, instance figures over the instances that arrived in it.",
    "*Utilisation* of a node: the mean of its committed cpu and memory shares. *util "
    "(weighted)*: its mean over the nodes placements can go to, each weighted by its share "
    "of the fleet's capacity.",
    "*CV (weighted)*: the capacity-weighted coefficient of variation of utilisation "
    "(0 when every node is equally loaded). *Jain*: Jain's index (sum u)^2 / (n sum u^2) "
    "over the same nodes (1 when equal, 1/n when one node holds everything).",
    "*Stranded cpu*: free cpu, as a share of capacity, on nodes some waiting request could "
    "use (its labels match and it fits the node empty) yet none fits now. A node no waiting "
    "request could ever use is not counted, however much it has free.",
    "*Packing bound*: the fewest nodes, largest first, whose cpu covers the committed cpu, "
    "and likewise memory — the larger of the two; no placement of the same work uses fewer "
    "nodes. *In use / bound* is 1 for a perfect packing.",
    "*1st auction*: the share of a class placed by the auction at its arrival. *Wait*: "
    "arrival to the end of the winning round, over the instances placed (the others are "
    "abandoned or still queued).",
]


def csv_text(result: SimResult) -> str:
    figures = sorted({k for p in result.policies for k in p.intervals})
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*_SCALARS, "reasons",
                     *(f"steady.{k}{end}" for k in figures for end in ("", ".low", ".high"))])
    for p in result.policies:
        reasons = ";".join(f"{k}={v}" for k, v in p.reasons.items())
        cells: list[object] = []
        for k in figures:
            i = p.intervals.get(k)
            cells += ["", "", ""] if i is None else [
                i.mean, "" if i.low is None else i.low, "" if i.high is None else i.high]
        writer.writerow([*(getattr(p, f) for f in _SCALARS), reasons, *cells])
    return out.getvalue()


def _seeds(result: SimResult) -> str:
    seeds = result.seeds or [result.seed]
    if len(seeds) == 1:
        return f"seed {seeds[0]} (one seed: no intervals, no verdicts)"
    return (f"{len(seeds)} seeds ({seeds[0]}..{seeds[-1]}); figures are the mean ± half the "
            "95% Student t interval over them")


def report_md(result: SimResult, plots: list[str]) -> str:
    start, end = result.window_s
    names = list(result.policies[0].steady.classes) if result.policies else []
    lines = [
        f"# gavel sim: {result.scenario}", "", result.description, "",
        f"{result.nodes} nodes at the start ({result.total_nodes} with joins); "
        f"{result.duration_s:g} s of virtual time; {_seeds(result)}. Steady-state window "
        f"{start:g}-{end:g} s: the first {start:g} s are warm-up, left out of every figure "
        "but the whole-run table.", "",
        f"{len(result.shapes)} request shapes: {', '.join(result.shapes)}.", "",
        "## Policies", "",
        *[f"- **{p.policy}**: {p.description}" for p in result.policies], "",
        "## Verdicts", "",
        *([ONE_SEED, ""] if len(result.seeds) < 2 and result.verdicts else []),
        *[f"- {v.sentence}" for v in result.verdicts], "",
        "## Summary", "", markdown_table(result), "",
        "## Steady state: evenness and packing", "", steady_table(result), "",
        "## Steady state, per workload class", "",
    ]
    for name, text in class_tables(result, names):
        lines += [f"### {name}", "", text, ""]
    lines += ["## Whole run (first seed)", "", run_table(result), "",
              "*max/mean (curiosity)* is the fullest node's utilisation over the mean. The "
              "fullest node is almost always one a big job filled, so the figure follows "
              "1/mean and says little about placement: it is shown, never judged on.", ""]
    for p in result.policies:
        if p.kind == "gavel" and len(p.strategies) > 1:
            shares = ", ".join(f"{name} wins {s.win_share:.0%} with {s.node_share:.0%} of nodes"
                               for name, s in p.strategies.items())
            lines += [f"In {p.policy}: {shares}.", ""]
    lines += ["## Definitions", "", *[f"- {d}" for d in _DEFINITIONS], ""]
    reasons = [p for p in result.policies if p.reasons]
    if reasons:
        lines += ["## Why rounds failed (first seed)", ""]
        for p in reasons:
            parts = ", ".join(f"{n} {r}" for r, n in sorted(p.reasons.items(),
                                                             key=lambda kv: (-kv[1], kv[0])))
            lines.append(f"- {p.policy}: {parts}")
        lines.append("")
    if plots:
        lines += ["## Plots", ""]
        for name in plots:
            lines += [f"![{PLOTS.get(name, name)}]({name})", ""]
    return "\n".join(lines)


def _replace(path: Path, data: bytes) -> None:
    """Rule 2."""
    aside = path.with_name(f".{path.name}.part")
    aside.write_bytes(data)
    os.replace(aside, path)


def write_results(result: SimResult, out: Path, plots: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    _replace(out / "results.json", msgspec.json.format(msgspec.json.encode(result)) + b"\n")
    _replace(out / "results.csv", csv_text(result).encode())
    _replace(out / "report.md", report_md(result, plots).encode())
