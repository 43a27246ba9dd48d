"""Preemption in virtual time: best-effort work fills the fleet, urgent work arrives, and
three schedulers place it - gavel without preemption, gavel with preemption by bids, and a
central scheduler with preemption (`sim.baselines.central_preempting`).

Rules:
1. Gavel's rounds are the production code: each node answers through
   `shared.strategies.answer` on its own `NodeView` (its running instances as residents when
   preemption is on, none when off), and `shared.auction.Auction.decide` awards, ordinary
   bids first and the cheapest displacement only when none fits. A round opens at every
   arrival and every end (the broker's ``capacity_freed``) over the pending work oldest first,
   as the broker's pass reads it, and its awards take effect `round_s` later (the bid round).
2. A pass asks for at most `PER_SHAPE` of each shape's oldest pending instances (the central
   scheduler stops at a shape's first that finds no node): the rest of a shape cannot fit
   where its oldest did not, and asking every one of a thousand queued best-effort jobs
   each pass would cost the simulation, not the answer.
3. The central scheduler sees every node at once and decides instantly, in priority order
   (oldest first within a priority, as Nomad's evaluation broker does): the least-loaded
   node that fits, else the cheapest displacement over every node by
   `shared.preemption.offer_key` on the victims each node's `shared.preemption.victims`
   would give.
4. An evicted instance goes back to the queue as new work of its kind and runs its whole
   duration again when placed (a job restarts from the beginning). Waits run from an
   instance's first arrival to its first placement.
5. Every random draw comes from one `random.Random` seeded by the scenario: the three
   schedulers see the same arrivals, sizes and durations.
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from gavel.shared.auction import Auction, Awarded
from gavel.shared.feasibility import NodeView
from gavel.shared.messages import BidReply, Capacity, Request, Victim
from gavel.shared.strategies import Strategy, answer, make_strategy
from gavel.sim.baselines import central_preempting
from gavel.sim.metrics import percentile

__all__ = ["PER_SHAPE", "Kind", "PreemptionScenario", "Result", "load", "main", "run"]

PER_SHAPE = 8


class _Config(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class Kind(_Config, kw_only=True):
    """One kind of work: its priority, arrival rate, size and mean duration (exponential)."""

    name: str
    priority: Annotated[int, msgspec.Meta(ge=1, le=100)] = 50
    rate: float  # arrivals a second
    cpu: float
    memory_mb: int
    duration_s: float


class PreemptionScenario(_Config, kw_only=True):
    #: What `gavel sim` tells this kind of scenario from the others by.
    kind: Literal["preemption"] = "preemption"
    name: str
    description: str = ""
    seed: int = 1
    duration_s: float
    nodes: int
    cpu: float
    memory_mb: int
    #: A gavel round's length: from the RFB to its awards.
    round_s: float = 0.05
    strategy: str = "least-loaded"
    #: Best-effort work that fills the fleet before anything else arrives.
    fill: Kind
    urgent: Kind
    #: When urgent work starts arriving (the fleet is full of best-effort by then).
    urgent_from_s: float = 600.0


class Result(msgspec.Struct, kw_only=True):
    policy: str
    urgent_placed: int
    urgent_waiting: int
    urgent_p50_wait_s: float
    urgent_p99_wait_s: float
    best_effort_placed: int
    preemptions: int
    preemptions_per_hour: float


class _Inst:
    __slots__ = ("arrived", "cpu", "duration", "id", "memory", "placed", "priority", "urgent")

    def __init__(self, iid: str, kind: Kind, arrived: float, duration: float) -> None:
        self.id, self.arrived, self.duration = iid, arrived, duration
        self.cpu, self.memory, self.priority = kind.cpu, kind.memory_mb, kind.priority
        self.urgent = False
        self.placed: float | None = None


def _arrivals(s: PreemptionScenario) -> list[tuple[float, _Inst]]:
    """Rule 5: every arrival of both kinds, in time order, drawn once."""
    rng = random.Random(s.seed)
    out: list[tuple[float, _Inst]] = []
    for kind, start, urgent in ((s.fill, 0.0, False), (s.urgent, s.urgent_from_s, True)):
        t, n = start, 0
        while True:
            t += rng.expovariate(kind.rate)
            if t >= s.duration_s:
                break
            n += 1
            inst = _Inst(f"{kind.name}-{n}", kind, t, rng.expovariate(1.0 / kind.duration_s))
            inst.urgent = urgent
            out.append((t, inst))
    out.sort(key=lambda a: (a[0], a[1].id))
    return out


class _Fleet:
    """The nodes and what runs on each; the pending queue; the tallies."""

    def __init__(self, s: PreemptionScenario) -> None:
        self.s = s
        self.names = [f"n{i:03}" for i in range(s.nodes)]
        self.running: dict[str, dict[str, _Inst]] = {n: {} for n in self.names}
        self.pending: dict[str, _Inst] = {}  # insertion order: oldest first
        self.ends: list[tuple[float, int, str, str]] = []  # (at, seq, node, instance)
        self.seq = 0
        self.preemptions = 0
        self.waits: list[float] = []
        self.best_effort_placed = 0
        self.capacity = Capacity(cpu=s.cpu, memory_mb=s.memory_mb)
        self._views: dict[tuple[str, bool], NodeView] = {}

    def view(self, node: str, residents: bool) -> NodeView:
        """The node as it bids: kept until what runs on it changes."""
        key = (node, residents)
        got = self._views.get(key)
        if got is None:
            held = self.running[node].values()
            committed = Capacity(cpu=sum(i.cpu for i in held),
                                 memory_mb=sum(i.memory for i in held))
            got = self._views[key] = NodeView(
                node_id=node, capacity=self.capacity, committed=committed,
                residents=tuple(Victim(instance_id=i.id, priority=i.priority, cpu=i.cpu,
                                       memory_mb=i.memory) for i in held) if residents
                else ())
        return got

    def free(self) -> dict[str, Capacity]:
        return {n: self.capacity - self.view(n, False).committed for n in self.names}

    def _changed(self, node: str) -> None:
        self._views.pop((node, True), None)
        self._views.pop((node, False), None)

    def start(self, inst: _Inst, node: str, now: float, evict: Sequence[str]) -> None:
        for vid in evict:
            victim = self.running[node].pop(vid)
            self.preemptions += 1
            self.pending[victim.id] = victim  # rule 4: back to the queue, from the start
        self.pending.pop(inst.id, None)
        self.running[node][inst.id] = inst
        self._changed(node)
        if inst.placed is None:
            inst.placed = now
            if inst.urgent:
                self.waits.append(now - inst.arrived)
            else:
                self.best_effort_placed += 1
        self.seq += 1
        heapq.heappush(self.ends, (now + inst.duration, self.seq, node, inst.id))

    def end(self, node: str, iid: str) -> bool:
        self._changed(node)
        return self.running[node].pop(iid, None) is not None


Decide = Callable[[_Fleet, float], list[tuple[_Inst, str, list[str]]]]


def _gavel(strategy: Strategy, preempt: bool) -> Decide:
    """Rule 1: one production auction over the pending work (rule 2's cut)."""
    count = 0

    def decide(fleet: _Fleet, now: float) -> list[tuple[_Inst, str, list[str]]]:
        nonlocal count
        taken: dict[object, int] = {}
        asked: list[_Inst] = []
        for inst in fleet.pending.values():
            key = (inst.cpu, inst.memory, inst.priority)
            if taken.get(key, 0) < PER_SHAPE:
                taken[key] = taken.get(key, 0) + 1
                asked.append(inst)
        if not asked:
            return []
        count += 1
        requests = [Request(instance_id=i.id, cpu=i.cpu, memory_mb=i.memory,
                            priority=i.priority) for i in asked]
        auction = Auction(f"a{count}", requests, fleet.names, now, 1.0)
        for node in fleet.names:
            view = fleet.view(node, preempt)
            auction.receive(BidReply(auction_id=auction.auction_id, node_id=node, answers=[
                answer(strategy, shape, view, k) for k, shape in enumerate(auction.shapes)]),
                now)
        by_id = {i.id: i for i in asked}
        return [(by_id[d.request.instance_id], d.winner.node_id,
                 [v.instance_id for v in d.displaced])
                for d in auction.decide(now, fleet.free()) if isinstance(d, Awarded)]
    return decide


def _central(fleet: _Fleet, now: float) -> list[tuple[_Inst, str, list[str]]]:
    """Rule 3: priority order, instant, over every node."""
    del now
    out = []
    order = sorted(fleet.pending.values(), key=lambda i: -i.priority)  # stable: oldest first
    views = {n: fleet.view(n, True) for n in fleet.names}
    tried: dict[object, int] = {}
    for inst in order:
        key = (inst.cpu, inst.memory, inst.priority)
        if tried.get(key, 0) >= PER_SHAPE:  # rule 2, as for gavel
            continue
        tried[key] = tried.get(key, 0) + 1
        shape = Request(instance_id=inst.id, cpu=inst.cpu, memory_mb=inst.memory,
                        priority=inst.priority)
        got = central_preempting(views, shape)
        if got is None:
            tried[key] = PER_SHAPE  # what did not fit, the rest of its shape will not
            continue
        node, evict = got
        out.append((inst, node, evict))
        left = [r for r in views[node].residents if r.instance_id not in evict]
        left.append(Victim(instance_id=inst.id, priority=inst.priority, cpu=inst.cpu,
                           memory_mb=inst.memory))
        committed = Capacity(cpu=sum(r.cpu for r in left),
                             memory_mb=sum(r.memory_mb for r in left))
        views[node] = msgspec.structs.replace(views[node], committed=committed,
                                              residents=tuple(left))
    return out


def _simulate(s: PreemptionScenario, policy: str, decide: Decide, latency: float) -> Result:
    fleet = _Fleet(s)
    arrivals = _arrivals(s)
    k = 0
    now = 0.0
    while True:
        next_arrival = arrivals[k][0] if k < len(arrivals) else float("inf")
        next_end = fleet.ends[0][0] if fleet.ends else float("inf")
        now = min(next_arrival, next_end)
        if now >= s.duration_s:
            break
        if next_end <= next_arrival:
            _, _, node, iid = heapq.heappop(fleet.ends)
            if not fleet.end(node, iid):
                continue  # it was evicted before its end: nothing freed
        else:
            fleet.pending[arrivals[k][1].id] = arrivals[k][1]
            k += 1
        at = now + latency
        for inst, node, evict in decide(fleet, now):
            if all(v in fleet.running[node] for v in evict):
                fleet.start(inst, node, at, evict)
    waits = sorted(fleet.waits)
    waiting = sum(1 for i in fleet.pending.values() if i.urgent and i.placed is None)
    hours = s.duration_s / 3600.0
    return Result(policy=policy, urgent_placed=len(waits), urgent_waiting=waiting,
                  urgent_p50_wait_s=round(percentile(waits, 0.5), 3) if waits else 0.0,
                  urgent_p99_wait_s=round(percentile(waits, 0.99), 3) if waits else 0.0,
                  best_effort_placed=fleet.best_effort_placed, preemptions=fleet.preemptions,
                  preemptions_per_hour=round(fleet.preemptions / hours, 1))


def run(s: PreemptionScenario) -> list[Result]:
    """The three schedulers on the same arrivals (rule 5)."""
    strategy = make_strategy(s.strategy)
    return [_simulate(s, "gavel, no preemption", _gavel(strategy, False), s.round_s),
            _simulate(s, "gavel, preemption by bids", _gavel(strategy, True), s.round_s),
            _simulate(s, "central, preemption", _central, 0.0)]


def load(path: Path) -> PreemptionScenario:
    try:
        return msgspec.toml.decode(path.read_bytes(), type=PreemptionScenario)
    except (OSError, msgspec.DecodeError) as exc:
        raise SystemExit(f"{path}: not a preemption scenario: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gavel sim",
                                     description="urgent work arriving at a full fleet")
    parser.add_argument("scenario", type=Path)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = run(load(args.scenario))
    if args.json:
        sys.stdout.write(msgspec.json.encode(results).decode() + "\n")
        return 0
    print(f"{'policy':<28} {'urgent p50 s':>12} {'urgent p99 s':>12} {'waiting':>8} "
          f"{'best-effort':>11} {'preempt/h':>10}")
    for r in results:
        print(f"{r.policy:<28} {r.urgent_p50_wait_s:>12.2f} {r.urgent_p99_wait_s:>12.2f} "
              f"{r.urgent_waiting:>8} {r.best_effort_placed:>11} "
              f"{r.preemptions_per_hour:>10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
