"""The simulator's deciding metrics on hand-built clusters whose answers are known, the
intervals over seeds on known samples, and the verdicts drawn from them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gavel.sim.cluster import Cluster
from gavel.sim.metrics import PolicyResult
from gavel.sim.scenario import parse_scenario
from gavel.sim.snapshot import Fleet, jain, packing_bound, take, weighted_cv
from gavel.sim.stats import Interval, differ, interval, t_quantile
from gavel.sim.verdicts import Question, judge
from gavel.sim.workload import Catalogue

# Two zones: a 4-cpu node in zone a, an 8-cpu node in zone b, and a 2-cpu node in zone b.
TINY = """
name = "tiny"
duration_s = 10.0
[[nodes]]
count = 1
cpu = 4.0
memory_mb = 4096
labels = { zone = "a" }
[[nodes]]
count = 1
cpu = 8.0
memory_mb = 8192
labels = { zone = "b" }
[[nodes]]
count = 1
cpu = 2.0
memory_mb = 2048
labels = { zone = "b" }
[[gavel]]
name = "g"
mix = [{ strategy = "least-loaded", share = 1.0 }]
[workload]
rate = 1.0
[[workload.classes]]
name = "zoned"
cpu = { values = [3.0, 6.0] }
memory_mb = 1024.0
labels = { zone = "b" }
[[workload.classes]]
name = "small"
cpu = 1.0
memory_mb = 512.0
"""


def _tiny() -> tuple[Cluster, Catalogue, Fleet]:
    s = parse_scenario(TINY.encode())
    cluster = Cluster(s)
    catalogue = Catalogue(s.workload.classes)
    return cluster, catalogue, Fleet(cluster, catalogue)


def _shape(catalogue: Catalogue, cpu: float, zoned: bool) -> int:
    for k, shape in enumerate(catalogue.shapes):
        if shape.cpu_milli == round(cpu * 1000) and bool(shape.labels) == zoned:
            return k
    raise AssertionError(f"no shape of {cpu} cpu")


def test_equal_loads_have_jain_one_and_cv_zero() -> None:
    util = np.full(7, 0.6)
    assert jain(util) == pytest.approx(1.0)
    assert weighted_cv(util, np.array([1.0, 2.0, 3.0, 1.0, 1.0, 4.0, 1.0])) == pytest.approx(
        0.0, abs=1e-12)
    assert jain(np.zeros(3)) == 1.0 and weighted_cv(np.zeros(3), np.ones(3)) == 0.0


def test_one_node_holding_everything_has_jain_one_over_n() -> None:
    assert jain(np.array([0.9, 0.0, 0.0, 0.0])) == pytest.approx(0.25)


def test_cv_weighs_nodes_by_capacity() -> None:
    # a big node at 0.2 and a small one at 0.8: weighted by 3:1 the mean is 0.35,
    # the variance (3 * 0.15^2 + 0.45^2) / 4 = 0.0675
    cv = weighted_cv(np.array([0.2, 0.8]), np.array([3.0, 1.0]))
    assert cv == pytest.approx(math.sqrt(0.0675) / 0.35)
    assert cv != pytest.approx(weighted_cv(np.array([0.2, 0.8]), np.array([1.0, 1.0])))


def test_free_capacity_no_waiting_shape_could_use_is_not_stranded() -> None:
    cluster, catalogue, fleet = _tiny()
    big = _shape(catalogue, 6.0, zoned=True)
    # zone a's node is empty but the waiting shape needs zone b; the 2-cpu zone-b node is
    # too small for it even empty; the 8-cpu node is full enough that it fits nowhere.
    cluster.nodes[1].charge(catalogue.shapes[_shape(catalogue, 3.0, zoned=True)], +1)
    snap = take(fleet, cluster, [big], big)
    assert snap.unfit_cpu == 4000 + 5000 + 2000  # free on every node, none fits the shape
    assert snap.stranded_cpu == 5000  # only the zone-b node big enough for it when empty
    assert snap.stranded_mem == 8192 - 1024
    nothing = take(fleet, cluster, [], big)
    assert nothing.stranded_cpu == 0 and nothing.unfit_cpu == 0


def test_a_node_the_waiting_shape_fits_strands_nothing() -> None:
    cluster, catalogue, fleet = _tiny()
    small = _shape(catalogue, 1.0, zoned=False)
    snap = take(fleet, cluster, [small], small)
    assert snap.stranded_cpu == 0 and snap.unfit_cpu == 0


def test_packing_bound_of_a_known_set() -> None:
    caps_cpu = np.array([8000, 16000, 32000, 8000], dtype=np.int64)
    caps_mem = np.array([1000, 1000, 1000, 1000], dtype=np.int64)
    assert packing_bound(0, 0, caps_cpu, caps_mem) == 0
    assert packing_bound(32000, 10, caps_cpu, caps_mem) == 1  # the largest node holds it
    assert packing_bound(40000, 10, caps_cpu, caps_mem) == 2  # 32 + 16
    assert packing_bound(48001, 10, caps_cpu, caps_mem) == 3  # 32 + 16 + 8
    assert packing_bound(100, 3500, caps_cpu, caps_mem) == 4  # memory decides
    cluster, catalogue, fleet = _tiny()
    cluster.nodes[0].charge(catalogue.shapes[_shape(catalogue, 3.0, zoned=True)], +1)
    cluster.nodes[2].charge(catalogue.shapes[_shape(catalogue, 1.0, zoned=False)], +1)
    snap = take(fleet, cluster, [], 0)
    assert (snap.in_use, snap.bound) == (2, 1)  # 4 cpu of work fits the 8-cpu node


def test_interval_on_known_samples() -> None:
    got = interval([1.0, 2.0, 3.0])
    assert got.mean == 2.0
    half = 4.3027 * 1.0 / math.sqrt(3)
    assert got.low == pytest.approx(2.0 - half, abs=1e-6)
    assert got.high == pytest.approx(2.0 + half, abs=1e-6)
    assert got.values == [1.0, 2.0, 3.0]
    same = interval([0.5] * 5)
    assert (same.low, same.mean, same.high) == (0.5, 0.5, 0.5)
    one = interval([0.7])
    assert one.low is None and one.high is None and one.half is None


def test_t_quantiles_match_the_table_and_the_expansion() -> None:
    assert t_quantile(1) == 12.7062 and t_quantile(4) == 2.7764
    assert t_quantile(40) == pytest.approx(2.021075, abs=1e-4)
    assert t_quantile(120) == pytest.approx(1.979930, abs=1e-4)
    with pytest.raises(ValueError):
        t_quantile(0)


def test_intervals_differ_only_when_they_leave_a_gap() -> None:
    a = Interval(mean=1.0, low=0.9, high=1.1)
    assert differ(a, Interval(mean=1.5, low=1.2, high=1.8))
    assert not differ(a, Interval(mean=1.15, low=1.05, high=1.25))
    assert not differ(a, Interval(mean=1.2, low=1.1, high=1.3))  # touching
    assert not differ(a, Interval(mean=5.0))  # one seed: no interval


def _policy(name: str, values: list[float]) -> PolicyResult:
    p = PolicyResult(policy=name, kind="baseline", description=name)
    p.intervals = {"util_cv": interval(values)}
    return p


QUESTION = Question("Most even load", "util_cv", True)


def test_overlapping_intervals_give_no_difference() -> None:
    policies = [_policy("a", [0.20, 0.22, 0.24]), _policy("b", [0.21, 0.23, 0.25]),
                _policy("c", [0.60, 0.61, 0.62])]
    verdict = judge(QUESTION, policies, 3)
    assert verdict.best == ""
    assert verdict.undecided == ["a", "b"]
    assert "no difference at 3 seeds" in verdict.sentence


def test_separate_intervals_name_the_best() -> None:
    policies = [_policy("a", [0.40, 0.41, 0.42]), _policy("b", [0.20, 0.21, 0.22]),
                _policy("c", [0.60, 0.61, 0.62])]
    verdict = judge(QUESTION, policies, 3)
    assert verdict.best == "b" and verdict.undecided == []
    assert "**b**" in verdict.sentence and "next a" in verdict.sentence
    higher = judge(Question("Most", "util_cv", False), policies, 3)
    assert higher.best == "c"


def test_one_seed_decides_nothing() -> None:
    policies = [_policy("a", [0.4]), _policy("b", [0.2])]
    verdict = judge(QUESTION, policies, 1)
    assert verdict.best == "" and verdict.undecided == ["b", "a"]
    assert verdict.sentence.endswith(": best mean b (0.200).")  # why, once: ONE_SEED
