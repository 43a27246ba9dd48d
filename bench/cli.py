"""`gavel bench`: flags in, numbers out (a table, or JSON with --json)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from broker.parsers import (
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
    p.add_argument("--batch-max", type=positive_int, default=256,
                   help="requests per auction at most (default 256)")
    p.add_argument("--max-auctions", type=positive_int, default=16,
                   help="auctions in flight at once (default 16)")
    p.add_argument("--batch-wait-ms", type=non_negative_float, default=0.0,
                   help="the broker's batch wait: requests wait up to this long for a fuller "
                   "auction (default 0)")
    p.add_argument("--commit-gap-ms", type=non_negative_float, default=0.0,
                   help="the broker's commit gap: the next commit starts no sooner than this "
                   "long after the last (default 0)")
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
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_cli(args: argparse.Namespace) -> int:
    from bench.run import Options, RunFailed, VerifyError, run

    why = unusable_dir(args.state / "logs") if args.state is not None else None
    if why:
        print(f"gavel bench: --state {args.state}: cannot keep the run's state there ({why}).",
              file=sys.stderr)
        return 2
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
    return 0
