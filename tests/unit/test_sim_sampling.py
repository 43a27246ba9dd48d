"""The simulator's sampled gavel policy draws through the broker's own candidate index
(`shared.candidates`): in a fleet where few nodes carry a label, d = 2 asks those nodes, so
a labelled request that fits is placed in its first round; drains and unreachable nodes
leave the index; the central power-of-d baseline still samples blind."""

from __future__ import annotations

from gavel.shared.candidates import Candidates
from gavel.shared.reasons import Reason
from gavel.sim.cluster import Cluster
from gavel.sim.gavel import GavelPlacer
from gavel.sim.placer import Why
from gavel.sim.policies import plan, run_policy
from gavel.sim.scenario import parse_scenario
from gavel.sim.workload import Catalogue

FLEET = b"""
name = "labelled"
duration_s = 300.0
sample_s = 20.0
[[nodes]]
count = 60
cpu = 8.0
memory_mb = 16384
[[nodes]]
count = 3
cpu = 8.0
memory_mb = 16384
labels = { gpu = "yes" }
[[gavel]]
name = "sampled"
mode = "sample"
d = 2
mix = [{ strategy = "least-loaded", share = 1 }]
[baselines]
run = ["power-of-d"]
[workload]
rate = 2.0
[[workload.classes]]
name = "web"
weight = 4
cpu = 0.25
memory_mb = 256.0
duration_s = { dist = "exponential", mean = 20.0 }
[[workload.classes]]
name = "gpu"
weight = 1
cpu = 0.25
memory_mb = 256.0
labels = { gpu = "yes" }
duration_s = { dist = "exponential", mean = 20.0 }
"""


def test_labelled_requests_are_asked_of_the_nodes_that_carry_the_label() -> None:
    s = parse_scenario(FLEET)
    sampled, blind = (run_policy(s, 3, spec) for spec in plan(s, 3))
    assert sampled.arrivals == blind.arrivals and sampled.arrivals > 100
    # The gpu nodes have room for every gpu job: asked, they place each in its first round.
    assert sampled.unschedulable == 0 and sampled.unschedulable_by_class.get("gpu", 0) == 0
    assert blind.unschedulable_by_class["gpu"] > 0  # d of all 63 nodes: mostly declines


def test_the_placer_keeps_the_index_as_nodes_drain_and_go_unreachable() -> None:
    s = parse_scenario(FLEET)
    spec = plan(s, 3)[0]
    cluster = Cluster(s)
    placer = spec.build(cluster, Catalogue(s.workload.classes))
    assert isinstance(placer, GavelPlacer) and isinstance(placer.index, Candidates)
    placer.start()
    gpu = next(i for i, r in enumerate(placer.catalogue.requests) if r.labels)
    request = placer.books[gpu].request
    assert placer.index.pool(request) == ["n0060", "n0061", "n0062"]
    cluster.nodes[60].draining = True
    placer.changed(60, Why.DRAIN)
    cluster.unreachable(61)
    placer.changed(61, Why.UNREACHABLE)
    assert placer.index.pool(request) == ["n0062"]
    for _ in range(20):
        out = placer.place(gpu, 0.0)
        assert out.node == 62
    cluster.nodes[62].draining = True
    placer.changed(62, Why.DRAIN)
    rounds = placer.rounds
    assert placer.place(gpu, 0.0).reason == Reason.MISSING_LABEL  # what 60 of 63 would say
    assert placer.index.pool(request) == [] and placer.rounds == rounds + 1


def test_a_round_the_sampled_nodes_cannot_place_is_asked_of_more_nodes_then_of_all() -> None:
    """`shared.candidates` rule 9 in the fast path: with one plain node of 60 left with room,
    a request two full nodes decline is asked of 16 more, and only when those are full too of
    every node - three rounds; without the middle step every retry would be the second
    round, and a broadcast."""
    s = parse_scenario(FLEET)
    spec = plan(s, 3)[0]
    cluster = Cluster(s)
    placer = spec.build(cluster, Catalogue(s.workload.classes))
    assert isinstance(placer, GavelPlacer)
    placer.start()
    web = next(i for i, r in enumerate(placer.catalogue.requests) if not r.labels)
    shape = placer.catalogue.shapes[web]
    for idx in range(60):
        node = cluster.nodes[idx]
        while idx != 5 and node.used_milli + shape.cpu_milli <= node.cap_milli:
            node.charge(shape, +1)
        placer.changed(idx, Why.COMMIT)
    took: list[tuple[int, int]] = []
    for _ in range(60):
        before = placer.rounds
        out = placer.place(web, 0.0)
        took.append((placer.rounds - before, out.node))
    assert all(node >= 0 for _, node in took)
    assert {rounds for rounds, node in took if rounds == 2} and \
        all(node == 5 for rounds, node in took if rounds == 2)  # the 16 found the one node
    assert {rounds for rounds, _ in took} == {1, 2, 3}
