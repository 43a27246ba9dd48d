"""``gavel sim``: run a scenario, benchmark the engine, or replay a state repository.

Rules: `add_arguments` and `run` are the whole interface (the broker's CLI mounts them as a
subcommand). Exit codes: 0 done, 2 bad input (one sentence on stderr naming the field and
what was expected), 1 anything else that stopped the run. Progress goes to stderr; the
summary table and the speed line go to stdout.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import gavel.sim
from gavel.cli.parsers import positive_int, unusable_dir

if TYPE_CHECKING:  # the simulator loads only when `gavel sim` runs (numpy is heavy)
    from gavel.sim.engine import Progress
    from gavel.sim.scenario import Scenario

__all__ = ["SCENARIOS", "add_arguments", "run"]

#: the example scenarios shipped with gavel; ``gavel sim smoke`` finds smoke.toml here
SCENARIOS = Path(gavel.sim.__file__).parent / "scenarios"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="?", metavar="SCENARIO.toml",
                        help="a scenario file or the name of a shipped one "
                             f"({', '.join(sorted(p.stem for p in SCENARIOS.glob('*.toml')))});"
                             " with --replay, the REV_RANGE to replay (default: main)")
    parser.add_argument("--out", type=Path, help="output directory (default: sim-out/<name>)")
    parser.add_argument("--seed", type=int, help="random seed (default: the scenario's)")
    parser.add_argument("--policies", help="comma-separated policies to run (default: all)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--naive", action="store_true",
                        help="ask every node for every auction (slow; for checking)")
    bench = parser.add_argument_group("benchmark")
    bench.add_argument("--bench", action="store_true",
                       help="measure simulated placements per second of wall time")
    bench.add_argument("--nodes", type=positive_int, default=1000, help="benchmark fleet size")
    bench.add_argument("--placements", type=positive_int, default=100_000,
                       help="benchmark arrivals")
    replay = parser.add_argument_group("replay")
    replay.add_argument("--replay", type=Path, metavar="STATE_REPO",
                        help="re-decide the auctions recorded in a gavel state repository")
    replay.add_argument("--award", default="lowest",
                        help="award rule for the replay: lowest (production), highest, "
                             "random, or sample:D (lowest of D random answers)")
    replay.add_argument("--switch", action="append", default=[], metavar="NODES=STRATEGY",
                        help="re-bid these nodes (an id or a glob like 'n00*') with another "
                             "strategy, e.g. 'n0003=binpack' or '*=headroom:ceiling=0.7'")
    replay.add_argument("--capacity", default="cpu=8,memory_mb=16384,ports=1000",
                        help="capacity assumed for switched nodes (the ledger does not "
                             "record it)")


def run(args: argparse.Namespace) -> int:
    from gavel.sim.bench import run_bench
    from gavel.sim.scenario import ScenarioError, load_scenario

    try:
        if args.bench:
            only = set(args.policies.split(",")) if args.policies else {"gavel:mixed"}
            run_bench(args.nodes, args.placements, only, args.seed or 1)
            return 0
        if args.replay is not None:
            from gavel.sim.replay import run_replay

            return run_replay(args)
        if not args.target:
            print("gavel sim: expected a scenario file (or --replay STATE_REPO, or --bench).",
                  file=sys.stderr)
            return 2
        return _simulate(args, load_scenario(_resolve(args.target)))
    except ScenarioError as exc:
        print(f"gavel sim: {exc}", file=sys.stderr)
        return 2


def _resolve(target: str) -> Path:
    path = Path(target)
    if not path.exists() and (SCENARIOS / f"{target}.toml").exists():
        return SCENARIOS / f"{target}.toml"
    return path


def _simulate(args: argparse.Namespace, scenario: Scenario) -> int:
    from gavel.sim.plots import draw_all
    from gavel.sim.policies import plan, simulate
    from gavel.sim.report import table, write_results

    seed = scenario.seed if args.seed is None else args.seed
    only = set(args.policies.split(",")) if args.policies else None
    names = [spec.name for spec in plan(scenario, seed)]
    if only is not None and not only <= set(names):
        unknown = sorted(only - set(names))[0]
        print(f"gavel sim: --policies: expected names from {', '.join(names)}, "
              f"got {unknown!r}.", file=sys.stderr)
        return 2
    out = args.out or Path("sim-out") / scenario.name
    why = unusable_dir(out)
    if why:
        print(f"gavel sim: --out {out}: cannot write the results there ({why}).",
              file=sys.stderr)
        return 2
    bar = None if args.quiet else _Bar(sys.stderr)
    started = time.perf_counter()
    result = simulate(scenario, seed, only, bar.policy if bar else None, naive=args.naive)
    wall = time.perf_counter() - started
    plots = [] if args.no_plots else draw_all(result, out)
    write_results(result, out, plots)
    placed = sum(p.placements + p.replacements + p.migrations for p in result.policies)
    print(f"gavel sim {scenario.name}: {result.nodes} nodes, seed {seed}, "
          f"{scenario.duration_s:g} s of virtual time")
    print(table(result))
    print(f"simulated {placed} placements in {wall:.2f} s of wall time "
          f"({placed / wall if wall > 0 else 0:.0f} placements/s); results in {out}/")
    return 0


class _Bar:
    """A one-line progress bar per policy on stderr."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.live = stream.isatty()

    def policy(self, name: str) -> Progress:
        started = time.perf_counter()

        def show(fraction: float) -> None:
            if not self.live and fraction < 1.0:
                return
            filled = int(fraction * 30)
            end = "\n" if fraction >= 1.0 else ""
            wall = time.perf_counter() - started
            self.stream.write(f"\r  {name:<18} [{'#' * filled}{'.' * (30 - filled)}] "
                              f"{fraction:4.0%} {wall:6.1f} s{end}")
            self.stream.flush()
        return show
