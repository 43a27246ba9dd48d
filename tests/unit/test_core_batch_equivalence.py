"""Why batching is allowed: one batch auction awards as a sequence of single auctions would.

For `spread` (its price is linear in what a node has committed and ignores host stats) a
node's bid plus its `step` per instance won is exactly the price it would ask if asked again.
So one auction over a whole batch, every node answering once per shape from its state before
the batch, must pick the same winners as one single-request auction per request in order,
each node re-bidding through `shared.strategies.answer` from its state after the previous
awards. Capacities and shapes are binary fractions, so float arithmetic is exact and a tie in
one run is a tie in the other.
"""

from __future__ import annotations

import math

from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from gavel.shared.auction import Auction, Awarded, Decision
from gavel.shared.feasibility import NodeView
from gavel.shared.messages import BidReply, Capacity, HostStats, Request, Shape
from gavel.shared.strategies import answer, make_strategy

SPREAD = make_strategy("spread")


def _node(node_id: str, capacity: Capacity, committed: Capacity, *,
          labels: dict[str, str] | None = None, draining: bool = False,
          stats: HostStats | None = None) -> NodeView:
    return NodeView(node_id=node_id, capacity=capacity, committed=committed,
                    stats=stats or HostStats(), labels=labels or {}, draining=draining)


def _plus(view: NodeView, r: Shape) -> NodeView:
    c = view.committed
    return _node(view.node_id, view.capacity,
                 Capacity(cpu=c.cpu + r.cpu, memory_mb=c.memory_mb + r.memory_mb,
                          ports=c.ports + r.ports),
                 labels=view.labels, draining=view.draining, stats=view.stats)


def _free(views: list[NodeView]) -> dict[str, Capacity]:
    return {v.node_id: v.capacity - v.committed for v in views}


def sequence(views: list[NodeView], requests: list[Request]) -> list[Decision]:
    """One single-request auction per request; every node re-bids from its updated state."""
    state = {v.node_id: v for v in views}
    out: list[Decision] = []
    for k, r in enumerate(requests):
        auction = Auction(f"s-{k}", [r], list(state), opened_at=0.0, deadline_s=1.0)
        [shape] = auction.rfb().shapes
        for v in state.values():
            auction.receive(BidReply(auction_id=f"s-{k}", node_id=v.node_id,
                                     answers=[answer(SPREAD, shape, v)]), 0.5)
        [d] = auction.decide(1.0, free=_free(list(state.values())))
        if isinstance(d, Awarded):
            state[d.winner.node_id] = _plus(state[d.winner.node_id], r)
        out.append(d)
    return out


def batch(views: list[NodeView], requests: list[Request]) -> list[Decision]:
    """One auction for all of them; every node answers once per shape, from its state now."""
    auction = Auction("b", requests, [v.node_id for v in views], opened_at=0.0, deadline_s=1.0)
    shapes = auction.rfb().shapes
    for v in views:
        auction.receive(BidReply(auction_id="b", node_id=v.node_id,
                                 answers=[answer(SPREAD, s, v, i) for i, s in enumerate(shapes)]),
                        0.5)
    return auction.decide(1.0, free=_free(views))


def _summary(decisions: list[Decision], why: bool = True) -> list[tuple[object, ...]]:
    """What each request got: the winner, the load it won at and whether a tie decided it, or
    (with `why`) why nobody could take it."""
    return [(d.winner.node_id, d.winner.load, d.tie_broken) if isinstance(d, Awarded)
            else (None, d.reason, d.summary) if why else (None, None, None)
            for d in decisions]


# -- generators: binary fractions only -----------------------------------------------------

# Weighted towards the common case so nodes fit, tie and fill up, not only decline.
NODE_ZONES = st.sampled_from([{"zone": "a"}, {"zone": "a"}, {"zone": "b"}, {}])
SHAPE_ZONES = st.sampled_from([{}, {}, {}, {"zone": "a"}, {"zone": "b"}])


@st.composite
def clusters(draw: st.DrawFn) -> list[NodeView]:
    views = []
    for k in range(draw(st.integers(1, 4))):
        capacity = Capacity(cpu=draw(st.sampled_from([1.0, 2.0, 4.0, 4.0, 8.0])),
                            memory_mb=draw(st.sampled_from([256, 1024, 1024, 2048])),
                            ports=draw(st.sampled_from([0, 1, 4, 4])))
        committed = Capacity(
            cpu=draw(st.sampled_from([c for c in (0.0, 0.0, 0.25, 0.5, 1.0, 2.0)
                                      if c <= capacity.cpu])),
            memory_mb=draw(st.sampled_from([m for m in (0, 0, 64, 128, 256)
                                            if m <= capacity.memory_mb])),
            ports=draw(st.integers(0, capacity.ports)) if draw(st.booleans()) else 0)
        # Host stats are drawn wildly: spread must not look at them.
        stats = HostStats(cpu_ratio=draw(st.floats(0.0, 1.0)),
                          memory_ratio=draw(st.floats(0.0, 1.0)))
        views.append(_node(f"n{k}", capacity, committed, labels=draw(NODE_ZONES),
                           draining=draw(st.integers(0, 9)) == 0, stats=stats))
    return views


def _requests(draw: st.DrawFn, shapes: list[Shape]) -> list[Request]:
    picks = draw(st.lists(st.sampled_from(range(len(shapes))), min_size=1, max_size=14))
    return [Request(instance_id=f"i-{k}", cpu=shapes[s].cpu, memory_mb=shapes[s].memory_mb,
                    ports=shapes[s].ports, labels=dict(shapes[s].labels))
            for k, s in enumerate(picks)]


@st.composite
def one_profile(draw: st.DrawFn) -> list[Request]:
    """Shapes that differ in labels only: a node that cannot take another of one cannot take
    another of any, so nodes run out of room freely."""
    cpu = draw(st.sampled_from([0.25, 0.5, 1.0, 2.0]))
    memory = draw(st.sampled_from([64, 128, 256, 512]))
    ports = draw(st.sampled_from([0, 0, 1]))
    labels = draw(st.lists(SHAPE_ZONES, min_size=1, max_size=3,
                           unique_by=lambda d: tuple(d.items())))
    return _requests(draw, [Shape(cpu=cpu, memory_mb=memory, ports=ports, labels=lab)
                            for lab in labels])


@st.composite
def any_shapes(draw: st.DrawFn) -> list[Request]:
    shapes = draw(st.lists(st.builds(Shape, cpu=st.sampled_from([0.25, 0.5, 1.0, 2.0]),
                                     memory_mb=st.sampled_from([64, 128, 256, 512]),
                                     ports=st.sampled_from([0, 0, 1]), labels=SHAPE_ZONES),
                           min_size=1, max_size=3, unique_by=lambda s: s.key()))
    return _requests(draw, shapes)


def _holds_only_one_more(views: list[NodeView], requests: list[Request]) -> bool:
    """Does some node, in the sequence, win an instance it could not take a second of?"""
    state = {v.node_id: v for v in views}
    for d in sequence(views, requests):
        if isinstance(d, Awarded):
            before = state[d.winner.node_id]
            got = answer(SPREAD, d.request.shape(), before)
            if getattr(got, "step", 0.0) == math.inf:
                return True
            state[d.winner.node_id] = _plus(before, d.request)
    return False


# -- the properties ------------------------------------------------------------------------


def _check(views: list[NodeView], requests: list[Request], why: bool = True) -> None:
    expected = _summary(sequence(views, requests), why)
    assert _summary(batch(views, requests), why) == expected
    winners = {w for w, *_ in expected if w is not None}
    event(f"{len(winners)} distinct winners")
    event("some unschedulable" if None in [w for w, *_ in expected] else "all placed")
    event("a tie decided" if any(w is not None and t for w, _, t in expected) else "no tie")


@settings(max_examples=400)
@given(clusters(), one_profile())
def test_a_batch_awards_as_a_sequence_of_single_auctions(views: list[NodeView],
                                                         requests: list[Request]) -> None:
    _check(views, requests)


@settings(max_examples=300)
@given(clusters(), any_shapes())
def test_shapes_of_any_size_award_as_a_sequence_while_no_winner_fills_up(
        views: list[NodeView], requests: list[Request]) -> None:
    """Across shapes of different sizes too — as long as no winner reaches its last instance:
    see `test_a_node_full_for_one_shape_still_takes_a_smaller_one`.

    Winners only: when nobody takes a request the reasons may differ, both true. A node
    declines a shape once, for the first check it fails before the batch (no free ports); asked
    again after winning a smaller shape it may fail an earlier check first (memory)."""
    assume(len({r.key() for r in requests}) == 1 or not _holds_only_one_more(views, requests))
    _check(views, requests, why=False)


def test_equal_nodes_alternate_as_they_would_one_auction_at_a_time() -> None:
    cap = Capacity(cpu=4.0, memory_mb=1024, ports=0)
    views = [_node("n1", cap, Capacity()), _node("n2", cap, Capacity())]
    requests = [Request(instance_id=f"i-{k}", cpu=1.0, memory_mb=256) for k in range(6)]
    got = _summary(batch(views, requests))
    assert got == _summary(sequence(views, requests))
    assert [w for w, *_ in got] == ["n1", "n2", "n1", "n2", "n1", "n2"]  # n1 is 1 cpu short
    assert got[4] == ("n1", 0.5, True)


def test_a_node_full_for_one_shape_still_takes_a_smaller_one() -> None:
    views = [_node("n1", Capacity(cpu=2.0, memory_mb=1024), Capacity())]
    big = Request(instance_id="i-big", cpu=1.5, memory_mb=64)
    small = Request(instance_id="i-small", cpu=0.5, memory_mb=64)
    assert [w for w, *_ in _summary(sequence(views, [big, small]))] == ["n1", "n1"]
    assert _summary(batch(views, [big, small])) == _summary(sequence(views, [big, small]))
