"""The auction state machine: completion, the deadline, and every way a reply is rejected.

Rejected replies must leave the auction exactly as it was: the same nodes answered, and the
same decisions if it were decided now.
"""

from __future__ import annotations

import copy
import math

import pytest

from shared.auction import Auction, Awarded, Decision, Unschedulable, Verdict
from shared.award import NodeBid, NodeDecline
from shared.messages import Bid, BidReply, Decline, Request
from shared.reasons import Reason

OPEN = 100.0
DEADLINE_S = 2.0
END = OPEN + DEADLINE_S
NODES = ("n1", "n2", "n3")
R1 = Request(instance_id="i-1", cpu=1.0, memory_mb=128)
R2 = Request(instance_id="i-2", cpu=0.5, memory_mb=64, ports=1)


def bid(load: float, instance: str = "i-1") -> Bid:
    return Bid(instance_id=instance, load=load, strategy="least-loaded")


def decline(reason: str, detail: str = "", instance: str = "i-1") -> Decline:
    return Decline(instance_id=instance, reason=reason, detail=detail)


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
    assert decision.silent == []
    assert decision.declines == [NodeDecline(node_id="n2", reason="draining")]


def test_complete_at_the_deadline_when_some_stay_silent() -> None:
    auction = new_auction()
    auction.receive(reply("n2", bid(0.7)), OPEN + 0.5)
    assert auction.timer() == END
    assert not auction.done(END - 1e-6)
    assert auction.done(END)
    [decision] = auction.decide(END)
    assert isinstance(decision, Awarded)
    assert decision.winner.node_id == "n2"
    assert decision.silent == ["n1", "n3"]
    assert auction.done(END - 1.0)  # once decided it stays done


def test_no_eligible_nodes_is_complete_at_once() -> None:
    auction = new_auction(nodes=())
    assert auction.done(OPEN)
    [decision] = auction.decide(OPEN)
    assert isinstance(decision, Unschedulable)
    assert decision.reason is Reason.NO_NODES


def test_a_node_answers_every_request_in_one_reply() -> None:
    auction = new_auction(R1, R2)
    verdict = auction.receive(reply("n1", bid(0.3, "i-1"), decline(Reason.NO_ROOM_PORTS,
                                                                  instance="i-2")), OPEN)
    assert verdict is Verdict.ACCEPTED
    first, second = auction.decide(END)
    assert isinstance(first, Awarded) and first.winner.node_id == "n1"
    assert isinstance(second, Unschedulable)
    assert second.declines == [NodeDecline(node_id="n1", reason="no free ports")]


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
    pytest.param(reply("n1", bid(0.0, "i-1"), bid(0.0, "i-2")), Verdict.DUPLICATE,
                 id="same-node-twice"),
    pytest.param(reply("n9", bid(0.0, "i-1"), bid(0.0, "i-2")), Verdict.NOT_ELIGIBLE,
                 id="not-eligible"),
    pytest.param(reply("n2", bid(0.0, "i-1"), auction="a-2"), Verdict.WRONG_AUCTION,
                 id="wrong-auction"),
    pytest.param(reply("n2", bid(math.nan)), Verdict.BAD_LOAD, id="nan-load"),
    pytest.param(reply("n2", bid(math.inf)), Verdict.BAD_LOAD, id="inf-load"),
    pytest.param(reply("n2", bid(-math.inf)), Verdict.BAD_LOAD, id="minus-inf-load"),
    pytest.param(reply("n2", bid(-0.5)), Verdict.BAD_LOAD, id="negative-load"),
    pytest.param(reply("n2", decline("tired")), Verdict.BAD_REASON, id="reason-not-in-set"),
    pytest.param(reply("n2", decline("No Room For CPU")), Verdict.BAD_REASON,
                 id="reason-wrong-case"),
    pytest.param(reply("n2", decline("NO_ROOM_CPU")), Verdict.BAD_REASON,
                 id="reason-member-name-not-value"),
    pytest.param(reply("n2", bid(0.0, "i-9")), Verdict.UNKNOWN_REQUEST, id="unknown-instance"),
    pytest.param(reply("n2", bid(0.0, "i-1"), bid(0.1, "i-1")), Verdict.DUPLICATE,
                 id="instance-twice-in-one-reply"),
    # A reply is all or nothing: a good first answer must not be kept when a later one is bad.
    pytest.param(reply("n2", bid(0.0, "i-1"), bid(math.nan, "i-2")), Verdict.BAD_LOAD,
                 id="good-then-nan"),
    pytest.param(reply("n2", bid(0.0, "i-1"), decline("bogus", instance="i-2")),
                 Verdict.BAD_REASON, id="good-then-bad-reason"),
    pytest.param(reply("n2", decline(Reason.DRAINING, instance="i-2"), bid(0.0, "i-7")),
                 Verdict.UNKNOWN_REQUEST, id="good-then-unknown"),
]


@pytest.mark.parametrize(("bad", "verdict"), REJECTED)
def test_rejected_reply_leaves_state_unchanged(bad: BidReply, verdict: Verdict) -> None:
    auction = new_auction(R1, R2)
    assert auction.receive(reply("n1", bid(0.5, "i-1"), bid(0.5, "i-2")), OPEN) is Verdict.ACCEPTED
    before = outcome(auction)
    assert auction.receive(bad, OPEN + 0.5) is verdict
    assert outcome(auction) == before
    assert not auction.done(OPEN + 0.5)
    # n2 was not marked as answered: its real reply still counts.
    good = reply("n2", bid(0.9, "i-1"), decline(Reason.DRAINING, instance="i-2"))
    assert auction.receive(good, OPEN + 0.6) is Verdict.ACCEPTED
    first, second = auction.decide(END)
    assert isinstance(first, Awarded) and isinstance(second, Awarded)
    assert [b.node_id for b in first.bids] == ["n1", "n2"]
    assert [b.load for b in first.bids] == [0.5, 0.9]
    assert second.declines == [NodeDecline(node_id="n2", reason="draining")]


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
