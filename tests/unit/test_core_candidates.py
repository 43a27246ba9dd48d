"""The candidate index (`shared.candidates`): a sampled auction asks only nodes that could
ever take the request, all of them when there are no more than d per request, none when no
node could (and then knows each node's decline); it follows joins, label and capacity
changes, drains and leaves, and the same seed draws the same nodes."""

from __future__ import annotations

import random

from gavel.shared.candidates import Candidates
from gavel.shared.messages import Capacity, Shape
from gavel.shared.reasons import Reason

SMALL = Capacity(cpu=8.0, memory_mb=32768, ports=100)
LARGE = Capacity(cpu=32.0, memory_mb=131072, ports=100)
GPU = Shape(cpu=2.0, memory_mb=1024, labels={"gpu": "yes"})
BIG = Shape(cpu=12.0, memory_mb=1024)
PLAIN = Shape(cpu=1.0, memory_mb=512)


def fleet(n: int = 100, gpus: int = 3, large: int = 10) -> Candidates:
    """`n` nodes: the first `gpus` carry gpu=yes, the last `large` are large."""
    index = Candidates()
    for i in range(n):
        labels = {"zone": "abc"[i % 3], **({"gpu": "yes"} if i < gpus else {})}
        index.update(f"n{i:03d}", labels, LARGE if i >= n - large else SMALL)
    return index


def draw(index: Candidates, shape: Shape, m: int = 1, seed: int = 1,
         d: int = 2) -> list[str]:
    got = index.draw([shape], [m], d, random.Random(seed))
    assert not got.hopeless
    return got.asked


def test_only_nodes_that_could_take_the_request_are_drawn() -> None:
    index = fleet()
    large = {f"n{i:03d}" for i in range(90, 100)}
    for seed in range(50):
        assert set(draw(index, BIG, seed=seed)) <= large
        assert len(draw(index, BIG, seed=seed)) == 2
        pinned = draw(index, Shape(cpu=1.0, memory_mb=512, labels={"zone": "b"}), seed=seed)
        assert all(int(n[1:]) % 3 == 1 for n in pinned)
    assert set(index.pool(BIG)) == large


def test_batch_sampling_draws_d_per_request_of_each_shape() -> None:
    index = fleet()
    got = index.draw([PLAIN, BIG], [5, 2], 2, random.Random(3))
    assert got.whole == [False, False]  # 10 of 100, and 4 of the 10 large nodes
    assert 10 <= len(got.asked) <= 14 and got.asked == sorted(got.asked)
    assert len([n for n in got.asked if int(n[1:]) >= 90]) >= 4
    got = index.draw([PLAIN, BIG], [5, 6], 2, random.Random(3))
    assert got.whole == [False, True]  # 12 wanted of the 10 large nodes: all of them
    assert {f"n{i:03d}" for i in range(90, 100)} <= set(got.asked)


def test_fewer_candidates_than_d_are_all_asked() -> None:
    index = fleet(gpus=3)
    assert draw(index, GPU, m=2) == ["n000", "n001", "n002"]  # 3 <= d·m = 4
    got = index.draw([GPU], [1], 2, random.Random(1))
    assert got.whole == [False] and len(got.asked) == 2
    index = fleet(gpus=1)
    got = index.draw([GPU], [1], 2, random.Random(1))
    assert got.asked == ["n000"] and got.whole == [True]


def test_a_shape_no_node_can_take_is_hopeless_with_each_nodes_reason() -> None:
    index = fleet(n=6, gpus=0, large=1)
    got = index.draw([PLAIN, GPU, Shape(cpu=64.0, memory_mb=1)], [1, 1, 1], 2,
                     random.Random(1))
    assert got.hopeless == [1, 2] and len(got.asked) == 2
    refusals = index.refusals(GPU)
    assert [n for n, _ in refusals] == [f"n{i:03d}" for i in range(6)]
    assert {(r.reason, r.detail) for _, r in refusals} == {(Reason.MISSING_LABEL, "gpu=yes")}
    assert {r.reason for _, r in index.refusals(Shape(cpu=64.0, memory_mb=1))} \
        == {Reason.NO_ROOM_CPU}
    assert Candidates().draw([PLAIN], [1], 2, random.Random(1)).hopeless == [0]


def test_the_index_follows_joins_labels_capacity_drains_and_leaves() -> None:
    index = fleet(n=10, gpus=0, large=0)
    assert index.pool(GPU) == [] and index.pool(BIG) == []
    index.update("n010", {"gpu": "yes"}, SMALL)  # joins
    assert index.pool(GPU) == ["n010"]
    index.update("n003", {"gpu": "yes"}, SMALL)  # gains the label
    assert index.pool(GPU) == ["n003", "n010"]
    index.update("n003", {}, LARGE)  # loses it, grows
    assert index.pool(GPU) == ["n010"] and index.pool(BIG) == ["n003"]
    index.update("n010", {"gpu": "yes"}, SMALL, draining=True)  # drains (it says so)
    assert index.pool(GPU) == []
    assert {r.reason for n, r in index.refusals(GPU) if n == "n010"} == {Reason.DRAINING}
    index.update("n010", {"gpu": "yes"}, SMALL)
    index.drained({"n010"})  # git says draining; the node does not know yet
    assert index.pool(GPU) == []
    index.drained(set())
    assert index.pool(GPU) == ["n010"]
    everyone = [f"n{i:03d}" for i in range(11)]
    index.live([n for n in everyone if n != "n010"])  # unreachable: not asked
    assert index.pool(GPU) == [] and index.refusals(GPU)[0][0] == "n000"
    index.live(everyone)
    assert index.pool(GPU) == ["n010"]
    index.remove("n010")  # leaves
    assert index.pool(GPU) == [] and len(index) == 10


def test_a_change_that_changes_nothing_keeps_the_derived_candidates() -> None:
    index = fleet()
    nodes = index.asked()
    index.live(nodes)
    pool = index.pool(BIG)
    version = index.version
    index.update("n095", {"zone": "c"}, LARGE.copy())  # the same heartbeat again
    index.live(nodes)
    index.live(list(nodes))
    index.drained(set())
    assert index.version == version and index.pool(BIG) is pool


def test_the_same_seed_draws_the_same_nodes_whatever_the_order_of_joins() -> None:
    forward = fleet()
    backward = Candidates()
    for node in reversed(forward.asked()):
        i = int(node[1:])
        labels = {"zone": "abc"[i % 3], **({"gpu": "yes"} if i < 3 else {})}
        backward.update(node, labels, LARGE if i >= 90 else SMALL)
    for seed in range(20):
        a = forward.draw([PLAIN, BIG], [3, 1], 2, random.Random(seed))
        assert a == backward.draw([PLAIN, BIG], [3, 1], 2, random.Random(seed))
    assert draw(forward, PLAIN, seed=1) != draw(forward, PLAIN, seed=2)


def test_excluded_nodes_are_left_out_unless_no_other_is_left() -> None:
    index = fleet(gpus=3)
    got = index.draw([GPU], [1], 2, random.Random(1), excluded={"n000"})
    assert got.asked == ["n001", "n002"]
    got = index.draw([GPU], [1], 2, random.Random(1), excluded={"n000", "n001", "n002"})
    assert len(got.asked) == 2 and not got.hopeless


def test_the_last_winner_of_a_shape_is_asked_beside_the_drawn_nodes_while_it_could_fit() -> None:
    index = fleet()
    last: dict[object, str] = {PLAIN.key(): "n050", GPU.key(): "n050"}
    for seed in range(20):
        got = index.draw([PLAIN, GPU], [1, 1], 2, random.Random(seed), last=last)
        assert "n050" in got.asked  # a candidate for PLAIN (n050 carries no gpu label)
        assert len(got.asked) <= 5
        assert "n050" not in index.draw([GPU], [1], 2, random.Random(seed), last=last).asked
    index.update("n050", {"zone": "c"}, SMALL, draining=True)
    assert all("n050" not in index.draw([PLAIN], [1], 2, random.Random(s), last=last).asked
               for s in range(20))
    got = index.draw([PLAIN], [1], 2, random.Random(1), last={PLAIN.key(): "gone"})
    assert len(got.asked) == 2
