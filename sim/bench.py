"""The speed benchmark: simulated placements per second of wall time.

Rules: the benchmark builds its scenario in code (so its size is a parameter): a fleet of
three node sizes bidding 40% least-loaded, 30% binpack, 30% headroom under full broadcast
with a lossy network, loaded to about 70% cpu by a Poisson stream of 16 request shapes.
It prints numbers and judges nothing: no test ever asserts a timing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gavel.sim.policies import plan, run_policy
from gavel.sim.scenario import Scenario, parse_scenario

__all__ = ["bench_scenario", "run_bench"]

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


def run_bench(nodes: int, placements: int, policies: set[str] | None = None,
              seed: int = 1, say: Callable[[str], None] = print) -> list[tuple[str, float, int]]:
    """Run and print; returns (policy, wall seconds, placement rounds) per policy."""
    scenario = bench_scenario(nodes, placements)
    out: list[tuple[str, float, int]] = []
    say(f"bench: {nodes} nodes, {placements} arrivals, seed {seed}")
    for spec in plan(scenario, seed):
        if policies is not None and spec.name not in policies:
            continue
        started = time.perf_counter()
        result = run_policy(scenario, seed, spec)
        wall = time.perf_counter() - started
        placed = result.placements + result.replacements + result.migrations
        say(f"  {spec.name:<16} {wall:8.2f} s  {placed:>9} placements  "
            f"{placed / wall:>9.0f} placements/s  (unschedulable {result.unschedulable}, "
            f"mean utilisation {result.util_mean:.2f})")
        out.append((spec.name, wall, placed))
    return out
