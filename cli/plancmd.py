"""`gavel plan SPEC`: where a submission or deploy would go and what it would change, asked of
the nodes as a dry run (`broker.planner`); nothing is committed or reserved.

Rules:
1. It prints each instance that would be placed with its auction as `gavel why` shows one
   (a shape's bids once, where several instances share them), what a deploy would change
   field by field, the replicas it would stop, and the service's version index with the
   command that applies the spec only if nothing changed since (`--check-index`).
2. Exit 0 once the broker answered, whatever the plan says (the plan is the answer: an
   instance that would not be placed is part of it); exit 2 for a spec that does not
   decode, 3 for one the broker refuses, as `submit` and `deploy` do.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gavel.cli.readouts import bid_cell, print_json
from gavel.cli.specfile import SpecError, load_spec
from gavel.client import Client
from gavel.shared.errors import BadInput
from gavel.shared.planning import PlanReply
from gavel.shared.reasons import render as render_reason
from gavel.shared.records import AuctionRecord

__all__ = ["plan", "print_plan"]


async def plan(args: argparse.Namespace) -> int:
    try:
        spec = load_spec(Path(args.spec))
    except SpecError as exc:
        raise BadInput(str(exc)) from None
    async with await Client.connect(args.nats, args.creds) as client:
        reply = await client.plan(spec)
    if args.json:
        print_json(reply)
    else:
        print_plan(reply, args.spec)
    for w in reply.warnings:
        print(f"gavel plan: warning: {w}", file=sys.stderr)
    return 0


def print_plan(p: PlanReply, path: str) -> None:
    """Rule 1, as text."""
    kind = {"job": "job", "service": "service", "system": "system job"}.get(p.type, p.type)
    if p.type == "job":
        first = "" if p.placements_total >= p.count else \
            f", the first {p.placements_total} planned (as many as run at once)"
        print(f"plan for job {p.name}: {p.count} instance{'' if p.count == 1 else 's'}"
              f"{first} (nothing committed)")
    elif not p.version:
        print(f"plan for {kind} {p.name}: a new {kind}, version 1 (nothing committed)")
    elif not p.changed:
        print(f"plan for {kind} {p.name}: version {p.version} runs this spec already; a "
              "deploy changes nothing")
    else:
        move = f"version {p.version}" if p.next_version == p.version else \
            f"version {p.version} -> {p.next_version}"
        print(f"plan for {kind} {p.name}: {move} (nothing committed)")
    for c in p.changes:
        print(f"  change  {c.field}: {c.old} -> {c.new}")
    if p.stops:
        why = "scaled down" if p.next_version == p.version else \
            f"replaced by version {p.next_version} as its replicas become healthy"
        print(f"  stop    {', '.join(p.stops)} ({why})")
    shown: AuctionRecord | None = None
    for a in p.placements:
        _placement(a, same=shown is not None and shown.bids == a.bids
                   and shown.declines == a.declines)
        shown = a
    more = p.placements_total - len(p.placements)
    if more > 0 and p.type != "system":
        print(f"  and {more} more instances")
    if p.type != "job":
        print(f"version index {p.index}: `gavel deploy {path} --check-index {p.index}` "
              "applies it only if the service has not changed since")


def _placement(a: AuctionRecord, same: bool) -> None:
    if a.winner:
        print(f"  place   {a.instance_id} on {a.winner} at load {a.load or 0.0:.3f}"
              + (" (tie broken on node id)" if a.tie_broken else ""))
    else:
        print(f"  {'' if a.summary.startswith('the nodes') else 'unplaced '}{a.instance_id}: "
              f"{a.summary}")
    if a.displaced:  # priority work no node has room for: what it would stop there
        print("    would preempt " + ", ".join(f"{v.instance_id} (priority {v.priority})"
                                           for v in a.displaced))
    if same:  # a shape's answers once (rule 1)
        return
    for b in a.bids:
        mark = "*" if b.node_id == a.winner else " "
        print(f"    {mark} bid     {b.node_id:<16} {bid_cell(b)}")
    for d in a.declines:
        print(f"      decline {d.node_id:<16} {render_reason(d.reason, d.detail)}")
    for s in a.silent:
        print(f"      silent  {s:<16} no answer before the deadline")
