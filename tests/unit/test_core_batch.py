"""Batch awards: one auction, many requests, and no node is ever promised more than it has.

`decide(now, free=...)` charges each award against the winner's free capacity before the
next request is awarded; a bidder that no longer fits is recorded as a no-room decline.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.auction import Auction, Awarded, Unschedulable
from shared.award import NodeDecline
from shared.messages import Bid, BidReply, Capacity, Decline, Request
from shared.reasons import Reason

TOL = 1e-6
NO_ROOM = {Reason.NO_ROOM_CPU, Reason.NO_ROOM_MEMORY, Reason.NO_ROOM_PORTS}


def _reply(node: str, answers: list[Bid | Decline]) -> BidReply:
    return BidReply(auction_id="a-1", node_id=node, answers=answers)


def test_second_award_goes_elsewhere_when_the_first_filled_the_best_node() -> None:
    r1 = Request(instance_id="i-1", cpu=2.0, memory_mb=100)
    r2 = Request(instance_id="i-2", cpu=2.0, memory_mb=100)
    auction = Auction("a-1", [r1, r2], ["n1", "n2"], opened_at=0.0, deadline_s=1.0)
    for node, load in (("n1", 0.1), ("n2", 0.2)):
        answers: list[Bid | Decline] = [Bid(instance_id=r.instance_id, load=load)
                                        for r in (r1, r2)]
        auction.receive(_reply(node, answers), 0.0)
    free = {"n1": Capacity(cpu=3.0, memory_mb=1000, ports=5),
            "n2": Capacity(cpu=2.0, memory_mb=1000, ports=5)}
    first, second = auction.decide(0.5, free=free)
    assert isinstance(first, Awarded) and first.winner.node_id == "n1"
    assert isinstance(second, Awarded) and second.winner.node_id == "n2"
    assert second.declines == [NodeDecline(node_id="n1", reason="no room for cpu", detail="2")]
    # The caller's map is not consumed.
    assert free["n1"] == Capacity(cpu=3.0, memory_mb=1000, ports=5)


def test_batch_that_fills_every_node_is_unschedulable_with_no_room() -> None:
    reqs = [Request(instance_id=f"i-{k}", cpu=1.0, memory_mb=512, ports=1) for k in range(3)]
    auction = Auction("a-1", reqs, ["n1", "n2"], opened_at=0.0, deadline_s=1.0)
    for node in ("n1", "n2"):
        auction.receive(_reply(node, [Bid(instance_id=r.instance_id, load=0.5) for r in reqs]),
                        0.0)
    free = {"n1": Capacity(cpu=8.0, memory_mb=600, ports=4),   # memory runs out
            "n2": Capacity(cpu=8.0, memory_mb=4096, ports=1)}  # ports run out
    a, b, c = auction.decide(1.0, free=free)
    assert isinstance(a, Awarded) and a.winner.node_id == "n1" and a.tie_broken
    assert isinstance(b, Awarded) and b.winner.node_id == "n2" and not b.tie_broken
    assert isinstance(c, Unschedulable)
    assert c.declines == [NodeDecline(node_id="n1", reason="no room for memory", detail="512"),
                          NodeDecline(node_id="n2", reason="no free ports")]
    assert c.reason is Reason.ALL_FULL
    assert c.summary == "0/2 nodes bid: 1 no free ports, 1 no room for 512 MB memory"


# -- property: never over-commit ----------------------------------------------------------

NODE_IDS = ["n0", "n1", "n2", "n3", "n4"]

capacities = st.builds(
    Capacity,
    cpu=st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]),
    memory_mb=st.sampled_from([0, 64, 128, 256, 1024]),
    ports=st.integers(0, 3),
)


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[Request], dict[str, Capacity],
                                      dict[str, list[Bid | Decline]]]:
    n_nodes = draw(st.integers(1, len(NODE_IDS)))
    nodes = NODE_IDS[:n_nodes]
    requests = [
        Request(
            instance_id=f"i-{k}",
            cpu=draw(st.sampled_from([0.1, 0.25, 0.5, 1.0, 1.5])),
            memory_mb=draw(st.sampled_from([16, 32, 64, 128])),
            ports=draw(st.integers(0, 1)),
        )
        for k in range(draw(st.integers(1, 8)))
    ]
    free = {n: draw(capacities) for n in nodes}
    replies: dict[str, list[Bid | Decline]] = {}
    for node in nodes:
        if draw(st.integers(0, 9)) == 0:
            continue  # silent
        answers: list[Bid | Decline] = []
        for r in requests:
            if draw(st.integers(0, 7)) == 0:
                answers.append(Decline(instance_id=r.instance_id, reason=Reason.DRAINING))
            else:
                load = draw(st.sampled_from([0.0, 0.2, 0.5, 0.9]))
                answers.append(Bid(instance_id=r.instance_id, load=load))
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


@settings(max_examples=300)
@given(batches())
def test_decide_never_over_commits_a_node(
    batch: tuple[list[Request], dict[str, Capacity], dict[str, list[Bid | Decline]]],
) -> None:
    requests, free, replies = batch
    auction = Auction("a-1", requests, list(free), opened_at=0.0, deadline_s=1.0)
    for node, answers in replies.items():
        assert auction.receive(_reply(node, answers), 0.5).value == "accepted"
    decisions = auction.decide(1.0, free=free)
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

    # 2. Greedy in request order: the winner is the best bid that still fits, every bidder that
    #    did not fit is a no-room decline, and a request is only unschedulable if none fit.
    remaining = {n: Capacity(cpu=c.cpu, memory_mb=c.memory_mb, ports=c.ports)
                 for n, c in free.items()}
    for d in decisions:
        r = d.request
        bids = {n: a.load for n, ans in replies.items() for a in ans
                if a.instance_id == r.instance_id and isinstance(a, Bid)}
        short = {n: _shortfall(r, remaining[n]) for n in bids}
        fitting = sorted((load, n) for n, load in bids.items() if short[n] is None)
        room_declines = {x.node_id: x.reason for x in d.declines if x.reason in NO_ROOM}
        assert room_declines == {n: s for n, s in short.items() if s is not None}
        if fitting:
            assert isinstance(d, Awarded)
            assert (d.winner.load, d.winner.node_id) == fitting[0]
            assert d.tie_broken is (sum(1 for load, _ in fitting if load == fitting[0][0]) > 1)
            room = remaining[d.winner.node_id]
            room.cpu -= r.cpu
            room.memory_mb -= r.memory_mb
            room.ports -= r.ports
        else:
            assert isinstance(d, Unschedulable)


@given(batches())
def test_without_free_map_every_request_goes_to_its_best_bid(
    batch: tuple[list[Request], dict[str, Capacity], dict[str, list[Bid | Decline]]],
) -> None:
    """No capacity known: nothing is charged, so the batch is just per-request best bids."""
    requests, free, replies = batch
    auction = Auction("a-1", requests, list(free), opened_at=0.0, deadline_s=1.0)
    for node, answers in replies.items():
        auction.receive(_reply(node, answers), 0.5)
    for d in auction.decide(1.0):
        bids = sorted((a.load, n) for n, ans in replies.items() for a in ans
                      if a.instance_id == d.request.instance_id and isinstance(a, Bid))
        if bids:
            assert isinstance(d, Awarded)
            assert (d.winner.load, d.winner.node_id) == bids[0]
        else:
            assert isinstance(d, Unschedulable)
        assert not any(x.reason in NO_ROOM for x in d.declines)
