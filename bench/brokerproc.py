"""The broker as `gavel bench` runs it: a child process, so its CPU and RSS are its own.

``python -m gavel.bench.brokerproc --url URL --state DIR [--sample-d D] [--batch-max B]``;
with ``--ha-remote GIT_DIR`` it is one leader of `broker.ha` (a lease on the one server, R1)
pushing every commit to that bare repository before it tells anybody. ``--writer thread``,
``--objects libgit2`` and ``--no-slices`` choose the simpler alternatives `bench.complexity`
measures the broker's speed-only mechanisms against. With ``GAVEL_BENCH_PROFILE=FILE`` in
its environment the broker's main thread runs under cProfile, its statistics written to FILE
when it stops (``python -m pstats FILE``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

from gavel.broker.ha import HaBroker, HaSettings
from gavel.broker.service import Broker, Config, tune_gc
from gavel.shared.admission import DEFAULT_CAPS
from gavel.shared.timing import Timing
from gavel.transport import eventloop

#: The live instances a bench broker admits: more than any run places (`--tuning` keeps a
#: closed loop's backlog up for its segments; `--placements 200000` and more).
BENCH_MAX_INSTANCES = 1_000_000


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gavel.bench.brokerproc")
    p.add_argument("--url", required=True)
    p.add_argument("--state", type=Path, required=True)
    p.add_argument("--sample-d", type=int, default=None)
    p.add_argument("--batch-max", type=int, default=None)  # None: tuned (`shared.tuning`)
    p.add_argument("--max-auctions", type=int, default=None)
    p.add_argument("--batch-wait-ms", type=float, default=0.0)
    p.add_argument("--commit-gap-ms", type=float, default=None)
    p.add_argument("--ended-max", type=int, default=100_000)
    p.add_argument("--ha-remote", type=Path, default=None)
    # The cluster's cap on live instances: a bench sitting places more than the default's.
    p.add_argument("--max-instances", type=int, default=BENCH_MAX_INSTANCES)
    # The simpler alternatives `bench.complexity` measures each mechanism against.
    p.add_argument("--writer", choices=["process", "thread"], default="process")
    p.add_argument("--objects", choices=["packs", "libgit2"], default="packs")
    p.add_argument("--no-slices", action="store_true")
    return p


def config(args: argparse.Namespace) -> Config:
    """The broker's settings from its command line."""
    return Config(nats_url=args.url, state_dir=args.state,
                  timing=Timing.from_env(os.environ), batch_max=args.batch_max,
                  sample_d=args.sample_d, max_auctions=args.max_auctions,
                  batch_wait_s=args.batch_wait_ms / 1000,
                  commit_gap_s=None if args.commit_gap_ms is None
                  else args.commit_gap_ms / 1000, ended_max=args.ended_max,
                  writer=args.writer, objects=args.objects, after_slices=not args.no_slices,
                  caps=DEFAULT_CAPS._replace(instances=args.max_instances))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=os.environ.get("GAVEL_LOG_LEVEL", "WARNING"))

    async def run() -> None:
        settings = config(args)
        broker: Broker | HaBroker
        if args.ha_remote is not None:
            broker = HaBroker(replace(settings, broker_id="bench"),
                              settings=HaSettings(remote=str(args.ha_remote), replicas=1))
        else:
            broker = Broker(settings)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, broker.stop)
        await broker.run()

    tune_gc()
    profile = os.environ.get("GAVEL_BENCH_PROFILE")
    if not profile:
        eventloop.run(run())
        return 0
    import cProfile  # a developer's look at where the broker's time goes

    with cProfile.Profile() as prof:
        eventloop.run(run())
    prof.dump_stats(profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
