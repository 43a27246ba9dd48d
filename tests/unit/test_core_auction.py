"""The auction state machine: completion, the deadline, and every way a reply is rejected.

Rejected replies must leave the auction exactly as it was: the same nodes answered, and the
same decisions if it were decided now.
"""

from __future__ import annotations

import copy
import math
import random

import msgspec
import pytest

from gavel.shared.auction import Auction, Awarded, Decision, Unschedulable, Verdict
from gavel.shared.award import NodeBid, NodeDecline
from gavel.shared.messages import RFB, Bid, BidReply, Capacity, Decline, Request, Shape
from gavel.shared.reasons import DECLINES, Reason

OPEN = 100.0
DEADLINE_S = 2.0
END = OPEN + DEADLINE_S
NODES = ("n1", "n2", "n3")
R1 = Request(instance_id="i-1", cpu=1.0, memory_mb=128)
R2 = Request(instance_id="i-2", cpu=0.5, memory_mb=64, ports=1)


def bid(load: float, shape: int = 0, step: float = 0.0) -> Bid:
    return Bid(shape=shape, load=load, step=step, strategy="least-loaded")


def decline(reason: str, detail: str = "", shape: int = 0) -> Decline:
    return Decline(shape=shape, reason=reason, detail=detail)


def reply(node: str, *answers: Bid | Decline, auction: str = "a-1") -> BidReply:
    return BidReply(auction_id=auction, node_id=node, answers=list(answers))


def new_auction(*requests: Request, nodes: tuple[str, ...] = NODES) -> Auction:
    return Auction("a-1", list(requests) or [R1], nodes, opened_at=OPEN, deadline_s=DEADLINE_S)


def outcome(auction: Auction, now: float = END) -> tuple[frozenset[str], float | None,
                                                         list[Decision]]:
    """Everything observable about the auction, without closing it."""
    return auction.answered, auction.closed_at, copy.deepcopy(auction).decide(now)


# -- completion ---------------------------------------------------------------------------


def test_complete_when_every_eligible_node_answered() -> None:
    auction = new_auction()
    assert not auction.done(OPEN)
    assert auction.receive(reply("n1", bid(0.4)), OPEN + 0.1) is Verdict.ACCEPTED
    assert auction.receive(reply("n2", decline(Reason.DRAINING)), OPEN + 0.2) is Verdict.ACCEPTED
    assert not auction.done(OPEN + 0.3)
    assert auction.receive(reply("n3", bid(0.2)), OPEN + 0.3) is Verdict.ACCEPTED
    assert auction.done(OPEN + 0.3)  # long before the deadline
    assert auction.answered == frozenset(NODES)
    [decision] = auction.decide(OPEN + 0.3)
    assert isinstance(decision, Awarded)
    assert decision.winner == NodeBid(node_id="n3", load=0.2, strategy="least-loaded")
    assert list(decision.silent) == []
    assert list(decision.declines) == [NodeDecline(node_id="n2", reason="draining")]


def test_complete_at_the_deadline_when_some_stay_silent() -> None:
    auction = new_auction()
    auction.receive(reply("n2", bid(0.7)), OPEN + 0.5)
    assert auction.timer() == END
    assert not auction.done(END - 1e-6)
    assert auction.done(END)
    [decision] = auction.decide(END)
    assert isinstance(decision, Awarded)
    assert decision.winner.node_id == "n2"
    assert list(decision.silent) == ["n1", "n3"]
    assert auction.done(END - 1.0)  # once decided it stays done


def test_no_eligible_nodes_is_complete_at_once() -> None:
    auction = new_auction(nodes=())
    assert auction.done(OPEN)
    [decision] = auction.decide(OPEN)
    assert isinstance(decision, Unschedulable)
    assert decision.reason is Reason.NO_NODES


def test_a_node_answers_every_shape_in_one_reply() -> None:
    auction = new_auction(R1, R2)
    verdict = auction.receive(reply("n1", bid(0.3, 0), decline(Reason.NO_ROOM_PORTS,
                                                              shape=1)), OPEN)
    assert verdict is Verdict.ACCEPTED
    first, second = auction.decide(END)
    assert isinstance(first, Awarded) and first.winner.node_id == "n1"
    assert isinstance(second, Unschedulable)
    assert list(second.declines) == [NodeDecline(node_id="n1", reason="no free ports")]


# -- late replies -------------------------------------------------------------------------


@pytest.mark.parametrize("now", [END, END + 0.001, END + 3600.0])
def test_reply_at_or_after_the_deadline_is_late_and_ignored(now: float) -> None:
    auction = new_auction()
    auction.receive(reply("n1", bid(0.5)), OPEN + 1.0)
    before = outcome(auction)
    # n2 would win if it counted.
    assert auction.receive(reply("n2", bid(0.0)), now) is Verdict.LATE
    assert outcome(auction) == before
    [decision] = auction.decide(END)
    assert isinstance(decision, Awarded) and decision.winner.node_id == "n1"


def test_reply_after_decide_is_late_even_before_the_deadline() -> None:
    auction = new_auction()
    auction.receive(reply("n1", bid(0.5)), OPEN + 0.1)
    decided = auction.decide(OPEN + 0.5)
    assert auction.closed_at == OPEN + 0.5
    assert auction.receive(reply("n2", bid(0.0)), OPEN + 0.6) is Verdict.LATE
    assert auction.answered == frozenset({"n1"})
    assert auction.decide(OPEN + 0.5) == decided


# -- rejected replies leave the state unchanged -------------------------------------------


REJECTED = [
    pytest.param(reply("n1", bid(0.0, 0), bid(0.0, 1)), Verdict.DUPLICATE,
                 id="same-node-twice"),
    pytest.param(reply("n9", bid(0.0, 0), bid(0.0, 1)), Verdict.NOT_ELIGIBLE,
                 id="not-eligible"),
    pytest.param(reply("n2", bid(0.0, 0), auction="a-2"), Verdict.WRONG_AUCTION,
                 id="wrong-auction"),
    pytest.param(reply("n2", bid(math.nan)), Verdict.BAD_LOAD, id="nan-load"),
    pytest.param(reply("n2", bid(math.inf)), Verdict.BAD_LOAD, id="inf-load"),
    pytest.param(reply("n2", bid(-math.inf)), Verdict.BAD_LOAD, id="minus-inf-load"),
    pytest.param(reply("n2", bid(-0.5)), Verdict.BAD_LOAD, id="negative-load"),
    pytest.param(reply("n2", bid(0.0, step=math.nan)), Verdict.BAD_LOAD, id="nan-step"),
    pytest.param(reply("n2", bid(0.0, step=-math.inf)), Verdict.BAD_LOAD, id="minus-inf-step"),
    pytest.param(reply("n2", decline("tired")), Verdict.BAD_REASON, id="reason-not-in-set"),
    pytest.param(reply("n2", decline("No Room For CPU")), Verdict.BAD_REASON,
                 id="reason-wrong-case"),
    pytest.param(reply("n2", decline("NO_ROOM_CPU")), Verdict.BAD_REASON,
                 id="reason-member-name-not-value"),
    pytest.param(reply("n2", bid(0.0, 2)), Verdict.UNKNOWN_REQUEST, id="shape-past-the-end"),
    pytest.param(reply("n2", bid(0.0, 9)), Verdict.UNKNOWN_REQUEST, id="shape-far-out"),
    pytest.param(reply("n2", bid(0.0, -1)), Verdict.UNKNOWN_REQUEST, id="negative-shape"),
    pytest.param(reply("n2", decline(Reason.DRAINING, shape=-1)), Verdict.UNKNOWN_REQUEST,
                 id="decline-negative-shape"),
    pytest.param(reply("n2", bid(0.0, 0), bid(0.1, 0)), Verdict.DUPLICATE,
                 id="shape-twice-in-one-reply"),
    pytest.param(reply("n2", bid(0.0, 0), decline(Reason.DRAINING, shape=0)), Verdict.DUPLICATE,
                 id="bid-and-decline-for-one-shape"),
    # A reply is all or nothing: a good first answer must not be kept when a later one is bad.
    pytest.param(reply("n2", bid(0.0, 0), bid(math.nan, 1)), Verdict.BAD_LOAD,
                 id="good-then-nan"),
    pytest.param(reply("n2", bid(0.0, 0), bid(0.0, 1, step=math.nan)), Verdict.BAD_LOAD,
                 id="good-then-nan-step"),
    pytest.param(reply("n2", bid(0.0, 0), decline("bogus", shape=1)),
                 Verdict.BAD_REASON, id="good-then-bad-reason"),
    pytest.param(reply("n2", decline(Reason.DRAINING, shape=1), bid(0.0, 7)),
                 Verdict.UNKNOWN_REQUEST, id="good-then-unknown"),
]


@pytest.mark.parametrize(("bad", "verdict"), REJECTED)
def test_rejected_reply_leaves_state_unchanged(bad: BidReply, verdict: Verdict) -> None:
    auction = new_auction(R1, R2)
    assert auction.receive(reply("n1", bid(0.5, 0), bid(0.5, 1)), OPEN) is Verdict.ACCEPTED
    before = outcome(auction)
    assert auction.receive(bad, OPEN + 0.5) is verdict
    assert outcome(auction) == before
    assert not auction.done(OPEN + 0.5)
    # n2 was not marked as answered: its real reply still counts.
    good = reply("n2", bid(0.9, 0), decline(Reason.DRAINING, shape=1))
    assert auction.receive(good, OPEN + 0.6) is Verdict.ACCEPTED
    first, second = auction.decide(END)
    assert isinstance(first, Awarded) and isinstance(second, Awarded)
    assert [b.node_id for b in first.bids] == ["n1", "n2"]
    assert [b.load for b in first.bids] == [0.5, 0.9]
    assert list(second.declines) == [NodeDecline(node_id="n2", reason="draining")]


def test_every_worker_decline_reason_is_accepted() -> None:
    worker_reasons = [Reason.NO_ROOM_CPU, Reason.NO_ROOM_MEMORY, Reason.NO_ROOM_PORTS,
                      Reason.MISSING_LABEL, Reason.DRAINING, Reason.OVER_CEILING]
    nodes = tuple(f"n{i}" for i in range(len(worker_reasons)))
    auction = new_auction(nodes=nodes)
    for node, reason in zip(nodes, worker_reasons, strict=True):
        # As it arrives off the wire: a plain str, not the enum member.
        assert auction.receive(reply(node, decline(str(reason.value))), OPEN) is Verdict.ACCEPTED
    assert auction.done(OPEN)


def test_zero_load_is_a_valid_bid() -> None:
    auction = new_auction()
    assert auction.receive(reply("n1", bid(0.0)), OPEN) is Verdict.ACCEPTED
    assert auction.receive(reply("n2", bid(-0.0)), OPEN) is Verdict.ACCEPTED


@pytest.mark.parametrize("step", [0.0, 0.25, -0.25, math.inf, 1e300])
def test_any_step_but_nan_and_minus_inf_is_accepted(step: float) -> None:
    auction = new_auction()
    assert auction.receive(reply("n1", bid(0.5, step=step)), OPEN) is Verdict.ACCEPTED
    [decision] = auction.decide(END)
    assert isinstance(decision, Awarded)
    assert decision.winner == NodeBid(node_id="n1", load=0.5, strategy="least-loaded")


# -- asking per shape ---------------------------------------------------------------------


def test_an_auction_asks_once_per_distinct_shape() -> None:
    small = [Request(instance_id=f"s-{k}", cpu=0.5, memory_mb=64) for k in range(60)]
    big = [Request(instance_id=f"b-{k}", cpu=2.0, memory_mb=512, ports=1,
                   labels={"region": "eu"}) for k in range(40)]
    # Interleaved: shape indices follow first appearance, not grouping.
    requests = [r for pair in zip(big, small, strict=False) for r in pair] + small[40:]
    assert len(requests) == 100
    auction = Auction("a-1", requests, NODES, opened_at=OPEN, deadline_s=DEADLINE_S)
    rfb = auction.rfb()
    assert rfb == RFB(auction_id="a-1",
                      shapes=[Shape(cpu=2.0, memory_mb=512, ports=1, labels={"region": "eu"}),
                              Shape(cpu=0.5, memory_mb=64)],
                      deadline_s=DEADLINE_S, counts=[40, 60])
    assert auction.shapes == rfb.shapes
    assert auction.shape_of == [0, 1] * 40 + [1] * 20
    # No instance id crosses the wire: a bidder sees shapes only.
    assert "instance_id" not in msgspec.to_builtins(rfb)["shapes"][0]


def test_one_answer_per_shape_covers_every_instance_of_it() -> None:
    requests = [Request(instance_id=f"i-{k}", cpu=0.5, memory_mb=64) for k in range(5)]
    auction = Auction("a-1", requests, ("n1", "n2"), opened_at=OPEN, deadline_s=DEADLINE_S)
    assert auction.rfb().counts == [5]
    assert auction.receive(reply("n1", bid(0.2)), OPEN) is Verdict.ACCEPTED
    assert auction.receive(reply("n2", decline(Reason.DRAINING)), OPEN) is Verdict.ACCEPTED
    assert auction.done(OPEN)
    decisions = auction.decide(OPEN)
    assert [d.request.instance_id for d in decisions] == [r.instance_id for r in requests]
    for d in decisions:
        assert isinstance(d, Awarded) and d.winner.node_id == "n1"
        assert list(d.declines) == [NodeDecline(node_id="n2", reason="draining")]
    assert auction.bid_counts() == {"least-loaded": 1}
    assert auction.decline_counts() == {"draining": 1}


def test_shapes_are_equal_whatever_the_label_order() -> None:
    a = Request(instance_id="i-1", cpu=1.0, memory_mb=64, labels={"zone": "b", "region": "eu"})
    b = Request(instance_id="i-2", cpu=1.0, memory_mb=64, labels={"region": "eu", "zone": "b"})
    c = Request(instance_id="i-3", cpu=1.0, memory_mb=64, labels={"region": "eu"})
    assert a.key() == b.key() != c.key()
    assert a.shape() == Shape(cpu=1.0, memory_mb=64, labels={"region": "eu", "zone": "b"})
    auction = new_auction(a, b, c)
    assert auction.shape_of == [0, 0, 1]
    assert auction.rfb().counts == [2, 1]


def test_an_auction_of_one_request_asks_for_its_shape() -> None:
    rfb = new_auction(R2).rfb()
    assert rfb.shapes == [R2.shape()] and rfb.counts == [1]
    assert rfb.deadline_s == DEADLINE_S


# -- one request, one walk (`shared.award` rule 5) ------------------------------------------


@pytest.mark.parametrize("seed", range(300))
def test_one_request_is_decided_as_the_batch_rule_decides_it(seed: int) -> None:
    """Winner, tie, declines (with those passed over for want of room), silent and the
    unschedulable reason of the award rule's walk are its heap's, over random rounds with
    ties."""
    rng = random.Random(seed)
    nodes = tuple(f"n{i}" for i in range(rng.randrange(0, 9)))
    request = Request(instance_id="i-1", cpu=rng.choice([0.5, 1.0, 2.0]), memory_mb=256)
    auction = new_auction(request, nodes=nodes)
    free: dict[str, Capacity] = {}
    for node in nodes:
        kind = rng.random()
        if kind < 0.55:
            auction.receive(reply(node, bid(rng.choice([0.1, 0.2, 0.2, 0.5]),
                                            step=rng.choice([0.0, -0.1, 0.1]))), OPEN)
        elif kind < 0.8:
            auction.receive(reply(node, decline(rng.choice(sorted(DECLINES)))), OPEN)
        if rng.random() < 0.5:
            free[node] = Capacity(cpu=rng.choice([0.0, 0.5, 4.0]),
                                  memory_mb=rng.choice([128, 4096]))
    general = copy.deepcopy(auction)
    walked = auction._round(free, {}, {}).award(request, 0)
    heaped = general._round(free, {}, {})
    heaped.extra["~no-node"] = 0.0  # as if the round had awarded: the heap from the start
    assert walked == heaped.award(request, 0)
    assert copy.deepcopy(general).decide(END, free) == [walked]
