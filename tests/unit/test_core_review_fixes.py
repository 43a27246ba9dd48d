"""Regression tests for gaps a review of the core found."""

from __future__ import annotations

import msgspec
import pytest

from gavel.shared.auction import Auction, Awarded, Unschedulable, Verdict
from gavel.shared.messages import Bid, BidReply, Decline, Request, Spec
from gavel.shared.reasons import Reason


def _req(iid: str, cpu: float = 1.0) -> Request:
    return Request(instance_id=iid, cpu=cpu, memory_mb=10)


def test_partial_reply_counts_the_node_silent_for_the_skipped_shape() -> None:
    a = Auction("a", [_req("i1"), _req("i2", cpu=2.0)], ["n1", "n2", "n3"], 0.0, 1.0)
    assert a.shape_of == [0, 1]
    reply = BidReply(auction_id="a", node_id="n1", answers=[Bid(shape=0, load=0.1)])
    assert a.receive(reply, 0.1) is Verdict.ACCEPTED
    first, second = a.decide(1.0)
    assert isinstance(first, Awarded) and list(first.silent) == ["n2", "n3"]
    assert isinstance(second, Unschedulable)
    assert list(second.silent) == ["n1", "n2", "n3"]
    assert second.summary == "0/3 nodes bid: 3 no answer before the deadline"


def test_an_auction_cannot_list_an_instance_twice() -> None:
    with pytest.raises(ValueError, match="twice"):
        Auction("a", [_req("i1"), _req("i1")], ["n1"], 0.0, 1.0)


def test_a_broker_only_reason_is_not_a_valid_decline() -> None:
    a = Auction("a", [_req("i1")], ["n1"], 0.0, 1.0)
    reply = BidReply(auction_id="a", node_id="n1",
                     answers=[Decline(shape=0, reason=Reason.PINNED)])
    assert a.receive(reply, 0.1) is Verdict.BAD_REASON


def test_spec_port_names_must_be_distinct() -> None:
    with pytest.raises(msgspec.ValidationError, match="distinct"):
        msgspec.convert({"name": "x", "command": ["true"], "ports": ["http", "http"]}, Spec)
