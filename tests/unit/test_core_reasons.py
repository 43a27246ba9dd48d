"""Reasons: rendering with details, kube-scheduler style summaries, and the main reason."""

from __future__ import annotations

import pytest

from gavel.shared.auction import Auction, Unschedulable
from gavel.shared.feasibility import NodeView
from gavel.shared.messages import BidReply, Capacity, Decline, Request
from gavel.shared.reasons import Reason, render, summarize_declines
from gavel.shared.strategies import answer, make_strategy

REQ = Request(instance_id="i-1", cpu=2.0, memory_mb=256, labels={"region": "eu"})


# -- render -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "detail", "text"),
    [
        (Reason.NO_ROOM_CPU, "2", "no room for 2 cpu"),
        (Reason.NO_ROOM_CPU, "0.5", "no room for 0.5 cpu"),
        (Reason.NO_ROOM_MEMORY, "512", "no room for 512 MB memory"),
        (Reason.MISSING_LABEL, "region=eu", "missing label region=eu"),
        (Reason.OVER_CEILING, "0.8", "utilisation above ceiling 0.8"),
        (Reason.NO_ROOM_PORTS, "", "no free ports"),
        (Reason.DRAINING, "", "draining"),
        (Reason.DRAINING, "since 10:00", "draining (since 10:00)"),
        (Reason.NO_ROOM_CPU, "", "no room for cpu"),
    ],
)
def test_render_folds_the_detail_into_the_sentence(reason: Reason, detail: str,
                                                   text: str) -> None:
    assert render(reason, detail) == text
    assert render(str(reason.value), detail) == text  # off the wire it is a plain str


# -- summarize_declines -------------------------------------------------------------------


def test_summary_counts_equal_reasons_most_frequent_first() -> None:
    reasons = ["missing label region=eu", "no room for 2 cpu", "no room for 2 cpu",
               "missing label region=eu", "no room for 2 cpu"]
    assert (summarize_declines(5, 0, reasons)
            == "0/5 nodes bid: 3 no room for 2 cpu, 2 missing label region=eu")


def test_summary_ties_are_alphabetical_whatever_the_input_order() -> None:
    a = ["no room for 1 cpu", "draining", "missing label a=b"]
    expected = "1/4 nodes bid: 1 draining, 1 missing label a=b, 1 no room for 1 cpu"
    assert summarize_declines(4, 1, a) == expected
    assert summarize_declines(4, 1, reversed(a)) == expected


def test_summary_without_reasons_is_just_the_head() -> None:
    assert summarize_declines(3, 3, []) == "3/3 nodes bid"


# -- the Unschedulable summary, end to end through feasibility ----------------------------


def _node(node_id: str, *, cpu: float = 8.0, labels: dict[str, str] | None = None,
          draining: bool = False) -> NodeView:
    return NodeView(node_id=node_id, capacity=Capacity(cpu=cpu, memory_mb=4096, ports=10),
                    labels={"region": "eu"} if labels is None else labels, draining=draining)


def _round(nodes: list[NodeView], silent: tuple[str, ...] = ()) -> Unschedulable:
    strategy = make_strategy("least-loaded")
    auction = Auction("a-1", [REQ], [n.node_id for n in nodes] + list(silent), opened_at=0.0,
                      deadline_s=1.0)
    for node in nodes:
        got = answer(strategy, REQ, node)
        assert isinstance(got, Decline)
        auction.receive(BidReply(auction_id="a-1", node_id=node.node_id, answers=[got]), 0.1)
    [decision] = auction.decide(1.0)
    assert isinstance(decision, Unschedulable)
    return decision


def test_kube_scheduler_style_summary_from_real_declines() -> None:
    nodes = [_node("n1", cpu=1.0), _node("n2", cpu=1.5), _node("n3", cpu=0.0),
             _node("n4", labels={"region": "us"}), _node("n5", labels={})]
    decision = _round(nodes)
    assert decision.summary == "0/5 nodes bid: 3 no room for 2 cpu, 2 missing label region=eu"
    assert decision.reason is Reason.NO_ROOM_CPU  # the most common one
    assert [d.node_id for d in decision.declines] == ["n1", "n2", "n3", "n4", "n5"]


def test_no_eligible_nodes_is_no_nodes() -> None:
    auction = Auction("a-1", [REQ], [], opened_at=0.0, deadline_s=1.0)
    [decision] = auction.decide(0.0)
    assert isinstance(decision, Unschedulable)
    assert decision.reason is Reason.NO_NODES
    assert decision.summary == "0/0 nodes bid: no nodes connected"


def test_all_silent_is_no_bids() -> None:
    decision = _round([], silent=("n1", "n2", "n3"))
    assert decision.reason is Reason.NO_BIDS
    assert decision.summary == "0/3 nodes bid: 3 no answer before the deadline"
    assert decision.silent == ["n1", "n2", "n3"]


def test_one_shared_reason_is_the_reason() -> None:
    decision = _round([_node("n1", draining=True), _node("n2", draining=True)])
    assert decision.reason is Reason.DRAINING
    assert decision.summary == "0/2 nodes bid: 2 draining"


def test_mixed_capacity_reasons_are_all_full() -> None:
    nodes = [
        _node("n1", cpu=1.0),                                      # no room for cpu
        NodeView(node_id="n2", capacity=Capacity(cpu=8.0, memory_mb=100, ports=10),
                 labels={"region": "eu"}),                         # no room for memory
        NodeView(node_id="n3", capacity=Capacity(cpu=8.0, memory_mb=4096, ports=0),
                 labels={"region": "eu"}),                         # ports pass: REQ needs 0
    ]
    auction = Auction("a-1", [REQ], ["n1", "n2", "n3"], opened_at=0.0, deadline_s=1.0)
    for node in nodes[:2]:
        got = answer(make_strategy("least-loaded"), REQ, node)
        auction.receive(BidReply(auction_id="a-1", node_id=node.node_id, answers=[got]), 0.1)
    ceiling = Decline(shape=0, reason=Reason.OVER_CEILING, detail="0.8")
    auction.receive(BidReply(auction_id="a-1", node_id="n3", answers=[ceiling]), 0.1)
    [decision] = auction.decide(1.0)
    assert isinstance(decision, Unschedulable)
    assert decision.reason is Reason.ALL_FULL
    assert decision.summary == ("0/3 nodes bid: 1 no room for 2 cpu, 1 no room for 256 MB memory,"
                                " 1 utilisation above ceiling 0.8")


def test_capacity_mixed_with_other_reasons_is_the_most_common() -> None:
    nodes = [_node("n1", draining=True), _node("n2", cpu=1.0), _node("n3", draining=True)]
    decision = _round(nodes, silent=("n4", "n5", "n6"))
    # Silence is in the summary but never the main reason while some node declined.
    assert decision.reason is Reason.DRAINING
    assert decision.summary == ("0/6 nodes bid: 3 no answer before the deadline, 2 draining,"
                                " 1 no room for 2 cpu")


def test_equally_common_reasons_break_alphabetically() -> None:
    nodes = [_node("n1", labels={}), _node("n2", draining=True)]
    assert _round(nodes).reason is Reason.DRAINING  # "draining" < "missing label"
    assert _round(list(reversed(nodes))).reason is Reason.DRAINING


def test_no_room_for_cpu_detail_is_the_requested_cpu() -> None:
    req = Request(instance_id="i-1", cpu=0.25, memory_mb=1)
    got = answer(make_strategy("least-loaded"), req, _node("n1", cpu=0.0, labels={}))
    assert isinstance(got, Decline)
    assert render(got.reason, got.detail) == "no room for 0.25 cpu"
