"""`gavel bench --end-to-end`: submit -> running and -> healthy as a user feels it, for a
process and a container (warm and cold image), at an offered load (`gavel.bench.endtoend`).

It takes `--n`, `--rate` (the offered submissions a second, 0 by default), `--no-containers`,
`--state` and `--json`; every other run flag of `gavel bench` belongs to the placement run
and is refused beside it, as are `--n` and `--no-containers` without it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from gavel.cli.parsers import positive_int, unusable_dir

__all__ = ["add_arguments", "clash", "run_cli"]

#: What --end-to-end takes; its own flags go with nothing else.
_TAKES = ("rate", "state", "json")
_OWN = ("n", "no_containers")


def add_arguments(p: argparse.ArgumentParser) -> None:
    e = p.add_argument_group("end to end", "submit -> running and -> healthy as a user feels "
                             "it, at an offered load (bench/endtoend.py)")
    e.add_argument("--end-to-end", action="store_true",
                   help="measure submit -> placed, -> running and -> healthy (an exec check "
                   "that passes at once) p50/p99 of a process and of a container of a warm "
                   "and of a cold image, one at a time in turn, while --rate short jobs a "
                   "second are submitted beside them (default 0); containers are skipped, "
                   "saying why, where no Docker Engine answers")
    e.add_argument("--n", type=positive_int, default=20,
                   help="measured submissions of each kind (default 20)")
    e.add_argument("--no-containers", action="store_true",
                   help="measure the process only")


def clash(args: argparse.Namespace, defaults: dict[str, object]) -> str:
    """The sentence for a flag that does not go with --end-to-end, or with its absence; ""
    when the line is fine. `defaults` are the parser's, for telling a flag given."""
    given = [d for d in defaults if getattr(args, d) != defaults[d]]
    if args.end_to_end:
        other = [d for d in given if d not in (*_TAKES, *_OWN, "end_to_end")]
        if other:
            return (f"--{other[0].replace('_', '-')} cannot go with --end-to-end: it takes "
                    "--n, --rate, --no-containers, --state and --json.")
        return ""
    own = [d for d in given if d in _OWN]
    if own:
        return f"--{own[0].replace('_', '-')} only goes with --end-to-end."
    return ""


def run_cli(args: argparse.Namespace) -> int:
    from gavel.bench.endtoend import EndToEndFailed, Options, run

    why = unusable_dir(args.state) if args.state is not None else None
    if why:
        print(f"gavel bench: --state {args.state}: cannot keep the run's state there ({why}).",
              file=sys.stderr)
        return 2
    opts = Options(n=args.n, rate=float(args.rate or 0), containers=not args.no_containers,
                   state=args.state)
    if not args.json:
        print(f"end to end: {opts.n} of each kind at {opts.rate:g} offered submits/s",
              file=sys.stderr, flush=True)
    try:
        report = asyncio.run(run(opts))
    except EndToEndFailed as exc:
        print(f"gavel bench: --end-to-end: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report.as_dict()))
    else:
        print("\n".join(report.lines()))
    return 0
