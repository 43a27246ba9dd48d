"""The chaos plan (bench/chaosplan.py) at the size `make chaos` runs: the minimums are
scheduled, never hoped for - for many seeds, every one of them lands inside the default
duration even with every hold and gap at its top - each lane keeps one fault at a time, and
the fleet is sized so what is submitted fits with one node frozen and one down."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from gavel.bench.chaosplan import (
    BLIP,
    CLUSTER_LANE,
    DURATION,
    FULL,
    KILL_LANE,
    KINDS,
    SLEEPER,
    TIMING,
    due,
    ha_schedule,
    minimums,
    node_ids,
    room,
    schedule,
    submissions,
    worst_case,
)
from gavel.shared.spec import restart_policy

SEEDS = range(1, 13)
NODES = node_ids(4)


def test_the_full_minimums_are_what_the_task_asks_for() -> None:
    assert minimums(DURATION) == dict(FULL)
    assert FULL["broker_kill"] >= 20 and FULL["nats_restart"] >= 5
    assert FULL["worker_kill"] >= 50 and FULL["worker_freeze"] >= 3


@pytest.mark.parametrize("seed", SEEDS)
def test_the_default_run_schedules_every_minimum_inside_its_duration(seed: int) -> None:
    faults = schedule(seed, DURATION, NODES)
    counts = Counter(f.kind for f in faults)
    assert all(counts[k] >= FULL[k] for k in KINDS), counts
    assert all(f.at + f.hold <= DURATION for f in faults)
    # Past the offline threshold: a freeze always, and at least one kill in five.
    freezes = [f for f in faults if f.kind == "worker_freeze"]
    assert all(f.hold > TIMING.offline_s for f in freezes)
    kills = [f for f in faults if f.kind == "worker_kill"]
    assert sum(f.hold > TIMING.offline_s for f in kills) >= FULL["worker_kill"] // 5
    assert schedule(seed, DURATION, NODES) == faults, "the seed decides"


def test_the_minimums_fit_whatever_the_draws() -> None:
    """Every hold and gap at its top still ends inside the duration: the minimums of the
    default run, and of a short one (one of each at least)."""
    assert max(worst_case(FULL).values()) <= DURATION
    for duration in (40.0, 90.0, 200.0):
        least = minimums(duration)
        assert all(n >= 1 for n in least.values())
        assert max(worst_case(least).values()) <= duration, duration
        for seed in SEEDS:
            counts = Counter(f.kind for f in schedule(seed, duration, NODES))
            assert all(counts[k] >= least[k] for k in KINDS), (duration, seed, counts)


@pytest.mark.parametrize("seed", SEEDS)
def test_each_lane_has_one_fault_at_a_time(seed: int) -> None:
    """The cluster lane (broker, nats, freezes) never overlaps itself, so no broker restart
    falls inside a freeze; the kill lane never overlaps itself either, so at most one node
    is frozen and one down at once."""
    faults = schedule(seed, DURATION, NODES)
    for lane in (CLUSTER_LANE, KILL_LANE):
        mine = [f for f in faults if f.kind in lane]
        for a, b in itertools.pairwise(mine):
            assert a.at + a.hold < b.at, (a, b)


def test_overlap_still_schedules_the_minimums() -> None:
    counts = Counter(f.kind for f in schedule(3, DURATION, NODES, overlap=True))
    assert all(counts[k] >= FULL[k] for k in KINDS), counts


@pytest.mark.parametrize("seed", SEEDS)
def test_the_fleet_has_room_for_every_sleeper_with_two_nodes_out(seed: int) -> None:
    subs = submissions(seed, DURATION)
    r = room(subs, len(NODES))
    sleepers = sum(s.long for s in subs)
    left = len(NODES) - 2  # one frozen, one down
    assert left * r.cpu >= 2 * sleepers * SLEEPER.cpu
    assert left * r.memory_mb >= 2 * sleepers * SLEEPER.memory_mb


def test_the_specs_restart_nothing_in_place_and_outlive_every_outage() -> None:
    """A sleeper never exits under chaos and a blip exits 0: any other exit is handed back
    at once, seen by the run, never hidden by a restart on the node. Their placement budget
    outlasts every outage the default run injects past offline (each spends one), so no
    instance is ended `lost` for faults the run itself caused."""
    assert restart_policy(SLEEPER).attempts == 0
    assert restart_policy(BLIP).attempts == 0
    for seed in SEEDS:
        outages = [f for f in schedule(seed, DURATION, NODES)
                   if f.kind.startswith("worker") and f.hold > TIMING.offline_s]
        assert min(SLEEPER.attempts, BLIP.attempts) > len(outages), seed


@pytest.mark.parametrize("duration", [40.0, DURATION])
def test_no_freeze_opens_the_cluster_lane(duration: float) -> None:
    """The first fault of the cluster lane is never a freeze: by the second, work has been
    placed for the frozen node to hold and the broker to move away."""
    for seed in range(1, 40):
        lane = [f for f in schedule(seed, duration, NODES) if f.kind in CLUSTER_LANE]
        assert lane[0].kind != "worker_freeze", seed


@pytest.mark.parametrize("seed", range(1, 21))
def test_a_lane_that_runs_late_still_injects_the_ha_minimums(seed: int) -> None:
    """Rule 6: every fault of the short HA run (`tests/integration/test_chaos_ha.py`'s plan)
    landing past the duration - a loaded machine - still injects each kind's minimum, and
    nothing beyond it; on time, every planned fault is injected."""
    least = {"leader_kill": 2, "standby_kill": 1, "nats_restart": 1, "worker_kill": 1}
    faults = ha_schedule(seed, 20.0, node_ids(2), least=least)
    late: Counter[str] = Counter()
    for f in faults:
        if due(f.kind, True, late, least):
            late[f.kind] += 1
    assert dict(late) == least
    on_time: Counter[str] = Counter()
    for f in faults:
        if due(f.kind, False, on_time, least):
            on_time[f.kind] += 1
    assert on_time == Counter(f.kind for f in faults)
