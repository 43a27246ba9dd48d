"""`AuctionRecord.raised`: in a round of several instances a node is ranked at its bid plus
what it already won in the round (`shared.award` rule 2), so a loser's bid, as the node sent
it, can read lower than the load the winner won at. The record names such losers, and what a
user reads says why (`gavel why`, the demo, the dashboard) - else "won at 0.27" beside a bid
of 0.13 reads as the award rule broken."""

from __future__ import annotations

from gavel.broker.auctionlog import batch_record, record
from gavel.cli.ui import views
from gavel.shared.auction import Auction, Awarded
from gavel.shared.messages import Bid, BidReply, Request
from gavel.shared.records import RAISED, Outcome, auction_trailer, parse_trailers


def _round() -> tuple[Auction, list[Awarded]]:
    """Two instances of one shape; n1 bids lowest, and its step makes it dearer once it won."""
    auction = Auction("a-1", [Request(instance_id="big", cpu=1.0, memory_mb=100),
                              Request(instance_id="small", cpu=1.0, memory_mb=100)],
                      ["n1", "n2"], opened_at=0.0, deadline_s=1.0)
    for node, load in (("n1", 0.13), ("n2", 0.27)):
        auction.receive(BidReply(auction_id="a-1", node_id=node,
                                 answers=[Bid(shape=0, load=load, step=0.5)]), 0.0)
    decisions = auction.decide(1.0)
    assert all(isinstance(d, Awarded) for d in decisions)
    return auction, [d for d in decisions if isinstance(d, Awarded)]


def test_the_node_that_won_earlier_in_the_round_is_named() -> None:
    _, (first, second) = _round()
    assert (first.winner.node_id, second.winner.node_id) == ("n1", "n2")
    assert record("a-1", first).raised() == []  # n1 won at its own bid
    later = record("a-1", second)
    assert later.load == 0.27 and {b.node_id: b.load for b in later.bids} == {
        "n1": 0.13, "n2": 0.27}
    assert later.raised() == ["n1"]


def test_the_commit_trailer_names_it_too() -> None:
    """Read back from git, as `gavel why` does for an auction the broker no longer keeps."""
    auction, decisions = _round()
    outcomes = [Outcome(instance_id=d.request.instance_id, winner=d.winner.node_id,
                        load=d.winner.load) for d in decisions]
    trailer = auction_trailer(batch_record(auction, list(decisions), outcomes))
    big, small = parse_trailers(trailer)
    assert (big.raised(), small.raised()) == ([], ["n1"])


def test_a_round_of_one_and_a_tie_raise_nobody() -> None:
    one = Auction("a-2", [Request(instance_id="x", cpu=1.0, memory_mb=100)], ["n1", "n2"],
                  opened_at=0.0, deadline_s=1.0)
    for node in ("n1", "n2"):
        one.receive(BidReply(auction_id="a-2", node_id=node,
                             answers=[Bid(shape=0, load=0.5)]), 0.0)
    (d,) = one.decide(1.0)
    assert isinstance(d, Awarded) and d.tie_broken and record("a-2", d).raised() == []


def test_the_dashboard_says_it_beside_the_bid() -> None:
    _, (_, second) = _round()
    bids = {b["node_id"]: b["raised"] for b in views.auction(record("a-1", second))["bids"]}
    assert bids == {"n1": RAISED, "n2": ""}
