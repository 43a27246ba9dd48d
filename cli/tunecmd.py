"""`gavel tune`: read, pin or release the auctioneer's batch size, rounds in flight and commit
gap on a running broker (`broker.auctioneer` rule 13), as its ``--batch-max``,
``--max-auctions`` and ``--commit-gap-ms`` would at its start.

Rules:
1. With no value it only reads: the settings in force, which are pinned, the tuner's level,
   and the bid rounds closed since the settings last changed (how many, p50 and p99).
2. With values it pins those and tunes the rest again, from a fresh tuner at its first
   level; ``--auto`` tunes every value again. Either prints the settings now and the rounds
   of the settings replaced. ``--auto`` beside a value, or a value out of bounds, is bad
   input (exit 2).
3. Nothing is kept: a broker that restarts, or a new leader, starts from its config.
"""

from __future__ import annotations

import argparse
import math

from gavel.cli.readouts import print_json, print_table
from gavel.client import Client
from gavel.shared.api import TuneReply
from gavel.shared.errors import BadInput

__all__ = ["tune"]

#: The settings, in the reply's order: its field, the flag that pins it, what it is.
SETTINGS = (("batch_max", "--batch-max", "requests a round carries"),
            ("max_auctions", "--max-auctions", "rounds in flight"),
            ("commit_gap_ms", "--commit-gap-ms", "ms between commits at least"))


async def tune(args: argparse.Namespace) -> int:
    values = {"batch_max": args.batch_max, "max_auctions": args.max_auctions,
              "commit_gap_ms": args.commit_gap_ms}
    given = any(v is not None for v in values.values())
    if args.auto and given:  # rule 2
        raise BadInput("--auto tunes every value: give it alone, or only the values to pin")
    apply = args.auto or given
    async with await Client.connect(args.nats, args.creds) as client:
        reply = await client.tune(**values, apply=apply)
    if args.json:
        print_json(reply)
        return 0
    rows = [("SETTING", "NOW", "", "")]
    for name, flag, what in SETTINGS:
        value = getattr(reply, name)
        rows.append((flag.removeprefix("--"), f"{value:g}",
                     "pinned" if name in reply.pinned else "tuned", what))
    print_table(rows)
    print(f"tuner level {reply.level}, {reply.changes} changes; {reply.placed_total} placed "
          "since the broker started")
    whose = "the settings replaced" if apply else "since the last change"
    print(f"{whose}: {rounds(reply)}")
    return 0


def rounds(reply: TuneReply) -> str:
    """The rounds a reply hands back, in a line: how many, p50 and p99 of those kept."""
    if not reply.rounds:
        return "no bid round closed"
    kept = sorted(reply.round_ms)
    return (f"{reply.rounds} bid rounds closed, p50 {_pct(kept, 0.50):.1f} ms, p99 "
            f"{_pct(kept, 0.99):.1f} ms" + (f" (of the last {len(kept)})"
                                           if len(kept) < reply.rounds else ""))


def _pct(kept: list[float], q: float) -> float:
    """Nearest rank."""
    return kept[max(0, min(len(kept) - 1, math.ceil(q * len(kept)) - 1))] if kept else 0.0
