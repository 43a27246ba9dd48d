"""The award rule: lowest load wins, ties broken by node id, independent of arrival order -
as the auction applies it (`shared.award.order` is its key; the auction is its one user)."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from gavel.shared.auction import Auction, Awarded, Decision
from gavel.shared.award import NodeBid, order
from gavel.shared.messages import Bid, BidReply, Decline, Request

# A few distinct loads so ties are common; node ids unique per draw.
loads = st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.5000000001, 1.0, 7.0])
node_ids = st.text(alphabet="abcdxyz0123-", min_size=1, max_size=6)
bid_sets = st.dictionaries(node_ids, loads, min_size=1, max_size=8).map(
    lambda d: [NodeBid(node_id=n, load=load, strategy="s") for n, load in d.items()]
)


def _expected(bids: list[NodeBid]) -> tuple[NodeBid, bool]:
    best = min(b.load for b in bids)
    at_best = sorted(b.node_id for b in bids if b.load == best)
    winner = next(b for b in bids if b.node_id == at_best[0])
    return winner, len(at_best) > 1


def pick(bids: list[NodeBid]) -> tuple[NodeBid, bool] | None:
    """The winner of a one-request auction in which `bids` arrived in this order, and
    whether the tie-break decided it."""
    request = Request(instance_id="i-1", cpu=0.5, memory_mb=64)
    auction = Auction("a-1", [request], [b.node_id for b in bids] or ["nobody"], 0.0, 2.0)
    for b in bids:
        auction.receive(BidReply(auction_id="a-1", node_id=b.node_id,
                                 answers=[Bid(shape=0, load=b.load, strategy=b.strategy)]), 0.1)
    [decision] = auction.decide(now=1.0)
    if not isinstance(decision, Awarded):
        return None
    return next(b for b in bids if b.node_id == decision.winner.node_id), decision.tie_broken


def rank(bids: list[NodeBid]) -> list[NodeBid]:
    return sorted(bids, key=order)


def test_lowest_load_wins() -> None:
    bids = [NodeBid(node_id="a", load=0.9), NodeBid(node_id="b", load=0.2),
            NodeBid(node_id="c", load=0.5)]
    assert pick(bids) == (bids[1], False)


def test_equal_loads_break_on_node_id() -> None:
    bids = [NodeBid(node_id="n2", load=0.3), NodeBid(node_id="n1", load=0.3),
            NodeBid(node_id="n3", load=0.3)]
    assert pick(bids) == (bids[1], True)


def test_tie_among_losers_is_not_a_tie_break() -> None:
    bids = [NodeBid(node_id="a", load=0.5), NodeBid(node_id="b", load=0.5),
            NodeBid(node_id="z", load=0.1)]
    assert pick(bids) == (bids[2], False)
    # ...in either order: a later, better bid clears the tie flag set by earlier equal bids.
    assert pick(list(reversed(bids))) == (bids[2], False)


def test_single_bid_is_not_tie_broken_and_no_bids_is_none() -> None:
    only = NodeBid(node_id="a", load=0.0)
    assert pick([only]) == (only, False)
    assert pick([]) is None


def test_rank_orders_by_load_then_node_id() -> None:
    bids = [NodeBid(node_id="b", load=0.5), NodeBid(node_id="a", load=0.5),
            NodeBid(node_id="c", load=0.1)]
    assert [b.node_id for b in rank(bids)] == ["c", "a", "b"]


@given(bid_sets, st.randoms(use_true_random=False))
def test_pick_is_independent_of_arrival_order(bids: list[NodeBid], rnd: random.Random) -> None:
    shuffled = list(bids)
    rnd.shuffle(shuffled)
    assert pick(shuffled) == pick(bids) == _expected(bids)
    assert rank(shuffled) == rank(bids)
    assert rank(bids)[0] == _expected(bids)[0]


@given(st.data(), bid_sets)
def test_auction_award_is_independent_of_reply_order(data: st.DataObject,
                                                     bids: list[NodeBid]) -> None:
    """The whole auction, not just `pick`: replies in any permutation give the same decision."""
    request = Request(instance_id="i-1", cpu=0.5, memory_mb=64)
    order = data.draw(st.permutations(bids))

    def run(sequence: list[NodeBid]) -> Awarded:
        auction = Auction("a-1", [request], [b.node_id for b in bids], opened_at=0.0,
                          deadline_s=2.0)
        for t, b in enumerate(sequence):
            reply = BidReply(auction_id="a-1", node_id=b.node_id,
                             answers=[Bid(shape=0, load=b.load, strategy="s")])
            assert auction.receive(reply, now=0.01 * t).value == "accepted"
        [decision] = auction.decide(now=1.0)
        assert isinstance(decision, Awarded)
        return decision

    first, second = run(bids), run(order)
    assert first == second
    winner, tied = _expected(bids)
    assert first.winner == winner
    assert first.tie_broken is tied
    assert list(first.bids) == rank(bids)


@given(st.data(), st.dictionaries(node_ids, loads | st.sampled_from(["draining", "no free ports"]),
                                  min_size=1, max_size=8))
def test_whole_decision_is_independent_of_reply_order(data: st.DataObject,
                                                      answers: dict[str, float | str]) -> None:
    """Bids, declines and silences alike: the recorded decision is the same in any order."""
    request = Request(instance_id="i-1", cpu=0.5, memory_mb=64)
    order = data.draw(st.permutations(sorted(answers)))
    silent = data.draw(st.lists(st.sampled_from(sorted(answers)), unique=True))

    def run(sequence: list[str]) -> Decision:
        auction = Auction("a-1", [request], sorted(answers), opened_at=0.0, deadline_s=2.0)
        for node in sequence:
            if node in silent:
                continue
            value = answers[node]
            ans: Bid | Decline = (Decline(shape=0, reason=value)
                                  if isinstance(value, str) else Bid(shape=0, load=value))
            auction.receive(BidReply(auction_id="a-1", node_id=node, answers=[ans]), 0.1)
        [decision] = auction.decide(now=2.0)
        return decision

    first, second = run(sorted(answers)), run(order)
    assert first == second
    assert [d.node_id for d in first.declines] == sorted(d.node_id for d in first.declines)
    assert list(first.silent) == sorted(silent)
