"""``gavel sim``: run a scenario, benchmark the engine, or replay a state repository.

Rules: `add_arguments` and `run` are the whole interface (the broker's CLI mounts them as a
subcommand). Exit codes: 0 done, 2 bad input (one sentence on stderr naming the field and
what was expected), 130 stopped by the operator (Ctrl-C), 1 anything else that stopped the
run. Progress, with the time left, goes to stderr; the summary table and the speed line
go to stdout. Each policy's results are written as soon as all its seeds have run, so a
run stopped half-way keeps the policies it finished; plots are drawn at the end.
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
    parser.add_argument("--seeds", type=positive_int, default=1, metavar="N",
                        help="run every policy with N seeds (seed, seed+1, ...) and give "
                             "each figure a 95%% interval; verdicts need N >= 2")
    parser.add_argument("--policies", help="comma-separated policies to run (default: all)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--naive", action="store_true",
                        help="ask every node for every auction (slow; for checking)")
    bench = parser.add_argument_group("benchmark")
    bench.add_argument("--bench", action="store_true",
                       help="measure simulated placements per second of wall time")
    bench.add_argument("--nodes", type=positive_int,
                       help="benchmark fleet size (default: 1000, or the scenario's)")
    bench.add_argument("--placements", type=positive_int,
                       help="benchmark arrivals (default: 100000, or the scenario's)")
    bench.add_argument("--scenario", metavar="SCENARIO",
                       help="benchmark this scenario (a file or a shipped name), scaled to "
                            "--nodes and --placements when given")
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
            scenario = load_scenario(_resolve(args.scenario)) if args.scenario else None
            first = f"gavel:{scenario.gavel[0].name}" if scenario else "gavel:mixed"
            only = set(args.policies.split(",")) if args.policies else {first}
            run_bench(args.nodes, args.placements, only, args.seed or 1, scenario=scenario)
            return 0
        if args.replay is not None:
            from gavel.sim.replay import run_replay

            return run_replay(args)
        if not args.target:
            print("gavel sim: expected a scenario file (or --replay STATE_REPO, or --bench).",
                  file=sys.stderr)
            return 2
        target = _resolve(args.target)
        if _preemption(target):  # its own kind of run (`gavel.sim.preemption`)
            from gavel.sim.preemption import main as preemption

            return preemption([str(target)])
        return _simulate(args, load_scenario(target))
    except ScenarioError as exc:
        print(f"gavel sim: {exc}", file=sys.stderr)
        return 2


def _preemption(path: Path) -> bool:
    """A preemption scenario says so (``kind = "preemption"``); anything else, readable or
    not, is left to `load_scenario` and its sentences."""
    import tomllib

    try:
        return bool(tomllib.loads(path.read_text()).get("kind") == "preemption")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False


def _resolve(target: str) -> Path:
    path = Path(target)
    if not path.exists() and (SCENARIOS / f"{target}.toml").exists():
        return SCENARIOS / f"{target}.toml"
    return path


def _simulate(args: argparse.Namespace, scenario: Scenario) -> int:
    from gavel.sim.plots import draw_all
    from gavel.sim.policies import SimResult, plan, simulate
    from gavel.sim.report import write_results
    from gavel.sim.tables import table
    from gavel.sim.verdicts import ONE_SEED

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
    runs = len([n for n in names if only is None or n in only]) * args.seeds
    bar = _Progress(sys.stderr, runs, quiet=args.quiet)
    started = time.perf_counter()
    done: list[SimResult] = []

    def finished(result: SimResult) -> None:
        write_results(result, out, [])
        done[:] = [result]
        bar.wrote(result.policies[-1].policy, out)

    try:
        result = simulate(scenario, seed, only, bar.run, naive=args.naive, seeds=args.seeds,
                          done=finished)
    except KeyboardInterrupt:
        kept = len(done[0].policies) if done else 0
        print(f"\ngavel sim: stopped; {kept} finished "
              f"polic{'y' if kept == 1 else 'ies'} kept in {out}/.", file=sys.stderr)
        return 130
    wall = time.perf_counter() - started
    plots = [] if args.no_plots else draw_all(result, out)
    write_results(result, out, plots)
    placed = sum(p.placements + p.replacements + p.migrations for p in result.policies)
    seeds = f"seed {seed}" if args.seeds == 1 else f"seeds {seed}..{seed + args.seeds - 1}"
    print(f"gavel sim {scenario.name}: {result.nodes} nodes, {seeds}, "
          f"{scenario.duration_s:g} s of virtual time")
    print(table(result))
    if args.seeds == 1 and result.verdicts:
        print(f"  {ONE_SEED}")
    for verdict in result.verdicts:
        print(f"  {verdict.sentence.replace('**', '')}")
    print(f"simulated {placed} placements (first seed) in {wall:.2f} s of wall time "
          f"({placed * args.seeds / wall if wall > 0 else 0:.0f} placements/s); "
          f"results in {out}/")
    return 0


class _Progress:
    """Progress on stderr: a live bar with the time left on a terminal, one line per
    finished run elsewhere. The time left assumes the remaining runs go as fast as the
    finished part did."""

    def __init__(self, stream: TextIO, runs: int, quiet: bool = False) -> None:
        self.stream = stream
        self.live = stream.isatty() and not quiet
        self.quiet = quiet
        self.runs = max(runs, 1)
        self.finished = 0
        self.started = time.perf_counter()

    def _eta(self, fraction: float) -> str:
        done = (self.finished + fraction) / self.runs
        wall = time.perf_counter() - self.started
        if done <= 0:
            return "?"
        left = wall / done * (1.0 - done)
        return f"{left:.0f} s" if left < 120 else f"{left / 60:.1f} min"

    def run(self, name: str, seed: int) -> Progress | None:
        if self.quiet:
            return None
        started = time.perf_counter()
        label = f"{name} seed {seed}"

        def show(fraction: float) -> None:
            wall = time.perf_counter() - started
            if fraction >= 1.0:
                self.finished += 1
                self.stream.write(f"\r  {label:<28} 100% done in {wall:6.1f} s  "
                                  f"[{self.finished}/{self.runs}]  ETA {self._eta(0.0)}\n")
            elif self.live:
                filled = int(fraction * 30)
                self.stream.write(f"\r  {label:<28} [{'#' * filled}{'.' * (30 - filled)}] "
                                  f"{fraction:4.0%} {wall:6.1f} s  ETA {self._eta(fraction)}")
            else:
                return
            self.stream.flush()
        return show

    def wrote(self, policy: str, out: Path) -> None:
        if not self.quiet:
            self.stream.write(f"  {policy}: results written to {out}/results.json\n")
            self.stream.flush()
