"""Re-auction in the simulator (`sim.rebalance`): the scenario key turns it on, moves free
room for waiting work and pack drifted work, jobs stay, and a run is still a pure function
of its scenario and seed."""

from __future__ import annotations

import pytest

from gavel.shared.reauction import Outcome
from gavel.sim.metrics import PolicyResult
from gavel.sim.policies import plan, run_policy
from gavel.sim.scenario import Scenario, ScenarioError, parse_scenario

# Three 4-cpu nodes each hold three 1-cpu services for ever; a 2-cpu job then waits, for
# no node has 2 cpu free. A 1-cpu node joins: a service can move there, which frees room
# on its old node for the job.
JOIN = """
name = "t"
duration_s = 600.0
sample_s = 10.0
[[nodes]]
count = 3
cpu = 4.0
memory_mb = 4096
[[gavel]]
name = "g"
mix = [{{ strategy = "least-loaded", share = 1.0 }}]
{rebalance}
[baselines]
run = []
[workload]
rate = 0.0
[[workload.bursts]]
at_s = 0.0
count = 9
workload_class = "svc"
[[workload.bursts]]
at_s = 100.0
count = 1
workload_class = "big"
[[workload.classes]]
name = "svc"
cpu = 1.0
memory_mb = 256.0
duration_s = {{ dist = "forever" }}
[[workload.classes]]
name = "big"
cpu = 2.0
memory_mb = 256.0
duration_s = {{ dist = "forever" }}
[[events]]
kind = "join"
at_s = 200.0
group = {{ count = 1, cpu = 1.0, memory_mb = 4096 }}
"""

# A binpack fleet whose services end unevenly: what is left is spread thin over nodes
# that re-auction gathers onto fewer.
DRIFT = """
name = "t"
duration_s = 3000.0
warmup_s = 600.0
sample_s = 30.0
[[nodes]]
count = 12
cpu = 8.0
memory_mb = 8192
[[gavel]]
name = "g"
mix = [{{ strategy = "binpack", share = 1.0 }}]
{rebalance}
[baselines]
run = []
[workload]
rate = 0.06
[[workload.classes]]
name = "service"
cpu = {{ values = [1.0, 2.0] }}
memory_mb = 512.0
duration_s = {{ dist = "exponential", mean = 400.0 }}
"""

ON = 'rebalance = { every_s = 30.0, cooldown_s = 0.0, margin = 0.02 }'


def _run(text: str, rebalance: str = "", seed: int = 1) -> PolicyResult:
    s: Scenario = parse_scenario(text.format(rebalance=rebalance).encode())
    return run_policy(s, seed, plan(s, seed)[0])


def test_without_the_key_nothing_moves() -> None:
    r = _run(JOIN)
    assert r.migrations == 0 and r.rebalance == {}
    assert r.pending_end == 1  # the 2-cpu job waits for ever


def test_a_joining_node_lets_a_move_free_room_for_waiting_work() -> None:
    r = _run(JOIN, 'rebalance = { every_s = 1000.0, cooldown_s = 0.0, classes = ["svc"] }')
    assert r.migrations == 1  # the round the join started, long before the periodic one
    assert r.rebalance[Outcome.FREES] == 1
    assert r.pending_end == 0 and r.placements == 10


def test_jobs_stay() -> None:
    r = _run(JOIN, 'rebalance = { every_s = 30.0, cooldown_s = 0.0, classes = ["big"] }')
    assert r.migrations == 0 and r.pending_end == 1


def test_drifted_work_is_gathered_onto_fewer_nodes() -> None:
    plain, moved = _run(DRIFT), _run(DRIFT, ON)
    assert moved.migrations > 0 and moved.rebalance[Outcome.PACKS] > 0
    assert moved.steady.moves_per_hour > 0 and plain.steady.moves_per_hour == 0
    assert moved.steady.nodes_in_use < plain.steady.nodes_in_use
    assert _run(DRIFT, ON) == moved  # same scenario, same seed: the same run


def test_the_budget_bounds_the_moves() -> None:
    capped = _run(DRIFT, 'rebalance = { every_s = 30.0, cooldown_s = 0.0, margin = 0.02, '
                         'budget = 1 }')
    assert 0 < capped.migrations <= 3000 / 30  # at most one a round, a round each 30 s


@pytest.mark.parametrize(("key", "error"), [
    ('rebalance = { classes = ["nope"] }', "rebalance.classes"),
    ('rebalance = { every_s = 0.0 }', "every_s"),
    ('auctioneer = "production"\nrebalance = {}', "fast auctioneer only"),
    ('rebalance = { margn = 0.1 }', "margn"),
])
def test_bad_rebalance_keys_are_one_sentence(key: str, error: str) -> None:
    with pytest.raises(ScenarioError, match=error):
        parse_scenario(JOIN.format(rebalance=key).encode())
