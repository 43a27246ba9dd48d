"""Batch awards: one auction, many requests, and no node is ever promised more than it has.

`decide(now, free=...)` charges each award against the winner's free capacity before the
next request is awarded; a bidder that no longer fits is recorded as a no-room decline. A node
that already won in this batch competes at its effective load: its bid plus its `step` for
every instance it won, so a batch decides as a sequence of single auctions would.
"""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gavel.shared.auction import Auction, Awarded, Decision, Unschedulable
from gavel.shared.award import NodeDecline
from gavel.shared.messages import Bid, BidReply, Capacity, Decline, Request, Shape
from gavel.shared.reasons import Reason

TOL = 1e-6
NO_ROOM = {Reason.NO_ROOM_CPU, Reason.NO_ROOM_MEMORY, Reason.NO_ROOM_PORTS}


def _reply(node: str, answers: list[Bid | Decline]) -> BidReply:
    return BidReply(auction_id="a-1", node_id=node, answers=answers)


def _winners(decisions: list[Decision]) -> list[str | None]:
    return [d.winner.node_id if isinstance(d, Awarded) else None for d in decisions]


def test_second_award_goes_elsewhere_when_the_first_filled_the_best_node() -> None:
    r1 = Request(instance_id="i-1", cpu=2.0, memory_mb=100)
    r2 = Request(instance_id="i-2", cpu=2.0, memory_mb=100)
    auction = Auction("a-1", [r1, r2], ["n1", "n2"], opened_at=0.0, deadline_s=1.0)
    assert auction.rfb().counts == [2]  # one shape: each node answers once for both
    for node, load in (("n1", 0.1), ("n2", 0.2)):
        auction.receive(_reply(node, [Bid(shape=0, load=load)]), 0.0)
    free = {"n1": Capacity(cpu=3.0, memory_mb=1000, ports=5),
            "n2": Capacity(cpu=2.0, memory_mb=1000, ports=5)}
    first, second = auction.decide(0.5, free=free)
    assert isinstance(first, Awarded) and first.winner.node_id == "n1"
    assert isinstance(second, Awarded) and second.winner.node_id == "n2"
    assert list(second.declines) == [NodeDecline(node_id="n1", reason="no room for cpu",
                                                 detail="2")]
    # The caller's map is not consumed.
    assert free["n1"] == Capacity(cpu=3.0, memory_mb=1000, ports=5)


def test_an_award_of_one_shape_is_charged_against_the_next_shape() -> None:
    """Capacity is the node's, not the shape's: winning shape 0 can leave no room for 1."""
    r1 = Request(instance_id="i-1", cpu=2.0, memory_mb=100)
    r2 = Request(instance_id="i-2", cpu=1.5, memory_mb=100)
    auction = Auction("a-1", [r1, r2], ["n1", "n2"], opened_at=0.0, deadline_s=1.0)
    for node, load in (("n1", 0.1), ("n2", 0.2)):
        auction.receive(_reply(node, [Bid(shape=0, load=load), Bid(shape=1, load=load)]), 0.0)
    free = {"n1": Capacity(cpu=3.0, memory_mb=1000, ports=5),
            "n2": Capacity(cpu=2.0, memory_mb=1000, ports=5)}
    first, second = auction.decide(0.5, free=free)
    assert _winners([first, second]) == ["n1", "n2"]
    assert list(second.declines) == [NodeDecline(node_id="n1", reason="no room for cpu",
                                                 detail="1.5")]
    assert list(first.declines) == []  # shape 0's record is not touched by shape 1's


def test_batch_that_fills_every_node_is_unschedulable_with_no_room() -> None:
    reqs = [Request(instance_id=f"i-{k}", cpu=1.0, memory_mb=512, ports=1) for k in range(3)]
    auction = Auction("a-1", reqs, ["n1", "n2"], opened_at=0.0, deadline_s=1.0)
    for node in ("n1", "n2"):
        auction.receive(_reply(node, [Bid(shape=0, load=0.5)]), 0.0)
    free = {"n1": Capacity(cpu=8.0, memory_mb=600, ports=4),   # memory runs out
            "n2": Capacity(cpu=8.0, memory_mb=4096, ports=1)}  # ports run out
    a, b, c = auction.decide(1.0, free=free)
    assert isinstance(a, Awarded) and a.winner.node_id == "n1" and a.tie_broken
    assert isinstance(b, Awarded) and b.winner.node_id == "n2" and not b.tie_broken
    assert isinstance(c, Unschedulable)
    assert list(c.declines) == [
        NodeDecline(node_id="n1", reason="no room for memory", detail="512"),
        NodeDecline(node_id="n2", reason="no free ports")]
    assert c.reason is Reason.ALL_FULL
    assert c.summary == "0/2 nodes bid: 1 no free ports, 1 no room for 512 MB memory"


# -- the marginal step --------------------------------------------------------------------


def _same_shape(n: int) -> list[Request]:
    return [Request(instance_id=f"i-{k}", cpu=0.5, memory_mb=64) for k in range(n)]


def test_equal_nodes_with_a_positive_step_take_turns() -> None:
    auction = Auction("a-1", _same_shape(6), ["n1", "n2"], opened_at=0.0, deadline_s=1.0)
    for node in ("n1", "n2"):
        auction.receive(_reply(node, [Bid(shape=0, load=0.25, step=0.125)]), 0.0)
    decisions = auction.decide(1.0)
    assert _winners(decisions) == ["n1", "n2"] * 3
    # Each won at its effective load, and every round was a tie the node id broke.
    loads = [d.winner.load for d in decisions if isinstance(d, Awarded)]
    assert loads == [0.25, 0.25, 0.375, 0.375, 0.5, 0.5]
    assert [d.tie_broken for d in decisions if isinstance(d, Awarded)] == [True, False] * 3


def test_a_cheaper_step_wins_more_of_the_batch() -> None:
    auction = Auction("a-1", _same_shape(4), ["n1", "n2"], opened_at=0.0, deadline_s=1.0)
    auction.receive(_reply("n1", [Bid(shape=0, load=0.5, step=0.5)]), 0.0)
    auction.receive(_reply("n2", [Bid(shape=0, load=0.5, step=0.125)]), 0.0)
    # n2's load climbs 0.5, 0.625, 0.75, 0.875; n1's first would already be 1.0 after one.
    assert _winners(auction.decide(1.0)) == ["n1", "n2", "n2", "n2"]


def test_a_zero_step_keeps_the_best_node_winning_while_it_fits() -> None:
    auction = Auction("a-1", _same_shape(4), ["n1", "n2"], opened_at=0.0, deadline_s=1.0)
    auction.receive(_reply("n1", [Bid(shape=0, load=0.1)]), 0.0)
    auction.receive(_reply("n2", [Bid(shape=0, load=0.2)]), 0.0)
    free = {"n1": Capacity(cpu=1.5, memory_mb=1000, ports=0),
            "n2": Capacity(cpu=8.0, memory_mb=1000, ports=0)}
    decisions = auction.decide(1.0, free=free)
    assert _winners(decisions) == ["n1", "n1", "n1", "n2"]
    assert list(decisions[-1].declines) == [NodeDecline(node_id="n1", reason="no room for cpu",
                                                        detail="0.5")]


def test_a_negative_step_packs_one_node() -> None:
    auction = Auction("a-1", _same_shape(4), ["n1", "n2"], opened_at=0.0, deadline_s=1.0)
    auction.receive(_reply("n1", [Bid(shape=0, load=0.5, step=-0.125)]), 0.0)
    auction.receive(_reply("n2", [Bid(shape=0, load=0.5, step=-0.125)]), 0.0)
    decisions = auction.decide(1.0)
    assert _winners(decisions) == ["n1"] * 4
    assert [d.winner.load for d in decisions if isinstance(d, Awarded)] == [
        0.5, 0.375, 0.25, 0.125]
    assert [d.tie_broken for d in decisions if isinstance(d, Awarded)] == [
        True, False, False, False]


def test_an_infinite_step_means_only_one() -> None:
    auction = Auction("a-1", _same_shape(3), ["n1", "n2"], opened_at=0.0, deadline_s=1.0)
    auction.receive(_reply("n1", [Bid(shape=0, load=0.0, step=math.inf)]), 0.0)
    auction.receive(_reply("n2", [Bid(shape=0, load=0.5, step=math.inf)]), 0.0)
    a, b, c = auction.decide(1.0)
    assert _winners([a, b, c]) == ["n1", "n2", None]
    assert isinstance(c, Unschedulable)


def test_a_step_won_in_one_shape_raises_the_node_in_every_shape() -> None:
    """The step is the price of what the node now holds, whatever shape it was asked for."""
    small = Request(instance_id="i-1", cpu=0.5, memory_mb=64)
    big = Request(instance_id="i-2", cpu=1.0, memory_mb=64)
    auction = Auction("a-1", [small, big], ["n1", "n2"], opened_at=0.0, deadline_s=1.0)
    auction.receive(_reply("n1", [Bid(shape=0, load=0.25, step=0.25),
                                  Bid(shape=1, load=0.25, step=0.5)]), 0.0)
    auction.receive(_reply("n2", [Bid(shape=0, load=0.375, step=0.25),
                                  Bid(shape=1, load=0.375, step=0.5)]), 0.0)
    first, second = auction.decide(1.0)
    # n1 took `small` at 0.25; for `big` it now stands at 0.25 + 0.25 = 0.5 > 0.375.
    assert _winners([first, second]) == ["n1", "n2"]
    assert isinstance(second, Awarded) and second.winner.load == 0.375


def test_a_negative_step_won_in_one_shape_lowers_the_node_in_every_shape() -> None:
    """Regression: a node whose load fell after an award in one shape must be found at its
    new load in the others, not left buried at its old one in their heaps."""
    a = Request(instance_id="i-1", cpu=0.5, memory_mb=64)
    b = Request(instance_id="i-2", cpu=1.0, memory_mb=64)
    auction = Auction("a-1", [a, b], ["n1", "n2"], opened_at=0.0, deadline_s=1.0)
    auction.receive(_reply("n1", [Bid(shape=0, load=0.5, step=-0.25),
                                  Bid(shape=1, load=0.5, step=-0.25)]), 0.0)
    auction.receive(_reply("n2", [Bid(shape=0, load=0.5, step=-0.25),
                                  Bid(shape=1, load=0.375, step=-0.25)]), 0.0)
    first, second = auction.decide(1.0)
    # n1 won `a` on the tie-break; for `b` it stands at 0.5 - 0.25 = 0.25 < n2's 0.375.
    assert _winners([first, second]) == ["n1", "n1"]
    assert isinstance(second, Awarded)
    assert (second.winner.load, second.tie_broken) == (0.25, False)


def test_a_tie_counts_effective_loads_not_bids() -> None:
    auction = Auction("a-1", _same_shape(2), ["n1", "n2"], opened_at=0.0, deadline_s=1.0)
    auction.receive(_reply("n1", [Bid(shape=0, load=0.25, step=0.25)]), 0.0)
    auction.receive(_reply("n2", [Bid(shape=0, load=0.5, step=0.25)]), 0.0)
    first, second = auction.decide(1.0)
    assert isinstance(first, Awarded) and not first.tie_broken
    # n1 now stands at 0.5, as n2 bid: the second award is a tie broken on the node id.
    assert isinstance(second, Awarded) and second.winner.node_id == "n1"
    assert second.tie_broken and second.winner.load == 0.5


def test_a_tie_with_a_node_that_no_longer_fits_is_no_tie() -> None:
    auction = Auction("a-1", _same_shape(2), ["n1", "n2"], opened_at=0.0, deadline_s=1.0)
    auction.receive(_reply("n1", [Bid(shape=0, load=0.25)]), 0.0)
    auction.receive(_reply("n2", [Bid(shape=0, load=0.25)]), 0.0)
    free = {"n1": Capacity(cpu=4.0, memory_mb=1000), "n2": Capacity(cpu=0.25, memory_mb=1000)}
    first, second = auction.decide(1.0, free=free)
    assert isinstance(first, Awarded) and not first.tie_broken
    assert list(first.declines) == [NodeDecline(node_id="n2", reason="no room for cpu",
                                                detail="0.5")]
    assert isinstance(second, Awarded) and second.winner.node_id == "n1"


# -- property: never over-commit, and decide as the greedy sequence would ----------------

NODE_IDS = ["n0", "n1", "n2", "n3", "n4"]
STEPS = [0.0, 0.1, 0.25, -0.1, -0.25, math.inf]

capacities = st.builds(
    Capacity,
    cpu=st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]),
    memory_mb=st.sampled_from([0, 64, 128, 256, 1024]),
    ports=st.integers(0, 3),
)

Batch = tuple[list[Request], dict[str, Capacity], dict[str, list[Bid | Decline]]]


def _shapes(requests: list[Request]) -> tuple[list[Shape], list[int]]:
    """Distinct shapes in order of first appearance, and each request's index among them."""
    index: dict[object, int] = {}
    shapes: list[Shape] = []
    of: list[int] = []
    for r in requests:
        s = index.setdefault(r.key(), len(index))
        if s == len(shapes):
            shapes.append(r.shape())
        of.append(s)
    return shapes, of


@st.composite
def batches(draw: st.DrawFn) -> Batch:
    n_nodes = draw(st.integers(1, len(NODE_IDS)))
    nodes = NODE_IDS[:n_nodes]
    requests = [
        Request(
            instance_id=f"i-{k}",
            cpu=draw(st.sampled_from([0.25, 0.5, 1.0])),
            memory_mb=draw(st.sampled_from([32, 64, 128])),
            ports=draw(st.integers(0, 1)),
        )
        for k in range(draw(st.integers(1, 10)))
    ]
    shapes, _ = _shapes(requests)
    free = {n: draw(capacities) for n in nodes}
    replies: dict[str, list[Bid | Decline]] = {}
    for node in nodes:
        if draw(st.integers(0, 9)) == 0:
            continue  # silent
        answers: list[Bid | Decline] = []
        for s in range(len(shapes)):
            kind = draw(st.integers(0, 9))
            if kind == 0:
                answers.append(Decline(shape=s, reason=Reason.DRAINING))
            elif kind == 1:
                continue  # answered the RFB but skipped this shape: silent for it
            else:
                load = draw(st.sampled_from([0.0, 0.2, 0.5, 0.9]))
                answers.append(Bid(shape=s, load=load, step=draw(st.sampled_from(STEPS))))
        replies[node] = draw(st.permutations(answers))
    return requests, free, replies


def _shortfall(r: Request, room: Capacity) -> Reason | None:
    if r.cpu > room.cpu + 1e-9:
        return Reason.NO_ROOM_CPU
    if r.memory_mb > room.memory_mb:
        return Reason.NO_ROOM_MEMORY
    if r.ports > room.ports:
        return Reason.NO_ROOM_PORTS
    return None


def _short_on(reason: str, r: Request, room: Capacity) -> bool:
    """Is `room` still short of what `reason` says? (A node dropped for ports stays dropped
    for ports, even once it has also run out of cpu.)"""
    return {Reason.NO_ROOM_CPU: r.cpu > room.cpu + 1e-9,
            Reason.NO_ROOM_MEMORY: r.memory_mb > room.memory_mb,
            Reason.NO_ROOM_PORTS: r.ports > room.ports}[Reason(reason)]


def _decide(batch: Batch, with_free: bool = True) -> list[Decision]:
    requests, free, replies = batch
    auction = Auction("a-1", requests, list(free), opened_at=0.0, deadline_s=1.0)
    for node, answers in replies.items():
        assert auction.receive(_reply(node, answers), 0.5).value == "accepted"
    return auction.decide(1.0, free=free if with_free else None)


@settings(max_examples=400)
@given(batches())
def test_decide_never_over_commits_a_node(batch: Batch) -> None:
    requests, free, replies = batch
    decisions = _decide(batch)
    assert [d.request for d in decisions] == requests

    # 1. The invariant itself, from the decisions alone.
    used = {n: Capacity() for n in free}
    for d in decisions:
        if isinstance(d, Awarded):
            u = used[d.winner.node_id]
            u.cpu += d.request.cpu
            u.memory_mb += d.request.memory_mb
            u.ports += d.request.ports
    for n, u in used.items():
        assert u.cpu <= free[n].cpu + TOL, n
        assert u.memory_mb <= free[n].memory_mb, n
        assert u.ports <= free[n].ports, n

    # 2. Greedy in request order: the winner is the lowest (effective load, node id) that still
    #    fits, a request is only unschedulable if none does, and every no-room decline is real.
    _, shape_of = _shapes(requests)
    remaining = {n: Capacity(cpu=c.cpu, memory_mb=c.memory_mb, ports=c.ports)
                 for n, c in free.items()}
    extra: dict[str, float] = {}
    for d, s in zip(decisions, shape_of, strict=True):
        r = d.request
        offers = {n: (a.load, a.step) for n, ans in replies.items() for a in ans
                  if a.shape == s and isinstance(a, Bid)}
        effective = {n: load + extra.get(n, 0.0) for n, (load, _) in offers.items()}
        short = {n: _shortfall(r, remaining[n]) for n in offers}
        fitting = sorted((effective[n], n) for n in offers
                         if short[n] is None and effective[n] != math.inf)
        not_fitting = {n: s for n, s in short.items() if s is not None}
        room_declines = {x.node_id: x.reason for x in d.declines if x.reason in NO_ROOM}
        assert len({x.node_id for x in d.declines}) == len(d.declines)
        # Every recorded shortfall is real; those ranked ahead of the winner (and of the
        # runner-up, which the tie check looks at) are all recorded, and all of them when
        # nobody fits.
        assert room_declines.keys() <= not_fitting.keys()
        assert all(_short_on(why, r, remaining[n]) for n, why in room_declines.items())
        bound = fitting[1] if len(fitting) > 1 else (math.inf, "\uffff")
        ahead = {n for n in not_fitting if (effective[n], n) < bound}
        assert ahead <= room_declines.keys()
        if fitting:
            assert isinstance(d, Awarded)
            assert (d.winner.load, d.winner.node_id) == fitting[0]
            assert d.tie_broken is (len(fitting) > 1 and fitting[1][0] == fitting[0][0])
            node = d.winner.node_id
            room = remaining[node]
            room.cpu -= r.cpu
            room.memory_mb -= r.memory_mb
            room.ports -= r.ports
            extra[node] = extra.get(node, 0.0) + offers[node][1]
        else:
            assert isinstance(d, Unschedulable)
            assert room_declines.keys() == not_fitting.keys()


@given(batches())
def test_without_free_map_only_the_steps_spread_the_batch(batch: Batch) -> None:
    """No capacity known: nothing is charged, so only effective loads decide."""
    requests, _, replies = batch
    _, shape_of = _shapes(requests)
    extra: dict[str, float] = {}
    for d, s in zip(_decide(batch, with_free=False), shape_of, strict=True):
        offers = {n: (a.load, a.step) for n, ans in replies.items() for a in ans
                  if a.shape == s and isinstance(a, Bid)}
        bids = sorted((load + extra.get(n, 0.0), n) for n, (load, _) in offers.items()
                      if load + extra.get(n, 0.0) != math.inf)
        if bids:
            assert isinstance(d, Awarded)
            assert (d.winner.load, d.winner.node_id) == bids[0]
            extra[d.winner.node_id] = extra.get(d.winner.node_id, 0.0) + offers[bids[0][1]][1]
        else:
            assert isinstance(d, Unschedulable)
        assert not any(x.reason in NO_ROOM for x in d.declines)


@given(batches(), st.randoms(use_true_random=False))
def test_a_batch_decision_is_independent_of_reply_order(batch: Batch,
                                                        rnd: random.Random) -> None:
    requests, free, replies = batch
    shuffled = list(replies.items())
    rnd.shuffle(shuffled)
    assert _decide(batch) == _decide((requests, free, dict(shuffled)))


def test_shape_answers_are_shared_by_every_decision_of_the_shape() -> None:
    """One record per shape, not per instance: the sequences are the same objects."""
    auction = Auction("a-1", _same_shape(3), ["n1", "n2", "n3"], opened_at=0.0, deadline_s=1.0)
    auction.receive(_reply("n1", [Bid(shape=0, load=0.25, step=0.25)]), 0.0)
    auction.receive(_reply("n2", [Decline(shape=0, reason=Reason.DRAINING)]), 0.0)
    a, b, c = auction.decide(1.0)
    assert a.bids is b.bids is c.bids
    assert a.silent is b.silent is c.silent
    assert list(c.silent) == ["n3"]
    assert [x.load for x in c.bids] == [0.25]  # bids as received, not effective loads
