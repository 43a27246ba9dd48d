"""Preemption as a bid, in memory: the node's choice of victims (`shared.preemption`), the
offer `answer` sends, the auction's check of it and the award's order over offers."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gavel.cli.specfile import SpecError, load_spec
from gavel.shared.auction import Auction, Awarded, Unschedulable, Verdict
from gavel.shared.feasibility import NodeView
from gavel.shared.messages import Bid, BidReply, Capacity, Decline, Request, Shape, Victim
from gavel.shared.preemption import GAP, displaceable, victims
from gavel.shared.reasons import Reason, preempted_by, render
from gavel.shared.reauction import Outcome, Room, judge
from gavel.shared.strategies import answer, make_strategy

CAP = Capacity(cpu=4.0, memory_mb=1000, ports=10)


def vic(iid: str, priority: int, cpu: float = 1.0, memory_mb: int = 100) -> Victim:
    return Victim(instance_id=iid, priority=priority, cpu=cpu, memory_mb=memory_mb)


def full(*residents: Victim) -> NodeView:
    committed = Capacity()
    for r in residents:
        committed.charge(r)
    return NodeView(node_id="n1", capacity=CAP, committed=committed, residents=residents)


def shape(cpu: float, priority: int, memory_mb: int = 100) -> Shape:
    return Shape(cpu=cpu, memory_mb=memory_mb, priority=priority)


# -- the gap ---------------------------------------------------------------------------------


def test_never_equal_or_higher_and_the_gap_holds() -> None:
    assert GAP == 10
    assert displaceable(60, 50) and displaceable(100, 1)
    assert not displaceable(59, 50) and not displaceable(50, 50) and not displaceable(40, 50)


# -- the node's choice -----------------------------------------------------------------------


def test_fewest_victims_first_then_lowest_priority() -> None:
    node = full(vic("a", 10), vic("b", 10), vic("big", 40, cpu=2.0))
    # Two cpu are needed: one instance of priority 40 beats two of priority 10.
    assert [v.instance_id for v in victims(shape(2.0, 80), node) or []] == ["big"]
    node = full(vic("a", 30, cpu=2.0), vic("b", 20, cpu=2.0))
    assert [v.instance_id for v in victims(shape(2.0, 80), node) or []] == ["b"]


def test_only_work_below_the_gap_and_none_when_not_enough() -> None:
    node = full(vic("low", 20), vic("near", 75), vic("high", 90), vic("mid", 50))
    assert [v.instance_id for v in victims(shape(1.0, 80), node) or []] == ["low"]
    assert [v.instance_id for v in victims(shape(2.0, 80), node) or []] == ["low", "mid"]
    assert victims(shape(3.0, 80), node) is None  # near and high may not go
    assert [v.instance_id for v in victims(shape(1.0, 30), node) or []] == ["low"]
    assert victims(shape(1.0, 29), node) is None  # low is 20: not 10 below 29


def test_a_default_priority_fleet_never_preempts() -> None:
    node = full(*(vic(f"i{k}", 50) for k in range(4)))
    assert victims(shape(1.0, 50), node) is None
    assert answer(make_strategy("least-loaded"), shape(1.0, 50), node) == Decline(
        shape=0, reason=Reason.NO_ROOM_CPU, detail="1")


def test_the_greedy_search_beyond_the_exact_one_still_makes_room() -> None:
    many = [vic(f"i{k:03}", 10 + k % 7, cpu=0.04, memory_mb=10) for k in range(100)]
    node = full(*many)
    chosen = victims(shape(0.2, 90, memory_mb=50), node) or []
    freed = sum(v.cpu for v in chosen)
    assert len(chosen) == 5 and freed >= 0.2 - 1e-9
    assert all(v.priority == 10 for v in chosen[:2])


# -- the offer on the wire -------------------------------------------------------------------


def test_a_full_node_declines_with_its_offer_priced_as_it_would_be() -> None:
    node = full(vic("low", 20, cpu=2.0, memory_mb=500), vic("other", 50, cpu=2.0))
    got = answer(make_strategy("least-loaded"), shape(1.0, 70), node, 3)
    assert isinstance(got, Decline) and got.reason == Reason.NO_ROOM_CPU and got.shape == 3
    assert [v.instance_id for v in got.evict] == ["low"]
    # least-loaded bids utilisation once "low" is gone: cpu 2/4, memory 100/1000
    assert got.evict_load == pytest.approx((0.5 + 0.1) / 2)


def test_no_offer_for_what_stopping_work_cannot_give() -> None:
    node = msgspec.structs.replace(full(vic("low", 10, cpu=4.0)), draining=True)
    got = answer(make_strategy("least-loaded"), shape(1.0, 90), node)
    assert got == Decline(shape=0, reason=Reason.DRAINING)
    labelled = Shape(cpu=1.0, memory_mb=10, priority=90, labels={"zone": "a"})
    got = answer(make_strategy("least-loaded"), labelled, full(vic("low", 10, cpu=4.0)))
    assert isinstance(got, Decline) and not got.evict


def test_the_reason_reads_as_the_issue_says() -> None:
    assert render(Reason.PREEMPTED, preempted_by("urgent-1", 80)) == \
        "preempted by urgent-1 (priority 80)"


# -- the auction and the award ---------------------------------------------------------------


def offer(load: float, *evict: Victim, shape_: int = 0) -> Decline:
    return Decline(shape=shape_, reason=Reason.NO_ROOM_CPU, detail="1", evict=list(evict),
                   evict_load=load)


def decide(requests: list[Request], answers: dict[str, list[Bid | Decline]],
           free: dict[str, Capacity] | None = None) -> list[Awarded | Unschedulable]:
    auction = Auction("a", requests, sorted(answers), opened_at=0.0, deadline_s=1.0)
    for node, got in answers.items():
        assert auction.receive(BidReply(auction_id="a", node_id=node, answers=got),
                               0.1) is Verdict.ACCEPTED
    return auction.decide(1.0, free or {})


URGENT = Request(instance_id="u", cpu=1.0, memory_mb=100, priority=80)


def test_an_ordinary_bid_always_beats_an_offer() -> None:
    [d] = decide([URGENT], {"n1": [offer(0.0, vic("x", 10))],
                            "n2": [Bid(shape=0, load=0.9)]})
    assert isinstance(d, Awarded) and d.winner.node_id == "n2" and not d.displaced


@pytest.mark.parametrize(("answers", "winner"), [
    # fewest evictions first, whatever their priority and price
    ({"n1": [offer(0.1, vic("a", 10), vic("b", 10))], "n2": [offer(0.9, vic("c", 60))]},
     "n2"),
    # then the lowest total priority evicted
    ({"n1": [offer(0.1, vic("a", 40))], "n2": [offer(0.9, vic("c", 30))]}, "n2"),
    # then the price
    ({"n1": [offer(0.5, vic("a", 30))], "n2": [offer(0.4, vic("c", 30))]}, "n2"),
    # then the node id
    ({"n2": [offer(0.4, vic("a", 30))], "n1": [offer(0.4, vic("c", 30))]}, "n1"),
])
def test_the_cheapest_displacement_wins(answers: dict[str, list[Bid | Decline]],
                                        winner: str) -> None:
    [d] = decide([URGENT], answers)
    assert isinstance(d, Awarded) and d.winner.node_id == winner and d.displaced
    assert d.winner.load == next(o.load for o in d.offers if o.node_id == winner)
    assert d.offers[0].node_id == winner


def test_an_offer_whose_freed_room_does_not_fit_is_passed_over() -> None:
    free = {"n1": Capacity(cpu=0.0, memory_mb=0), "n2": Capacity(cpu=0.5, memory_mb=100)}
    [d] = decide([URGENT], {"n1": [offer(0.1, vic("a", 10, cpu=0.5))],
                            "n2": [offer(0.9, vic("b", 10, cpu=0.5))]}, free)
    assert isinstance(d, Awarded) and d.winner.node_id == "n2"


def test_a_node_displaces_for_one_request_of_a_round() -> None:
    two = [URGENT, Request(instance_id="v", cpu=1.0, memory_mb=100, priority=80)]
    d1, d2 = decide(two, {"n1": [offer(0.1, vic("a", 10))], "n2": [offer(0.5, vic("b", 10))]})
    assert isinstance(d1, Awarded) and isinstance(d2, Awarded)
    assert (d1.winner.node_id, d2.winner.node_id) == ("n1", "n2")
    [d1, d2] = decide(two, {"n1": [offer(0.1, vic("a", 10))]})
    assert isinstance(d1, Awarded) and isinstance(d2, Unschedulable)


def test_an_offer_that_breaks_the_gap_is_refused_whole() -> None:
    auction = Auction("a", [URGENT], ["n1"], opened_at=0.0, deadline_s=1.0)
    for bad in (offer(0.1, vic("x", 75)), offer(float("nan"), vic("x", 10)),
                offer(0.1, vic("x", 10), vic("x", 10))):
        got = auction.receive(BidReply(auction_id="a", node_id="n1", answers=[bad]), 0.1)
        assert got is Verdict.BAD_OFFER
    [d] = auction.decide(1.0)
    assert isinstance(d, Unschedulable)


def test_priority_is_one_to_a_hundred(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    for bad in (0, 101):
        path.write_text(f'{{"name": "job", "command": ["true"], "priority": {bad}}}')
        with pytest.raises(SpecError, match="field 'priority'"):
            load_spec(path)
    path.write_text('{"name": "job", "command": ["true"]}')
    assert load_spec(path).priority == 50
    assert Request.of("job-1", load_spec(path)).priority == 50



def test_a_re_auction_never_moves_work_by_preempting() -> None:
    [d] = decide([URGENT], {"n1": [offer(0.0, vic("x", 10))], "n2": [offer(0.1, vic("y", 10))]})
    assert isinstance(d, Awarded) and d.displaced
    room = Room(capacity=CAP, committed=Capacity(cpu=1.0, memory_mb=100))
    assert judge(URGENT, "n2", d, margin=0.05, holder_room=room).outcome is Outcome.NO_BIDS
