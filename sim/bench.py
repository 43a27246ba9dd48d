"""The speed benchmark: simulated placements per second of wall time.

Rules:
1. Without a scenario the benchmark builds its own (so its size is a parameter): three
   node sizes bidding 40% least-loaded, 30% binpack, 30% headroom under full broadcast
   with a lossy network, loaded to about 70% cpu by a Poisson stream of 16 request shapes.
2. With a scenario (``--scenario NAME``) it runs that scenario's workload, fleet and
   network, scaled to ``nodes`` and ``placements`` when they are given: every node group
   keeps its share of the fleet (largest remainder), the arrival rate grows with the
   fleet (so the load stays the same), the run lasts until ``placements`` arrivals, and
   the warm-up keeps its share of the run.
3. It prints numbers and judges nothing: no test ever asserts a timing. Beside each wall
   time it prints the process's cpu time and the machine's load average (the one-minute
   figure when the run ends): on a shared machine wall time is contention, cpu time is
   the simulator's own cost.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

import msgspec

from gavel.sim.policies import plan, run_policy
from gavel.sim.scenario import NodeGroup, Scenario, parse_scenario
from gavel.sim.workload import Catalogue

__all__ = ["bench_scenario", "run_bench", "scale"]

_TEMPLATE = """
name = "bench"
description = "{nodes} nodes, {placements} placements, full broadcast"
duration_s = {duration}
sample_s = {sample}

[[nodes]]
count = {small}
cpu = 8.0
memory_mb = 16384
[[nodes]]
count = {medium}
cpu = 16.0
memory_mb = 32768
[[nodes]]
count = {large}
cpu = 32.0
memory_mb = 65536

[[gavel]]
name = "mixed"
mode = "{mode}"
mix = [
  {{ strategy = "least-loaded", share = 0.4 }},
  {{ strategy = "binpack", share = 0.3 }},
  {{ strategy = "headroom", share = 0.3 }},
]

[workload]
rate = {rate}
max_arrivals = {placements}
[[workload.classes]]
name = "service"
cpu = {{ values = [0.25, 0.5, 1.0, 2.0], weights = [4.0, 3.0, 2.0, 1.0] }}
memory_mb = {{ values = [256.0, 512.0, 1024.0, 2048.0], weights = [4.0, 3.0, 2.0, 1.0] }}
duration_s = {{ dist = "exponential", mean = 155.0 }}

[network]
latency_s = {{ dist = "lognormal", median = 0.01, sigma = 0.6 }}
loss = 0.001
"""


def bench_scenario(nodes: int, placements: int, mode: str = "broadcast") -> Scenario:
    small, medium = nodes // 2, nodes * 35 // 100
    rate = nodes / 10.0
    duration = placements / rate
    text = _TEMPLATE.format(nodes=nodes, placements=placements, duration=duration,
                            sample=duration / 100, small=small, medium=medium,
                            large=nodes - small - medium, rate=rate, mode=mode)
    return parse_scenario(text.encode(), "bench")


def _counts(groups: list[NodeGroup], nodes: int) -> list[int]:
    """Largest remainder: each group's share of `nodes`, summing to exactly `nodes`."""
    whole = sum(g.count for g in groups)
    exact = [g.count / whole * nodes for g in groups]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(groups)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[: nodes - sum(counts)]:
        counts[i] += 1
    return counts


def scale(s: Scenario, nodes: int | None, placements: int | None) -> Scenario:
    """Rule 2: `s` with `nodes` nodes and `placements` arrivals (None keeps its own)."""
    if nodes is None and placements is None:
        return s
    size = nodes or s.initial_nodes()
    groups = [msgspec.structs.replace(g, count=c)
              for g, c in zip(s.nodes, _counts(s.nodes, size), strict=True) if c > 0]
    rate = s.workload.rate * size / s.initial_nodes()
    arrivals = placements or s.workload.max_arrivals
    duration = s.duration_s if arrivals is None or rate <= 0 else arrivals / rate
    warmup = s.window[0] / s.duration_s * duration
    workload = msgspec.structs.replace(s.workload, rate=rate, max_arrivals=arrivals)
    return msgspec.structs.replace(
        s, nodes=groups, workload=workload, duration_s=duration, warmup_s=warmup,
        sample_s=min(s.interval_s, duration),
        events=[e for e in s.events if e.at_s < duration])


def run_bench(nodes: int | None, placements: int | None, policies: set[str] | None = None,
              seed: int = 1, say: Callable[[str], None] = print,
              scenario: Scenario | None = None) -> list[tuple[str, float, int]]:
    """Run and print; returns (policy, wall seconds, placement rounds) per policy."""
    if scenario is None:
        s = bench_scenario(nodes or 1000, placements or 100_000)
    else:
        s = scale(scenario, nodes, placements)
    out: list[tuple[str, float, int]] = []
    say(f"bench {s.name}: {s.initial_nodes()} nodes, up to "
        f"{s.workload.max_arrivals or 'unlimited'} arrivals, "
        f"{len(s.workload.classes)} classes, {len(Catalogue(s.workload.classes))} "
        f"request shapes, seed {seed}")
    for spec in plan(s, seed):
        if policies is not None and spec.name not in policies:
            continue
        started = time.perf_counter()
        cpu = time.process_time()
        result = run_policy(s, seed, spec)
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu
        placed = result.placements + result.replacements + result.migrations
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
        say(f"  {spec.name:<16} {wall:8.2f} s wall ({cpu:.2f} s cpu, load {load:.1f})  "
            f"{result.arrivals:>9} "
            f"arrivals  {placed:>9} placements  {placed / wall:>9.0f} placements/s  "
            f"(unschedulable {result.unschedulable}, mean utilisation {result.util_mean:.2f})")
        out.append((spec.name, wall, placed))
    return out
