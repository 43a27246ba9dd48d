"""The steady-state figures of one run: what decides between placement policies.

Rules:
1. The window runs from the end of the warm-up (``warmup_s``) to the end of the run. Node
   figures average the samples taken in it; instance figures count the instances that
   arrived in it, wherever they ended.
2. Per workload class: the share placed on its first auction; the wait, from arrival to
   the end of the winning round, at p50 and p99 over those placed (an instance never placed
   has no wait: it is counted as abandoned or still queued instead); how many were ever
   unschedulable, abandoned, or still queued at the end.
3. `flatten` names every figure the report compares (``util_cv``, ``classes.big.wait_p99``)
   — the keys of a policy's intervals over seeds.
"""

from __future__ import annotations

import msgspec

__all__ = ["CLASS_COMPARED", "COMPARED", "ClassSteady", "Steady", "flatten"]


class ClassSteady(msgspec.Struct, kw_only=True):
    arrivals: int = 0
    placed: int = 0
    first_auction: float = 0.0
    wait_p50: float = 0.0
    wait_p99: float = 0.0
    unschedulable: int = 0
    abandoned: int = 0
    queued_end: int = 0


class Steady(msgspec.Struct, kw_only=True):
    start_s: float = 0.0
    end_s: float = 0.0
    samples: int = 0
    #: capacity-weighted mean utilisation of the nodes placements can go to
    util_mean: float = 0.0
    util_cv: float = 0.0
    util_jain: float = 0.0
    stranded_cpu: float = 0.0
    stranded_memory: float = 0.0
    empty_nodes: float = 0.0
    nodes_in_use: float = 0.0
    packing_bound: float = 0.0
    packing_ratio: float = 0.0
    #: running instances a re-auction moved, per hour of the window (`sim.rebalance`)
    moves_per_hour: float = 0.0
    #: every class together (rule 2)
    all: ClassSteady = msgspec.field(default_factory=ClassSteady)
    classes: dict[str, ClassSteady] = {}
    #: per node, utilisation averaged over the window: the 0th, 1st, ... 100th percentile
    node_utilisation: list[float] = []


#: node figures compared across policies (lower is better unless marked in the report)
COMPARED = ("util_mean", "util_cv", "util_jain", "stranded_cpu", "stranded_memory",
            "empty_nodes", "nodes_in_use", "packing_bound", "packing_ratio", "moves_per_hour")
#: instance figures, overall (``all.``) and per class (``classes.NAME.``)
CLASS_COMPARED = ("first_auction", "wait_p50", "wait_p99", "unschedulable", "abandoned",
                  "queued_end")


def flatten(s: Steady) -> dict[str, float]:
    """Rule 3: every compared figure of `s` under its name."""
    out = {name: float(getattr(s, name)) for name in COMPARED}
    for name in CLASS_COMPARED:
        out[f"all.{name}"] = float(getattr(s.all, name))
    for cls, c in s.classes.items():
        for name in CLASS_COMPARED:
            out[f"classes.{cls}.{name}"] = float(getattr(c, name))
    return out
