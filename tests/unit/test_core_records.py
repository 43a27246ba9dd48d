"""Auction records ride in commit messages as one trailer line each, and come back intact."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.auction import Auction, Awarded
from shared.award import NodeBid, NodeDecline
from shared.messages import Bid, BidReply, Decline, InstanceState, Request, Spec
from shared.records import (
    TRAILER,
    AuctionRecord,
    InstanceRecord,
    NodeFile,
    Placement,
    auction_trailer,
    parse_trailers,
)

RECORD = AuctionRecord(
    auction_id="a-1", instance_id="i-1", winner="n2", load=0.25, tie_broken=True,
    bids=[NodeBid(node_id="n1", load=0.25, strategy="binpack"),
          NodeBid(node_id="n2", load=0.25, strategy="binpack")],
    declines=[NodeDecline(node_id="n3", reason="missing label", detail="region=eu")],
    silent=["n4"],
)


def test_trailer_is_one_line_with_the_prefix() -> None:
    line = auction_trailer(RECORD)
    assert line.startswith("Gavel-Auction: ")
    assert "\n" not in line


def test_commit_message_round_trip_keeps_order_and_ignores_other_lines() -> None:
    other = AuctionRecord(auction_id="a-1", instance_id="i-2", reason="all nodes full",
                          summary="0/3 nodes bid: 3 no free ports")
    message = "\n".join([
        "place i-1 on n2, i-2 unschedulable",
        "",
        "Gavel-Auction is the trailer below; this line only mentions it.",
        "",
        auction_trailer(RECORD),
        "Signed-off-by: broker <broker@gavel>",
        auction_trailer(other),
        "",
    ])
    assert parse_trailers(message) == [RECORD, other]
    assert parse_trailers("just a subject\n\nand a body") == []


def test_crlf_commit_messages_parse() -> None:
    message = "subject\r\n\r\n" + auction_trailer(RECORD) + "\r\n"
    assert parse_trailers(message) == [RECORD]


def test_a_decided_auction_records_round_trip() -> None:
    auction = Auction("a-7", [Request(instance_id="i-1", cpu=1.0, memory_mb=64)],
                      ["n1", "n2", "n3"], opened_at=0.0, deadline_s=1.0)
    auction.receive(BidReply(auction_id="a-7", node_id="n1",
                             answers=[Bid(instance_id="i-1", load=0.5)]), 0.1)
    auction.receive(BidReply(auction_id="a-7", node_id="n2",
                             answers=[Decline(instance_id="i-1", reason="draining")]), 0.1)
    [d] = auction.decide(1.0)
    assert isinstance(d, Awarded)
    record = AuctionRecord(auction_id="a-7", instance_id="i-1", winner=d.winner.node_id,
                           load=d.winner.load, tie_broken=d.tie_broken, bids=d.bids,
                           declines=d.declines, silent=d.silent)
    [back] = parse_trailers("award\n\n" + auction_trailer(record))
    assert back == record
    assert (back.winner, back.silent) == ("n1", ["n3"])


# Workers choose node ids and decline details; any text they send must survive the trailer,
# including characters Python's str.splitlines() treats as line breaks (U+2028, U+0085, ...).
texts = st.text(max_size=20)
node_bids = st.builds(NodeBid, node_id=texts,
                      load=st.floats(min_value=0.0, allow_nan=False, allow_infinity=False),
                      strategy=texts)
node_declines = st.builds(NodeDecline, node_id=texts, reason=texts, detail=texts)
records = st.builds(
    AuctionRecord,
    auction_id=texts, instance_id=texts, winner=texts,
    load=st.none() | st.floats(min_value=0.0, allow_nan=False, allow_infinity=False),
    tie_broken=st.booleans(),
    bids=st.lists(node_bids, max_size=4),
    declines=st.lists(node_declines, max_size=4),
    silent=st.lists(texts, max_size=4),
    reason=texts, summary=texts,
)


@given(st.lists(records, max_size=3), texts)
def test_any_record_round_trips_through_a_commit_message(batch: list[AuctionRecord],
                                                          subject: str) -> None:
    subject = subject.replace("\n", " ").replace("\r", " ")
    if subject.startswith(TRAILER):
        subject = "x" + subject
    message = subject + "\n\n" + "\n".join(auction_trailer(r) for r in batch)
    assert parse_trailers(message) == batch


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c"])
def test_unicode_line_separators_in_details_do_not_break_the_trailer(separator: str) -> None:
    record = AuctionRecord(auction_id="a-1", instance_id="i-1",
                           declines=[NodeDecline(node_id="n1", reason="draining",
                                                 detail=f"before{separator}after")])
    assert parse_trailers("subject\n\n" + auction_trailer(record)) == [record]


def test_state_files_round_trip_as_json() -> None:
    spec = Spec(name="web", command=["run"], secrets=["token"])
    node_file = NodeFile(node_id="n1", instances={
        "i-1": Placement(instance_id="i-1", spec=spec, auction_id="a-1", attempt=2,
                         ports={"http": 8080}),
    })
    assert msgspec.json.decode(msgspec.json.encode(node_file), type=NodeFile) == node_file
    rec = InstanceRecord(instance_id="i-1", spec=spec, state=InstanceState.RUNNING, attempt=1,
                         node_id="n1", excluded=["n3"])
    assert msgspec.json.decode(msgspec.json.encode(rec), type=InstanceRecord) == rec
    assert InstanceRecord(instance_id="i-2", spec=spec).state is InstanceState.QUEUED
