"""`gavel bench`: flags in, numbers out (a table, or JSON with --json).

With ``--ha`` the same run is made twice in one go, the broker alone and then leading as
with HA (`gavel.bench.run` rule 4), and the figures are shown side by side with the ratio
of placements a second (committed, and durable: on the remote), and of the round p99 (HA
over alone).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from gavel.cli import benchend
from gavel.cli.parsers import (
    non_negative_float,
    positive_float,
    positive_int,
    unusable_dir,
    whole,
)

__all__ = ["add_arguments", "run_cli"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agents", type=positive_int, default=1000,
                   help="live agents, each with its own NATS connection (default 1000)")
    p.add_argument("--placements", type=positive_int, default=20_000,
                   help="placements to submit (default 20000)")
    p.add_argument("--mode", choices=["broadcast", "sampled"], default="sampled",
                   help="ask every node, or d sampled nodes per request (default sampled)")
    p.add_argument("--d", type=positive_int, default=2, help="nodes sampled per request")
    p.add_argument("--processes", type=positive_int, default=4,
                   help="processes the agents are spread over (default 4)")
    p.add_argument("--batch-max", type=positive_int, default=None,
                   help="requests per auction at most (default: the broker tunes it)")
    p.add_argument("--max-auctions", type=positive_int, default=None,
                   help="auctions in flight at once (default: the broker tunes it)")
    p.add_argument("--batch-wait-ms", type=non_negative_float, default=0.0,
                   help="the broker's batch wait: requests wait up to this long for a fuller "
                   "auction (default 0)")
    p.add_argument("--commit-gap-ms", type=non_negative_float, default=None,
                   help="the broker's commit gap: the next commit starts no sooner than this "
                   "long after the last (default: the broker tunes it)")
    p.add_argument("--lifetime-s", type=non_negative_float, default=0.0,
                   help="each instance ends (status 0) this long after it starts: a run "
                   "with churn and retention (default 0: instances run for ever)")
    p.add_argument("--ended-max", type=whole, default=100_000,
                   help="the broker's ended_max: ended records kept in the tree (default "
                   "100000)")
    p.add_argument("--agent-client", choices=["lite", "nats-py"], default="lite",
                   help="how the agents speak NATS: a minimal client that answers as each "
                   "frame is parsed (default), or nats-py as the real worker does")
    p.add_argument("--rate", type=positive_float, default=None,
                   help="submit this many placements a second (default: as fast as taken)")
    p.add_argument("--idle-s", type=non_negative_float, default=10.0,
                   help="seconds to measure one idle `gavel worker` (0 skips; default 10)")
    p.add_argument("--state", type=Path, default=None,
                   help="keep the run's state (git repo, logs) here")
    p.add_argument("--ha", action="store_true",
                   help="run twice: the broker alone, then leading with HA (a lease, every "
                   "commit pushed to a local bare remote before it is told); side by side")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    t = p.add_argument_group("targets", "check the throughput targets, each with the settings "
                             "docs/performance.md reports for it (bench/targets.py)")
    t.add_argument("--targets", action="store_true",
                   help="run each target's own bench and say met or missed, judged by "
                   "ratios to ceilings measured in the same run, the absolute figures beside "
                   "them (exit 3 if any bound is missed, 1 if a run failed: the targets "
                   "after it still run); the run flags above are its, not yours")
    t.add_argument("--tuning", action="store_true",
                   help="the defaults against the latency-tuned settings open loop at 20, 50 "
                   "and 80%% of capacity (round p99) and the throughput-tuned closed loop "
                   "(placements/s), interleaved in one run; prints the ratios (exit 3 if one "
                   "misses its target); takes --agents, --mode, --repeat (pairs), --scale "
                   "(its closed loops' depths and seconds)")
    t.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="only this target (repeatable): sampled, broadcast, 10k, idle, tuning")
    t.add_argument("--repeat", type=positive_int, default=None,
                   help="runs of each target (default 1); for the tuning comparison, its "
                   "pairs of open-loop segments (default 44)")
    t.add_argument("--scale", type=positive_float, default=1.0,
                   help="agents and placements times this (with --tuning, at most 1: its "
                   "closed loops' depths and seconds): a quick look whose figures are not "
                   "the targets' (default 1)")
    benchend.add_arguments(p)


#: The flags only --targets takes; every other flag but --json sets up one run, and with
#: --targets each target's own settings are used instead.
_TARGET_FLAGS = ("only", "repeat", "scale")
#: What --tuning takes: the sitting's size and mode (the rest is each run's own).
_TUNING_FLAGS = ("agents", "mode", "d", "processes", "repeat", "scale", "json", "tuning")


def _clashing(args: argparse.Namespace) -> list[str]:
    """The flags given (set away from their default) that do not go with --targets, or
    without it, as typed."""
    ref = argparse.ArgumentParser()
    add_arguments(ref)
    defaults = vars(ref.parse_args([]))
    if args.tuning:
        dests = [d for d in defaults if d not in _TUNING_FLAGS]
    elif args.targets:
        dests = [d for d in defaults if d not in ("json", "targets", *_TARGET_FLAGS)]
    else:
        dests = list(_TARGET_FLAGS)
    return ["--" + d.replace("_", "-") for d in dests if getattr(args, d) != defaults[d]]


def run_cli(args: argparse.Namespace) -> int:
    from gavel.bench.run import Options, RunFailed, VerifyError, run

    ref = argparse.ArgumentParser()
    add_arguments(ref)
    wrong = benchend.clash(args, vars(ref.parse_args([])))
    if wrong:
        print(f"gavel bench: {wrong}", file=sys.stderr)
        return 2
    if args.end_to_end:
        return benchend.run_cli(args)
    clash = _clashing(args)
    if clash:
        print(f"gavel bench: {clash[0]} " + (
            "cannot go with --tuning: each run of the comparison has its own settings."
            if args.tuning else
            "cannot go with --targets: each target runs with its own settings."
            if args.targets else "only goes with --targets."), file=sys.stderr)
        return 2
    if args.tuning:
        return _run_tuning(args)
    if args.targets:
        return _run_targets(args)
    why = unusable_dir(args.state / "logs") if args.state is not None else None
    if why:
        print(f"gavel bench: --state {args.state}: cannot keep the run's state there ({why}).",
              file=sys.stderr)
        return 2
    if args.ha:
        return _run_ha(args, Options, run, (VerifyError, RunFailed))
    opts = Options(agents=args.agents, placements=args.placements, mode=args.mode, d=args.d,
                   processes=args.processes, batch_max=args.batch_max,
                   max_auctions=args.max_auctions, rate=float(args.rate or 0),
                   batch_wait_ms=args.batch_wait_ms, commit_gap_ms=args.commit_gap_ms,
                   lifetime_s=args.lifetime_s,
                   ended_max=args.ended_max, agent_client=args.agent_client,
                   progress=not args.json, state=args.state,
                   idle_s=args.idle_s)
    try:
        result = asyncio.run(run(opts))
    except VerifyError as exc:
        print(f"gavel bench: verification failed: {exc}", file=sys.stderr)
        return 1
    except RunFailed as exc:
        print(f"gavel bench: the run failed: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result.as_dict()))
        return 0
    rows = result.as_dict()
    width = max(len(k) for k in rows)
    for key, value in rows.items():
        print(f"  {key:<{width}}  {value:,}" if isinstance(value, int | float)
              and not isinstance(value, bool) else f"  {key:<{width}}  {value}")
    print(f"ratios to this run's ceilings: {result.ratios()}")
    print(f"the hour: {result.hour()}")
    return 0


def _options(args: argparse.Namespace, cls: Any, **extra: Any) -> Any:
    return cls(agents=args.agents, placements=args.placements, mode=args.mode, d=args.d,
               processes=args.processes, batch_max=args.batch_max,
               max_auctions=args.max_auctions, rate=float(args.rate or 0),
               batch_wait_ms=args.batch_wait_ms, commit_gap_ms=args.commit_gap_ms,
               lifetime_s=args.lifetime_s, ended_max=args.ended_max,
               agent_client=args.agent_client, progress=not args.json, idle_s=args.idle_s,
               **extra)


def _run_ha(args: argparse.Namespace, cls: Any, run: Any,
            failures: tuple[type[Exception], ...]) -> int:
    """The module docstring's two runs (each state under --state/alone and --state/ha)."""
    results = {}
    for name, ha in (("alone", False), ("ha", True)):
        state = args.state / name if args.state is not None else None
        try:
            results[name] = asyncio.run(run(_options(args, cls, ha=ha, state=state))).as_dict()
        except failures as exc:
            print(f"gavel bench: the {name} run failed: {exc}", file=sys.stderr)
            return 1
    alone, ha_run = results["alone"], results["ha"]
    ratio = {k: round(ha_run[k] / alone[k], 3) if alone[k] else 0.0
             for k in ("placements_per_s", "durable_per_s", "round_p99_ms")}
    if args.json:
        print(json.dumps({"alone": alone, "ha": ha_run, "ratio": ratio}))
        return 0
    width = max(len(k) for k in alone)
    print(f"  {'':<{width}}  {'alone':>14}  {'ha':>14}")
    for key in alone:
        a, h = alone[key], ha_run[key]
        if isinstance(a, int | float) and not isinstance(a, bool):
            print(f"  {key:<{width}}  {a:>14,}  {h:>14,}")
    print(f"ha / alone: placements/s {ratio['placements_per_s']:g} (durable: "
          f"{ratio['durable_per_s']:g}), round p99 {ratio['round_p99_ms']:g}")
    return 0


def _run_tuning(args: argparse.Namespace) -> int:
    """`bench.tuning`'s sitting, its ratios printed (or one JSON object)."""
    from gavel.bench.run import Options, RunFailed, VerifyError, run_with
    from gavel.bench.tuning import PAIRS, options, sitting

    if args.scale > 1:
        print(f"gavel bench: --scale {args.scale:g} with --tuning: a sitting can be made "
              "smaller (its closed loops' depths and seconds), not larger; give at most 1.",
              file=sys.stderr)
        return 2
    base = Options(agents=args.agents, mode=args.mode, d=args.d, processes=args.processes,
                   progress=False, idle_s=0.0)

    def say(name: str) -> None:
        if not args.json:
            print(f"  running {name}", file=sys.stderr, flush=True)

    try:
        report = asyncio.run(run_with(options(base), sitting(args.repeat or PAIRS, say,
                                                             scale=args.scale)))
    except (VerifyError, RunFailed) as exc:
        print(f"gavel bench: --tuning: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report.as_dict()))
    else:
        _print_tuning(report)
        print("the defaults met every target" if report.met else
              "the defaults MISSED a target")
    return 0 if report.met else 3


def _print_tuning(report: Any, indent: str = "") -> None:
    for c in report.comparisons:
        if c.capacity:
            print(f"{indent}  capacity (latency-tuned, closed loop): {c.capacity:,.1f}/s",
                  flush=True)
        print(f"{indent}  " + c.line(), flush=True)


def _run_targets(args: argparse.Namespace) -> int:
    from gavel.bench.run import RunFailed, VerifyError, run
    from gavel.bench.targets import by_name, checks, report_line

    try:
        targets = by_name(args.only)
    except ValueError as exc:
        print(f"gavel bench: --only: {exc}.", file=sys.stderr)
        return 2
    report: list[dict[str, object]] = []
    if args.scale != 1.0 and not args.json:
        print(f"scaled by {args.scale:g}: these figures are not the targets'")
    for target in targets:
        if not args.json:
            print(f"{target.name}: {target.text}", flush=True)
        if target.compared:  # `bench.targets` rule 6
            try:
                report.append(_compared(args, target))
            except (VerifyError, RunFailed) as exc:
                report.append(_failed(target.name, 1, f"gavel bench: target {target.name}",
                                      exc))
            continue
        repeat = args.repeat or 1
        for k in range(1, repeat + 1):
            try:
                result = asyncio.run(run(target.options(args.scale)))
            except (VerifyError, RunFailed) as exc:
                report.append(_failed(target.name, k,
                                      f"gavel bench: target {target.name}, run {k}", exc))
                continue
            found = checks(target, result)
            report.append({"target": target.name, "run": k,
                           "met": all(c.met for c in found),
                           "checks": [c.as_dict() for c in found],
                           "result": result.as_dict()})
            if not args.json:
                print("  " + report_line(target, k, repeat, found), flush=True)
                print(f"  {'':<10} ratios: {result.ratios()}", flush=True)
                print(f"  {'':<10} the hour: {result.hour()}", flush=True)
    scaled = args.scale != 1.0
    met = sum(1 for r in report if r["met"])
    failed = sum(1 for r in report if "error" in r)
    if args.json:
        print(json.dumps({"scale": args.scale, "all_met": met == len(report), "runs": report}))
    else:
        print(f"{met} of {len(report)} runs met every bound"
              + (f"; {failed} failed" if failed else "")
              + (" (scaled: not a verdict on the targets)" if scaled else ""))
    if failed:
        return 1
    return 3 if met < len(report) and not scaled else 0


def _failed(name: str, k: int, who: str, exc: Exception) -> dict[str, object]:
    """A target's run that broke: said now, and kept in the report as a run that met
    nothing, so the targets after it still run and what was measured is still printed."""
    print(f"{who}: {exc}", file=sys.stderr, flush=True)
    return {"target": name, "run": k, "met": False, "error": str(exc)}


def _compared(args: argparse.Namespace, target: Any) -> dict[str, object]:
    """A comparison target: `bench.tuning.sitting` on its settings, `--repeat` pairs."""
    from gavel.bench.run import run_with
    from gavel.bench.tuning import PAIRS, options, sitting

    done = asyncio.run(run_with(options(target.options(args.scale)),
                                sitting(args.repeat or PAIRS, scale=min(args.scale, 1.0))))
    if not args.json:
        _print_tuning(done, "  ")
    return {"target": target.name, "run": 1, "met": done.met, "comparison": done.as_dict()}
