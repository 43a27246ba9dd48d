"""The broker as `gavel bench` runs it: a child process, so its CPU and RSS are its own.

``python -m gavel.bench.brokerproc --url URL --state DIR [--sample-d D] [--batch-max B]``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from gavel.broker.service import Broker, tune_gc
from gavel.shared.timing import Timing
from gavel.transport import eventloop


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gavel.bench.brokerproc")
    p.add_argument("--url", required=True)
    p.add_argument("--state", type=Path, required=True)
    p.add_argument("--sample-d", type=int, default=None)
    p.add_argument("--batch-max", type=int, default=256)
    p.add_argument("--max-auctions", type=int, default=16)
    p.add_argument("--batch-wait-ms", type=float, default=0.0)
    p.add_argument("--commit-gap-ms", type=float, default=0.0)
    p.add_argument("--ended-max", type=int, default=100_000)
    args = p.parse_args(argv)
    logging.basicConfig(level=os.environ.get("GAVEL_LOG_LEVEL", "WARNING"))

    async def run() -> None:
        broker = Broker(nats_url=args.url, state_dir=args.state,
                        timing=Timing.from_env(os.environ), batch_max=args.batch_max,
                        sample_d=args.sample_d, max_auctions=args.max_auctions,
                        batch_wait_s=args.batch_wait_ms / 1000,
                        commit_gap_s=args.commit_gap_ms / 1000, ended_max=args.ended_max)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, broker.stop)
        await broker.run()

    tune_gc()
    eventloop.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
