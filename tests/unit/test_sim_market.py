"""The simulator's production driver (`sim.market`): each realism knob changes what it
should, the reservation is what stops stale bids over-committing a node, runs are
byte-identical for a seed, and the fast path stays the default."""

from __future__ import annotations

import msgspec
import pytest

from gavel.shared.auctioneer import Core
from gavel.sim.cluster import Cluster
from gavel.sim.gavel import GavelPlacer
from gavel.sim.metrics import PolicyResult
from gavel.sim.policies import Production, plan, run_policy
from gavel.sim.scenario import Scenario, parse_scenario
from gavel.sim.workload import Catalogue

BASE = b"""
name = "market"
seed = 3
duration_s = 120.0
[[nodes]]
count = 12
cpu = 4.0
memory_mb = 8192
[[nodes]]
count = 4
cpu = 8.0
memory_mb = 16384
labels = { disk = "ssd" }
[[gavel]]
name = "mixed"
mix = [{ strategy = "least-loaded", share = 0.5 }, { strategy = "binpack", share = 0.5 }]
auctioneer = "production"
[baselines]
run = []
[workload]
rate = 3.0
[[workload.classes]]
name = "web"
cpu = { values = [0.25, 0.5, 1.0] }
memory_mb = 512.0
duration_s = { dist = "exponential", mean = 30.0 }
[[workload.classes]]
name = "ssd"
weight = 0.2
cpu = 1.0
memory_mb = 1024.0
labels = { disk = "ssd" }
duration_s = { dist = "exponential", mean = 60.0 }
[network]
latency_s = { dist = "lognormal", median = 0.01, sigma = 0.5 }
"""


def scenario(rate: float = 3.0, **market: object) -> Scenario:
    s = parse_scenario(BASE)
    return msgspec.structs.replace(
        s, market=msgspec.structs.replace(s.market, **market),
        workload=msgspec.structs.replace(s.workload, rate=rate))


def run(s: Scenario) -> PolicyResult:
    [spec] = plan(s, s.seed)
    return run_policy(s, s.seed, spec)


def test_the_fast_path_stays_the_default_and_production_is_chosen_per_policy() -> None:
    s = parse_scenario(BASE.replace(b'auctioneer = "production"\n', b""))
    [spec] = plan(s, s.seed)
    s2 = parse_scenario(BASE)
    assert s.gavel[0].auctioneer == "fast"
    assert s.market.staleness_s is None and s.market.loss is None  # production's defaults
    cat = Catalogue(s.workload.classes)
    assert isinstance(spec.build(Cluster(s), cat), GavelPlacer)
    [spec2] = plan(s2, s2.seed)
    assert isinstance(spec2.build(Cluster(s2), cat), Production)


def test_a_run_is_byte_identical_for_a_seed() -> None:
    s = scenario(loss=0.05, restarts=3, provisioning_failure=0.05)
    one, two = run(s), run(s)
    assert msgspec.json.encode(one) == msgspec.json.encode(two)
    assert one.placements > 200


def test_a_lost_award_is_revoked_at_the_provisioning_deadline_and_re_auctioned() -> None:
    clean = run(scenario(loss=0.0))
    lossy = run(scenario(loss=0.1))
    assert clean.market["revoked"] == 0 and clean.market["lost_messages"] == 0
    assert lossy.market["lost_messages"] > 0 and lossy.market["revoked"] > 0
    # every revoked instance is placed again elsewhere (or lost out of attempts)
    assert lossy.replacements + lossy.lost + lossy.pending_end >= lossy.market["revoked"] > 0
    assert clean.replacements == 0


def test_stale_bids_over_bid_a_node_and_the_reservation_stops_the_over_commit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    s = scenario(staleness_s=20.0, commit_lag_s=0.5, batch_max=4)
    fresh = run(scenario(staleness_s=0.0, commit_lag_s=0.5, batch_max=4))
    stale = run(s)
    assert stale.market["stale_bids"] > fresh.market["stale_bids"]
    assert stale.market["over_commits"] == 0  # the reservations and git stop them
    # without the reservations of awards whose commit has not landed, they do not
    monkeypatch.setattr(Core, "free", lambda self, nodes: self.world.free(nodes, {}))
    assert run(s).market["over_commits"] > 0


def test_commit_lag_is_waited_for() -> None:
    quick = run(scenario(rate=0.5, commit_lag_s=0.0))  # light: no queue to wait in
    slow = run(scenario(rate=0.5, commit_lag_s=1.0))
    assert slow.latency_p50 > quick.latency_p50 + 0.5


def test_a_restarting_node_rejoins_under_its_own_id_and_its_missed_awards_go_elsewhere(
        ) -> None:
    calm = run(scenario())
    restarts = run(scenario(restarts=20, restart_s=30.0))
    assert calm.market["restarts"] == 0 and restarts.market["restarts"] > 0
    assert restarts.market["revoked"] > calm.market["revoked"]
    assert restarts.lost == 0  # nothing was lost with the node: it came back


def test_provisioning_failures_re_auction_without_the_node() -> None:
    ok = run(scenario())
    bad = run(scenario(provisioning_failure=0.2))
    assert ok.market["provisioning_failed"] == 0
    assert bad.market["provisioning_failed"] > 0
    assert bad.replacements + bad.lost + bad.pending_end >= bad.market["provisioning_failed"]
