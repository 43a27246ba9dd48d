"""Soft affinities in the simulator (`sim/scenarios/affinity.toml`): a workload class's
``[[workload.classes.affinities]]`` reaches its requests, and gavel's driver awards with the
broker's own adjustment (`shared.affinity` through `shared.auction.Auction`) on the fast and
the naive path alike."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gavel.shared.affinity import Affinity
from gavel.sim.cluster import Cluster
from gavel.sim.placer import Placer, Why
from gavel.sim.policies import plan, simulate
from gavel.sim.scenario import ScenarioError, load_scenario, parse_scenario
from gavel.sim.workload import Catalogue

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = load_scenario(ROOT / "sim" / "scenarios" / "affinity.toml")


def _placer(naive: bool) -> tuple[Placer, Cluster, Catalogue]:
    cluster = Cluster(SCENARIO)
    catalogue = Catalogue(SCENARIO.workload.classes)
    spec = next(p for p in plan(SCENARIO, 5, naive) if p.name == "gavel:least-loaded")
    placer = spec.build(cluster, catalogue)
    placer.start()
    return placer, cluster, catalogue


def _shape(catalogue: Catalogue, cpu_milli: int, affinities: tuple[object, ...]) -> int:
    return next(k for k, s in enumerate(catalogue.shapes)
                if s.cpu_milli == cpu_milli and s.affinities == affinities)


@pytest.mark.parametrize("naive", [False, True], ids=["fast", "naive"])
def test_the_award_follows_the_affinities_on_both_paths(naive: bool) -> None:
    placer, cluster, catalogue = _placer(naive)
    near_b = _shape(catalogue, 500, (("zone", "b", 100),))
    assert catalogue.requests[near_b].affinities == (
        Affinity(label="zone", value="b", weight=100),)
    plain = _shape(catalogue, 500, ())
    no_gpu = _shape(catalogue, 1000, (("gpu", "yes", -100),))
    labels = [n.labels for n in cluster.nodes]
    # Without an affinity the big zone-a nodes bid the lowest load and win ...
    won = placer.place(plain, 0.0)
    assert won.node >= 0 and labels[won.node]["zone"] == "a"
    # ... with one for zone b, a zone-b node does, though its own bid is higher.
    won = placer.place(near_b, 0.0)
    assert won.node >= 0 and labels[won.node] == {"zone": "b"}
    # Avoiding gpu nodes: never one while another node bids.
    for _ in range(5):
        won = placer.place(no_gpu, 0.0)
        assert won.node >= 0 and "gpu" not in labels[won.node]
        cluster.nodes[won.node].charge(catalogue.shapes[no_gpu], +1)
        placer.changed(won.node, Why.COMMIT)


def test_fast_and_naive_paths_place_alike_with_affinities() -> None:
    def comparable(naive: bool) -> list[object]:
        got = simulate(SCENARIO, 5, only={"gavel:least-loaded"}, naive=naive).policies
        return [{k: v for k, v in msgspec.to_builtins(p).items()
                 if "latency" not in k and "wait" not in k} for p in got]
    assert comparable(False) == comparable(True)


def test_an_affinity_in_a_scenario_is_checked_as_a_specs() -> None:
    text = (ROOT / "sim" / "scenarios" / "affinity.toml").read_text()
    with pytest.raises(ScenarioError, match="weight 0 prefers nothing"):
        parse_scenario(text.replace("weight = 100", "weight = 0").encode())
