"""Writing a run down: the terminal table, ``results.json``, ``results.csv`` and ``report.md``.

Rules: ``results.json`` holds only what the simulation computed — never a wall-clock time
or a path — so the same scenario and seed give the same bytes. Wall-clock speed goes to
the terminal only.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import msgspec

from gavel.sim.metrics import PolicyResult
from gavel.sim.policies import SimResult

__all__ = ["PLOTS", "csv_text", "findings", "markdown_table", "table", "write_results"]

#: plot file -> caption, in the order report.md shows them
PLOTS = {
    "utilisation.png": "Per-node utilisation (time-averaged), sorted, per policy",
    "unschedulable.png": "Queued instances and unschedulable instances over time",
    "winshare.png": "Win share by strategy against its share of the nodes",
    "stranded.png": "Free capacity that no waiting request can use, and room for the largest shape",
}

_COLUMNS = [
    ("policy", "policy", "{}"),
    ("placed", "placements", "{}"),
    ("re-placed", "replacements", "{}"),
    ("unsched", "unschedulable", "{}"),
    ("queued@end", "pending_end", "{}"),
    ("util", "util_mean", "{:.2f}"),
    ("p99", "util_p99", "{:.2f}"),
    ("max/mean", "imbalance", "{:.2f}"),
    ("stranded cpu", "stranded_cpu", "{:.1%}"),
    ("empty nodes", "empty_nodes", "{:.1%}"),
    ("big fits", "largest_fits", "{:.1%}"),
    ("lat p50 s", "latency_p50", "{:.3f}"),
    ("lat p99 s", "latency_p99", "{:.3f}"),
]

_SCALARS = [f for f in PolicyResult.__struct_fields__
            if f not in ("node_utilisation", "strategies", "series", "reasons",
                         "unschedulable_by_class")]


def _cells(p: PolicyResult) -> list[str]:
    return [fmt.format(getattr(p, field)) for _, field, fmt in _COLUMNS]


def table(result: SimResult) -> str:
    """The summary the terminal shows, aligned in columns."""
    rows = [[h for h, _, _ in _COLUMNS]] + [_cells(p) for p in result.policies]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(result: SimResult) -> str:
    head = "| " + " | ".join(h for h, _, _ in _COLUMNS) + " |"
    rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(_COLUMNS))) + "|"
    body = ["| " + " | ".join(_cells(p)) + " |" for p in result.policies]
    return "\n".join([head, rule, *body])


def csv_text(result: SimResult) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*_SCALARS, "reasons"])
    for p in result.policies:
        reasons = ";".join(f"{k}={v}" for k, v in p.reasons.items())
        writer.writerow([*(getattr(p, f) for f in _SCALARS), reasons])
    return out.getvalue()


def _best(policies: list[PolicyResult], key: str, low: bool = True) -> PolicyResult:
    return sorted(policies, key=lambda p: (getattr(p, key) * (1 if low else -1), p.policy))[0]


def findings(result: SimResult) -> list[str]:
    """A few sentences read off the numbers (no judgement beyond them)."""
    ps = result.policies
    if not ps:
        return []
    out = [
        f"Fewest unschedulable instances: **{_best(ps, 'unschedulable').policy}** "
        f"({_best(ps, 'unschedulable').unschedulable} of {ps[0].arrivals} arrivals).",
        f"Least stranded cpu: **{_best(ps, 'stranded_cpu').policy}** "
        f"({_best(ps, 'stranded_cpu').stranded_cpu:.1%} of capacity); most: "
        f"**{_best(ps, 'stranded_cpu', low=False).policy}** "
        f"({_best(ps, 'stranded_cpu', low=False).stranded_cpu:.1%}).",
        f"Most empty nodes (room for big requests, or to scale down): "
        f"**{_best(ps, 'empty_nodes', low=False).policy}** "
        f"({_best(ps, 'empty_nodes', low=False).empty_nodes:.1%} of nodes on average).",
        f"Most nodes able to take the largest shape: "
        f"**{_best(ps, 'largest_fits', low=False).policy}** "
        f"({_best(ps, 'largest_fits', low=False).largest_fits:.1%}); fewest: "
        f"**{_best(ps, 'largest_fits').policy}** ({_best(ps, 'largest_fits').largest_fits:.1%}).",
        f"Most even load (lowest max/mean): **{_best(ps, 'imbalance').policy}** "
        f"({_best(ps, 'imbalance').imbalance:.2f}).",
    ]
    for p in ps:
        if p.kind == "gavel" and len(p.strategies) > 1:
            shares = ", ".join(f"{name} wins {s.win_share:.0%} with {s.node_share:.0%} of nodes"
                               for name, s in p.strategies.items())
            out.append(f"In {p.policy}: {shares}.")
    return out


def _report_md(result: SimResult, plots: list[str]) -> str:
    lines = [
        f"# gavel sim: {result.scenario}",
        "",
        result.description,
        "",
        f"Seed {result.seed}; {result.nodes} nodes at the start ({result.total_nodes} "
        f"with joins); {result.duration_s:g} s of virtual time; request shapes: "
        f"{', '.join(result.shapes)}.",
        "",
        "## Policies",
        "",
        *[f"- **{p.policy}**: {p.description}" for p in result.policies],
        "",
        "## Summary",
        "",
        markdown_table(result),
        "",
        "Utilisation is the committed share (mean of cpu and memory); *stranded cpu* is free "
        "cpu, as a share of capacity, on nodes where none of the queued requests fits, "
        "averaged over the run; *big fits* is the share of nodes that could still take the "
        "largest request shape; latency runs from arrival (or re-queue) to the end of the "
        "winning round, in virtual seconds.",
        "",
        "## Findings",
        "",
        *[f"- {line}" for line in findings(result)],
        "",
    ]
    reasons = [p for p in result.policies if p.reasons]
    if reasons:
        lines += ["## Why rounds failed", ""]
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


def write_results(result: SimResult, out: Path, plots: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_bytes(msgspec.json.format(msgspec.json.encode(result)) + b"\n")
    (out / "results.csv").write_text(csv_text(result))
    (out / "report.md").write_text(_report_md(result, plots))
