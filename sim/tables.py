"""The tables a run prints and reports: the terminal summary and report.md's tables.

Rules: steady-state figures are written as the mean over seeds and, with two seeds or
more, ``± half the 95% interval``; whole-run counts are the first seed's. Columns are
fixed lists, so the terminal table and report.md always agree.
"""

from __future__ import annotations

from collections.abc import Callable

from gavel.sim.metrics import PolicyResult
from gavel.sim.policies import SimResult
from gavel.sim.verdicts import formatter

__all__ = ["class_tables", "markdown_table", "run_table", "steady_table", "table"]

Cell = Callable[[PolicyResult], str]


def _figure(key: str, compact: bool = False) -> Cell:
    fmt = formatter(key)

    def cell(p: PolicyResult) -> str:
        i = p.intervals.get(key)
        if i is None:
            return "-"
        if i.half is None:
            return fmt(i.mean)
        return f"{fmt(i.mean)}{'±' if compact else ' ± '}{fmt(i.half)}"
    return cell


def _field(name: str, spec: str = "{}") -> Cell:
    return lambda p: spec.format(getattr(p, name))


_SUMMARY: list[tuple[str, Cell]] = [
    ("policy", _field("policy")),
    ("placed", _field("placements")),
    ("unsched", _field("unschedulable")),
    ("abandoned", _field("abandoned")),
    ("util", _figure("util_mean", True)),
    ("CV", _figure("util_cv", True)),
    ("Jain", _figure("util_jain", True)),
    ("in use/bound", _figure("packing_ratio", True)),
    ("stranded cpu", _figure("stranded_cpu", True)),
    ("empty", _figure("empty_nodes", True)),
    ("1st auction", _figure("all.first_auction", True)),
    ("wait p99", _figure("all.wait_p99", True)),
]

_STEADY: list[tuple[str, Cell]] = [
    ("policy", _field("policy")),
    ("util (weighted)", _figure("util_mean")),
    ("CV (weighted)", _figure("util_cv")),
    ("Jain", _figure("util_jain")),
    ("nodes in use", _figure("nodes_in_use")),
    ("packing bound", _figure("packing_bound")),
    ("in use / bound", _figure("packing_ratio")),
    ("stranded cpu", _figure("stranded_cpu")),
    ("stranded memory", _figure("stranded_memory")),
    ("empty nodes", _figure("empty_nodes")),
]

_RUN: list[tuple[str, Cell]] = [
    ("policy", _field("policy")),
    ("arrivals", _field("arrivals")),
    ("placed", _field("placements")),
    ("re-placed", _field("replacements")),
    ("migrated", _field("migrations")),
    ("lost", _field("lost")),
    ("unsched", _field("unschedulable")),
    ("abandoned", _field("abandoned")),
    ("queued@end", _field("pending_end")),
    ("util", _field("util_mean", "{:.2f}")),
    ("max/mean (curiosity)", _field("imbalance", "{:.2f}")),
    ("lat p50 s", _field("latency_p50", "{:.3f}")),
    ("lat p99 s", _field("latency_p99", "{:.3f}")),
]


def _class_columns(name: str) -> list[tuple[str, Cell]]:
    base = f"classes.{name}."
    return [("policy", _field("policy")),
            ("arrivals", lambda p: str(p.steady.classes[name].arrivals
                                       if name in p.steady.classes else "-")),
            ("1st auction", _figure(base + "first_auction")),
            ("wait p50", _figure(base + "wait_p50")),
            ("wait p99", _figure(base + "wait_p99")),
            ("unschedulable", _figure(base + "unschedulable")),
            ("abandoned", _figure(base + "abandoned")),
            ("queued at end", _figure(base + "queued_end"))]


def _rows(result: SimResult, columns: list[tuple[str, Cell]]) -> list[list[str]]:
    return [[h for h, _ in columns]] + [[cell(p) for _, cell in columns]
                                        for p in result.policies]


def _markdown(rows: list[list[str]]) -> str:
    head = "| " + " | ".join(rows[0]) + " |"
    rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(rows[0]))) + "|"
    return "\n".join([head, rule, *("| " + " | ".join(r) + " |" for r in rows[1:])])


def table(result: SimResult) -> str:
    """The summary the terminal shows, aligned in columns."""
    rows = _rows(result, _SUMMARY)
    widths = [max(len(r[i]) for r in rows) for i in range(len(_SUMMARY))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(result: SimResult) -> str:
    """The summary, as report.md shows it."""
    return _markdown(_rows(result, _SUMMARY))


def steady_table(result: SimResult) -> str:
    return _markdown(_rows(result, _STEADY))


def run_table(result: SimResult) -> str:
    return _markdown(_rows(result, _RUN))


def class_tables(result: SimResult, names: list[str]) -> list[tuple[str, str]]:
    """(class, its table) for every workload class."""
    return [(name, _markdown(_rows(result, _class_columns(name)))) for name in names]
