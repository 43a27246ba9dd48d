"""The candidate index spares scarce and large nodes (`shared.candidates` rules 5-7): a
request that needs no rare label is drawn among the nodes that carry none, a small request
among the nodes smaller than the largest, the last winner is asked only from among those,
and with too few such nodes the draw falls back to every candidate."""

from __future__ import annotations

import random

from gavel.shared.candidates import Candidates
from gavel.shared.messages import Capacity, Shape

SMALL = Capacity(cpu=8.0, memory_mb=32768, ports=100)
LARGE = Capacity(cpu=32.0, memory_mb=131072, ports=100)
GPU = Shape(cpu=2.0, memory_mb=1024, labels={"gpu": "yes"})
BIG = Shape(cpu=12.0, memory_mb=1024)
PLAIN = Shape(cpu=1.0, memory_mb=512)
HALF = Shape(cpu=6.0, memory_mb=512)  # more than half of a small node


def fleet(n: int = 100, gpus: int = 3, large: int = 10, gpu_cap: Capacity = SMALL
          ) -> Candidates:
    """`n` nodes over three zones: the first `gpus` carry gpu=yes, the last `large` are
    large."""
    index = Candidates()
    for i in range(n):
        labels = {"zone": "abc"[i % 3], **({"gpu": "yes"} if i < gpus else {})}
        cap = LARGE if i >= n - large else gpu_cap if i < gpus else SMALL
        index.update(f"n{i:03d}", labels, cap)
    return index


def asked(index: Candidates, shape: Shape, seeds: int = 60, m: int = 1,
          last: dict[object, str] | None = None) -> set[str]:
    """Every node asked for `m` requests of `shape` over `seeds` draws."""
    out: set[str] = set()
    for seed in range(seeds):
        got = index.draw([shape], [m], 2, random.Random(seed), last=last)
        assert not got.hopeless and not got.whole[0] and len(got.asked) >= 2 * m
        out.update(got.asked)
    return out


def gpus(nodes: set[str], count: int = 3) -> set[str]:
    return {n for n in nodes if int(n[1:]) < count}


def test_a_request_that_needs_no_scarce_label_is_not_drawn_from_the_nodes_that_carry_one() -> None:
    index = fleet(large=0)
    assert index.scarce() == frozenset({("gpu", "yes")})  # 3 of 100; a zone is a third
    assert gpus(asked(index, PLAIN)) == set()
    assert set(index.pool(PLAIN)) - set(index.field(PLAIN)) == {"n000", "n001", "n002"}
    assert asked(index, GPU) == {"n000", "n001", "n002"}  # those asking for it still go there
    pinned = asked(index, Shape(cpu=1.0, memory_mb=512, labels={"zone": "a"}))
    assert gpus(pinned) == set() and all(int(n[1:]) % 3 == 0 for n in pinned)
    # In the same draw as other shapes, and with nodes excluded, the same holds.
    got = index.draw([PLAIN, GPU], [5, 1], 2, random.Random(1), excluded={"n050"})
    assert "n050" not in got.asked and len(gpus(set(got.asked))) <= 2


def test_with_too_few_plain_nodes_the_scarce_ones_are_drawn_from_too() -> None:
    index = fleet(large=0)
    assert gpus(asked(index, PLAIN, m=49)) != set()  # 98 wanted, 97 plain: every candidate
    unique = Candidates()  # every node carries a label of its own: all scarce, none plain
    for i in range(20):
        unique.update(f"n{i:03d}", {"host": f"h{i}"}, SMALL)
    assert len(unique.scarce()) == 20 and len(asked(unique, PLAIN)) > 2
    assert unique.field(PLAIN) == unique.pool(PLAIN)


def test_a_small_request_is_not_drawn_from_the_largest_nodes() -> None:
    index = fleet(gpus=0)
    large = {f"n{i:03d}" for i in range(90, 100)}
    assert asked(index, PLAIN) & large == set()
    assert asked(index, BIG) <= large  # only the large nodes can take it
    assert asked(index, HALF) & large != set()  # more than half a small node: anywhere
    # Largest nodes more than half of the candidates: they are drawn from too.
    mostly_large = fleet(n=20, gpus=0, large=11)
    assert {n for n in asked(mostly_large, PLAIN) if int(n[1:]) >= 9} != set()


def test_the_last_winner_is_asked_only_when_among_the_nodes_drawn_from() -> None:
    index = fleet()
    last: dict[object, str] = {PLAIN.key(): "n000"}  # a gpu node won a plain request
    assert "n000" not in asked(index, PLAIN, last=last)
    last = {PLAIN.key(): "n095"}  # a large node did
    assert "n095" not in asked(index, PLAIN, last=last)
    last = {PLAIN.key(): "n050"}
    for seed in range(20):
        assert "n050" in index.draw([PLAIN], [1], 2, random.Random(seed), last=last).asked
        got = index.draw([PLAIN, BIG], [1, 1], 2, random.Random(seed), last=last)
        assert "n050" in got.asked


def test_a_request_of_half_a_node_or_more_asks_d_more_for_each_half() -> None:
    index = fleet(gpus=0, large=0)  # 100 nodes of 8 cpu

    def count(cpu: float, m: int = 1) -> int:
        got = index.draw([Shape(cpu=cpu, memory_mb=512)], [m], 2, random.Random(1))
        return len(got.asked)
    assert (count(1.0), count(3.9), count(4.0), count(8.0), count(4.0, m=3)) == (2, 2, 4, 6, 12)
    assert index.times(Shape(cpu=4.0, memory_mb=512)) == 2
    got = index.draw([Shape(cpu=8.0, memory_mb=512)], [17], 2, random.Random(1))
    assert got.whole == [True] and len(got.asked) == 100  # 17 · 6 > 100: every candidate
    large = fleet(gpus=0)  # measured against the smallest node drawn among: here 32 cpu
    assert large.times(BIG) == 1 and large.times(Shape(cpu=24.0, memory_mb=512)) == 2
    for shape, asked in ((BIG, 2), (Shape(cpu=16.0, memory_mb=512), 4)):
        got = large.draw([shape, PLAIN], [1, 1], 2, random.Random(1), excluded={"n000"})
        assert len([n for n in got.asked if int(n[1:]) >= 90]) == asked
