"""The reading verbs (`status`, `nodes`, `why`) and their tables: they print, never change.

Rules: each asks through `gavel.client.Client`, the one code path to the API; with several
brokers (`gavel.broker.ha`) `status` and `nodes` name the leader, its
epoch and since when, in a first line (JSON: `nodes` has the fields `leader`, `epoch` and
`leader_since`); a broker alone prints what it always did.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import msgspec

from gavel.cli import services
from gavel.cli.outcomes import refusal_code
from gavel.client import Client
from gavel.shared import cron
from gavel.shared.api import (
    InstanceStatus,
    NodeDetail,
    NodeStatus,
    PeriodicStatus,
)
from gavel.shared.award import NodeBid
from gavel.shared.reasons import Reason
from gavel.shared.reasons import render as render_reason
from gavel.shared.records import RAISED


def print_json(obj: object) -> None:
    print(msgspec.json.format(msgspec.json.encode(obj), indent=2).decode())


async def status(args: argparse.Namespace) -> int:
    if args.instance:  # a service's name shows the service and its replicas
        try:
            svc = await services.service_status(args, args.instance)
        except services.Refused as exc:
            print(f"gavel status: {exc}", file=sys.stderr)
            args.error_sentence = f"gavel status: {exc}"
            return refusal_code(str(exc))
        if svc is not None:
            print_json(svc) if args.json else services.print_service(svc)
            return 0
    async with await Client.connect(args.nats, args.creds) as client:
        reply = await client.status(args.instance)  # every page (`broker.api` rule 8)
    if args.json:
        print_json({"array": reply.array, "instances": reply.instances}
                    if reply.array is not None else
                    {"periodic": reply.periodic, "instances": reply.instances}
                    if reply.periodic is not None else reply.instances)
        return 0
    leader_line(reply.leader, reply.epoch, reply.leader_since)
    if reply.periodic is not None:
        periodic(reply.periodic)
    if (a := reply.array) is not None:  # a batch array: its tally, then its tasks
        print(f"array {a.array_id}: {a.count} tasks, parallelism {a.parallelism}, "
              f"max_failures {a.max_failures}")
        print(f"done {a.succeeded}  running {a.running}  failed {a.failed}  "
              f"pending {a.pending}" + (f"  cancelled {a.cancelled}" if a.cancelled else ""))
        if a.first_failure:
            print(f"first failure: {a.first_failure}")
        if a.ended:
            print("ended: " + ("every task succeeded" if a.ok else a.outcome))
    rows = [("INSTANCE", "STATE", "HEALTH", "NODE", "ATTEMPT", "RESTARTS", "CPU", "MEM MB",
             "PORTS", "REASON")]
    for i in reply.instances:
        why = reason_cell(i)
        rows.append((i.instance_id, i.state, i.health or "-", i.node_id or "-", str(i.attempt),
                     str(i.restarts), *usage_cells(i.cpu_used, i.memory_used_mb, i.node_id),
                     ports_cell(i.ports) or "-", " ".join(why.split())))
    print_table(rows)
    return 0


def periodic(p: PeriodicStatus) -> None:
    """A periodic job: its schedule, where it stands, and its latest fire times, each in
    the job's time zone (as its schedule reads them; `--json` gives them in UTC)."""
    print(f"periodic job {p.name}: schedule {p.schedule!r} ({p.time_zone}), overlap "
          f"{p.overlap}" + (", cancelled" if p.stopped else ""))
    print(f"last run {cron.zoned(p.last_run, p.time_zone)}  next run "
          f"{cron.zoned(p.next_run, p.time_zone)}")
    rows = [(f"FIRE TIME ({p.time_zone})", "RUN", "OUTCOME")]
    for h in p.history:
        outcome = h.outcome or ("pending" if h.instance_id else h.skipped)
        if h.missed:
            outcome += f" ({h.missed} earlier fire times missed)"
        rows.append((cron.zoned(h.at, p.time_zone), h.instance_id or "-", outcome))
    print_table(rows)
    if p.history:
        print()


def usage_cells(cpu: float, memory_mb: float, where: str = "x") -> tuple[str, str]:
    """What is measured, or "-" where nothing is (not placed, or no cgroup)."""
    if not where or (not cpu and not memory_mb):
        return "-", "-"
    return f"{cpu:.2f}", f"{memory_mb:.1f}"


def ports_cell(ports: dict[str, int]) -> str:
    """``http=21003,admin=21004`` (as the spec names them), or ""."""
    return ",".join(f"{name}={port}" for name, port in ports.items())


async def nodes(args: argparse.Namespace) -> int:
    async with await Client.connect(args.nats, args.creds) as client:
        reply = await client.nodes(args.node)
    if args.json:
        print_json(reply)
        return 0
    leader_line(reply.leader, reply.epoch, reply.leader_since)
    if reply.detail is not None:
        _node_detail(reply.nodes[0], reply.detail)
        return 0
    rows = [("NODE", "HEALTH", "ADDRESS", "STRATEGY", "CPU", "MEMORY MB", "USED CPU",
             "USED MB", "INSTANCES", "LABELS")]
    for n in reply.nodes:
        labels = ",".join(f"{k}={v}" for k, v in sorted(n.labels.items()))
        rows.append((n.node_id, n.health + (" draining" if n.draining else ""),
                     n.advertise or "-", n.strategy,
                     f"{n.committed.cpu:g}/{n.capacity.cpu:g}",
                     f"{n.committed.memory_mb}/{n.capacity.memory_mb}",
                     *usage_cells(n.cpu_used, n.memory_used_mb), str(n.instances), labels or "-"))
    print_table(rows)
    return 0


def _node_detail(n: NodeStatus, d: NodeDetail) -> None:
    """`gavel nodes NODE`: its health, commitments and ports, what runs there, its declines."""
    labels = ",".join(f"{k}={v}" for k, v in sorted(n.labels.items())) or "-"
    print(f"{n.node_id}: {n.health}" + (" draining" if n.draining else "")
          + (f", seen {n.last_seen_s:g}s ago" if n.health != "healthy" else "")
          + f"; strategy {n.strategy or '-'}; labels {labels}")
    if d.drain_deadline:
        at = time.strftime("%H:%M:%S", time.localtime(d.drain_deadline))
        print(f"  drain deadline {at}: what still runs here then is moved")
    c, cap = n.committed, n.capacity
    print(f"  committed: cpu {c.cpu:g}/{cap.cpu:g}, memory {c.memory_mb}/{cap.memory_mb} MB, "
          f"ports {c.ports}/{cap.ports}"
          + (f" (range {d.port_range[0]}-{d.port_range[1]})" if len(d.port_range) == 2
             else ""))
    print(f"  measured:  cpu {n.cpu_used:.2f} of the {c.cpu:g} held, memory "
          f"{n.memory_used_mb:.1f} of the {c.memory_mb} MB held")
    if d.blocked_ports:
        print(f"  blocked ports (taken outside gavel): {', '.join(map(str, d.blocked_ports))}")
    print(f"  instances ({len(d.instances)}):" if d.instances else "  instances: none")
    if d.instances:
        rows = [("    INSTANCE", "STATE", "ATTEMPT", "CPU", "MEM MB", "PORTS")]
        rows += [(f"    {i.instance_id}", i.state, str(i.attempt),
                  *usage_cells(i.cpu_used, i.memory_used_mb, i.node_id), ports_cell(i.ports) or "-")
                 for i in d.instances]
        print_table(rows)
    print(f"  recent declines ({len(d.declines)}):" if d.declines else "  recent declines: none")
    for x in d.declines:
        print(f"    {x.instance_id:<20} {render_reason(x.reason, x.detail)}")


async def why(args: argparse.Namespace) -> int:
    async with await Client.connect(args.nats, args.creds) as client:
        reply = await client.why(args.instance)
    if args.json:
        print_json(reply)
        return 0
    i = reply.instance
    print(f"{i.instance_id}: {i.state}" + (f" on {i.node_id}" if i.node_id else "")
          + (f", {i.health}" if i.health else "")
          + (f", {i.restarts} restart{'' if i.restarts == 1 else 's'} in place"
             if i.restarts else "")
          + (f", replica of service {i.service} version {i.version}" if i.service else "")
          + (f" — {i.detail or i.reason}" if i.state in ("unschedulable", "failed", "lost")
             or (i.state == "cancelled" and i.service) else "")
          + (f" — {render_reason(i.reason, i.detail)}"
             if i.reason == Reason.PREEMPTED and i.state not in ("failed", "lost") else ""))
    if i.check:
        print(f"  check {i.check}")
    for a in reply.auctions:
        head = (f"auction {a.auction_id}: won by {a.winner} at load {a.load:.3f}"
                + (" (tie broken on node id)" if a.tie_broken else "")
                if a.winner else f"auction {a.auction_id}: {a.summary}")
        if a.winner and a.summary:  # a re-auction's move says why it moved
            head += f"; {a.summary}"
        print(head)
        raised = a.raised()
        for b in a.bids:
            mark = "*" if b.node_id == a.winner else " "
            print(f"  {mark} bid     {b.node_id:<16} {bid_cell(b)}"
                  + (f"  {RAISED}" if b.node_id in raised else ""))
        for d in a.declines:
            print(f"    decline {d.node_id:<16} {render_reason(d.reason, d.detail)}")
        for s in a.silent:
            print(f"    silent  {s:<16} no answer before the deadline")
        for o in a.offers:  # no bid fitted: the nodes' preempting offers, best first
            mark = "*" if o.node_id == a.winner else " "
            stops = ", ".join(f"{v.instance_id} (priority {v.priority})" for v in o.victims)
            print(f"  {mark} preempt {o.node_id:<16} load {o.load:.3f}  would stop {stops}")
        if a.displaced:
            print("    displaced " + ", ".join(f"{v.instance_id} (priority {v.priority})"
                                             for v in a.displaced))
    return 0


def reason_cell(i: InstanceStatus) -> str:
    """Why an instance is as it is, as `status` shows it: an unschedulable one's summary, a
    preempted one's ``preempted by <instance> (priority N)``, else its reason or check."""
    if i.state == "unschedulable":
        return i.detail
    if i.reason == Reason.PREEMPTED:
        return render_reason(i.reason, i.detail)
    return i.reason or i.check or ""


def bid_cell(b: NodeBid) -> str:
    """A bid as `why` and `plan` show it: the load the award ranked, and where soft
    affinities moved it, the node's own bid and the adjustment."""
    if not b.affinity:
        return f"load {b.load:.3f}  ({b.strategy})"
    return (f"load {b.load:.3f} = bid {b.load - b.affinity:.3f} {b.affinity:+.3f} affinity  "
            f"({b.strategy})")


def leader_line(leader: str, epoch: int, since: str) -> None:
    """The rule above (nothing for a broker alone: epoch 0)."""
    if epoch:
        print(f"leader: {leader} since {since} (epoch {epoch})")


def print_table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
