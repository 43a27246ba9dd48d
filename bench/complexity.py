"""What the complexity buys: each of gavel's speed-only mechanisms against its simplest
alternative, in one sitting (``python -m gavel.bench.complexity``).

Rules:
1. Every mechanism here exists only for speed, and each has a simpler alternative that is
   just as correct and still selectable (`MECHANISMS`): the ledger's own object writing
   (``broker.ledger.objects``, ``packs``) against libgit2's (``--objects libgit2``); the
   writer process against writing on a thread of the broker (``--writer thread``); the
   bench agents' minimal client (``bench.natslite``) against nats-py; the after-commit work
   in slices (`broker.ledger.afterlane` rule 3) against all of a commit's effects in one go
   (``--no-slices``).
2. Each is measured on the figure it exists for (`Mechanism.key`), in pairs of `gavel bench`
   runs made one after the other, the order alternating from pair to pair so neither side
   always gets the warmer machine; the other figures are shown beside it.
3. A ratio is the alternative's figure over the mechanism's, turned so that above 1 means
   the mechanism is better; a mechanism earns its lines when the median ratio over the
   pairs is at least `MARGIN` (and is otherwise reported as not earning them).
4. The lines a mechanism costs are counted from the code as it is (`Mechanism.lines`): its
   modules and functions, less those of the alternative that would replace it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import inspect
import json
import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["MARGIN", "MECHANISMS", "Mechanism", "Outcome", "compare", "main"]

#: Rule 3: the least median ratio on the mechanism's own figure for it to earn its lines.
MARGIN = 1.15


@dataclass(frozen=True)
class Mechanism:
    name: str
    #: What it is for, as a sentence.
    why: str
    #: The `bench.run.Result` figure it exists for, and whether lower is better.
    key: str
    lower: bool
    #: `bench.run.Options` fields for the alternative's runs, and for both sides' runs.
    simple: dict[str, Any]
    workload: dict[str, Any] = field(default_factory=dict)
    #: Figures shown beside the key one.
    also: tuple[str, ...] = ()
    #: Rule 4: ``"module"`` or ``"module:qualname"`` (under `gavel.`) of the mechanism, and
    #: of the alternative.
    code: tuple[str, ...] = ()
    simple_code: tuple[str, ...] = ()

    def lines(self) -> tuple[int, int]:
        """Rule 4: (lines of the mechanism, lines of its alternative)."""
        return sum(_lines(c) for c in self.code), sum(_lines(c) for c in self.simple_code)


def _lines(where: str) -> int:
    import importlib

    module_name, _, qualname = where.partition(":")
    module: ModuleType = importlib.import_module(f"gavel.{module_name}")
    if not qualname:
        return len(Path(inspect.getsourcefile(module) or "").read_text().splitlines())
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return len(inspect.getsourcelines(obj)[0])


MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism(
        name="packs",
        why="the ledger writes blobs, trees and the commit itself, a big commit as one pack",
        key="writer_cpu_us_per_placement", lower=True,
        simple={"broker_flags": ("--objects", "libgit2")},
        also=("placements_per_s", "commit_p99_ms", "round_p99_ms"),
        code=("broker.ledger.objects", "broker.ledger.packs",
              "broker.ledger.cascommit:commit_files", "broker.ledger.repository:Ledger._tidy_packs",
              "broker.ledger.repository:Ledger._raw_object",
              "broker.ledger.repository:Ledger._tree_entries"),
        simple_code=("broker.ledger.cascommit:commit_files_libgit2",
                     "broker.ledger.cascommit:_tree_libgit2",
                     "broker.ledger.cascommit:_stamp")),
    Mechanism(
        name="writer-process",
        why="commits are written by a process of their own, so writing one never holds the "
            "event loop's interpreter lock while bid replies wait",
        key="round_p99_ms", lower=True,
        simple={"broker_flags": ("--writer", "thread")},
        also=("placements_per_s", "commit_p99_ms", "broker_cpu_us_per_placement",
              "writer_cpu_us_per_placement", "broker_rss_mb"),
        code=("broker.ledger.gitwriter:commit_files", "broker.ledger.gitwriter:_writer_started",
              "broker.ledger.gitwriter:_warm", "broker.ledger.gitwriter:make_executor",
              "broker.ledger.committer:Committer._new_writer"),
        simple_code=()),
    Mechanism(
        name="natslite",
        why="the bench's agents answer through a minimal NATS client, not nats-py",
        key="agent_cpu_us_per_reply", lower=True,
        simple={"agent_client": "nats-py"},
        also=("placements_per_s", "round_p99_ms", "broker_cpu_us_per_placement"),
        code=("bench.natslite", "bench.agents:LiteLink"),
        simple_code=()),
    Mechanism(
        name="slices",
        why="after-commit work runs in 0.5 ms slices with bid replies read between them",
        key="round_p99_ms", lower=True,
        simple={"broker_flags": ("--no-slices",)},
        # Short rounds, pinned (not tuned): where a stalled loop shows in the round tail.
        workload={"max_auctions": 2, "batch_max": 24},
        also=("round_p50_ms", "placements_per_s", "broker_cpu_us_per_placement"),
        code=("broker.ledger.afterlane:AfterLane._in_slices",),
        simple_code=()),
)


@dataclass
class Outcome:
    """One mechanism's pairs: (with the mechanism, with the alternative) results as dicts."""

    mechanism: Mechanism
    pairs: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)

    def figures(self, key: str) -> tuple[list[float], list[float]]:
        return ([float(w[key]) for w, _ in self.pairs], [float(s[key]) for _, s in self.pairs])

    @property
    def ratios(self) -> list[float]:
        """Rule 3: above 1, the mechanism is better on its figure."""
        out = []
        for w, s in zip(*self.figures(self.mechanism.key), strict=True):
            num, den = (s, w) if self.mechanism.lower else (w, s)
            out.append(round(num / den, 3) if den else 0.0)
        return out

    @property
    def ratio(self) -> float:
        return round(statistics.median(self.ratios), 3) if self.pairs else 0.0

    @property
    def earns(self) -> bool:
        return self.ratio >= MARGIN

    def as_dict(self) -> dict[str, Any]:
        m = self.mechanism
        lines, simple_lines = m.lines()
        return {"mechanism": m.name, "why": m.why, "key": m.key, "lower_is_better": m.lower,
                "with": self.figures(m.key)[0], "without": self.figures(m.key)[1],
                "ratios": self.ratios, "ratio": self.ratio, "margin": MARGIN,
                "earns": self.earns, "lines": lines, "alternative_lines": simple_lines,
                "also": {k: {"with": self.figures(k)[0], "without": self.figures(k)[1]}
                         for k in m.also}}

    def text(self) -> str:
        m = self.mechanism
        lines, simple_lines = m.lines()
        with_, without = self.figures(m.key)
        out = [f"{m.name}: {m.why}",
               f"  {m.key} ({'lower' if m.lower else 'higher'} is better): with "
               f"{_row(with_)}, without {_row(without)}",
               f"  ratio {self.ratio:g} (pairs {', '.join(f'{r:g}' for r in self.ratios)}); "
               f"{'earns' if self.earns else 'does NOT earn'} its {lines} lines "
               f"(the alternative {simple_lines}) at a margin of {MARGIN:g}"]
        for key in m.also:
            w, s = self.figures(key)
            out.append(f"    {key}: with {_row(w)}, without {_row(s)}")
        return "\n".join(out)


def _row(values: list[float]) -> str:
    return "/".join(f"{v:,.5g}" for v in values)


def compare(base: Any, run: Callable[[Any], Any], pairs: int,
            mechanisms: tuple[Mechanism, ...] = MECHANISMS,
            say: Callable[[str], None] = lambda _: None) -> list[Outcome]:
    """Rule 2: `pairs` pairs of runs of each mechanism, `run(options)` giving a result with
    `as_dict()`; the mechanism's side first in even pairs, the alternative's in odd."""
    outcomes = []
    for m in mechanisms:
        outcome = Outcome(m)
        for k in range(pairs):
            both = dataclasses.replace(base, **m.workload)
            sides = [("with", both), ("without", dataclasses.replace(both, **m.simple))]
            if k % 2:
                sides.reverse()
            got: dict[str, dict[str, Any]] = {}
            for side, opts in sides:
                say(f"{m.name}, pair {k + 1}/{pairs}: {side}")
                got[side] = run(opts).as_dict()
                say(f"{m.name}, pair {k + 1}/{pairs}: {side}: {m.key} {got[side][m.key]}")
            outcome.pairs.append((got["with"], got["without"]))
        outcomes.append(outcome)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    from gavel.bench.run import Options, RunFailed, VerifyError, run

    p = argparse.ArgumentParser(prog="python -m gavel.bench.complexity",
                                description="each speed-only mechanism against its simplest "
                                "alternative, in pairs of `gavel bench` runs")
    p.add_argument("--agents", type=int, default=1000)
    p.add_argument("--placements", type=int, default=20_000)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   choices=[m.name for m in MECHANISMS])
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.agents < 1 or args.placements < 1 or args.pairs < 1:
        p.error("--agents, --placements and --pairs must be at least 1")
    chosen = tuple(m for m in MECHANISMS if not args.only or m.name in args.only)
    base = Options(agents=args.agents, placements=args.placements, progress=False, idle_s=0.0)
    load = [os.getloadavg()]

    def say(what: str) -> None:
        print(f"  {what} (load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)

    try:
        outcomes = compare(base, lambda opts: asyncio.run(run(opts)), args.pairs, chosen, say)
    except (VerifyError, RunFailed) as exc:
        print(f"gavel.bench.complexity: {exc}", file=sys.stderr)
        return 1
    load.append(os.getloadavg())
    loads = [f"{a[0]:.1f}" for a in load]
    if args.json:
        print(json.dumps({"agents": args.agents, "placements": args.placements,
                          "pairs": args.pairs, "load_before_after": loads,
                          "mechanisms": [o.as_dict() for o in outcomes]}))
        return 0
    print(f"{args.agents} agents, {args.placements} placements, {args.pairs} pairs; load "
          f"average {loads[0]} before, {loads[1]} after")
    for o in outcomes:
        print(o.text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
