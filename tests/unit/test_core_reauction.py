"""Re-auction's rules (`shared.reauction`), in memory: who may move, the bounds, the
hysteresis and when a move pays."""

from __future__ import annotations

import math
import random

from gavel.shared.feasibility import NodeView
from gavel.shared.messages import Bid, Capacity, Decline, Request, Shape
from gavel.shared.reauction import (
    Budget,
    Holding,
    Not,
    Outcome,
    Room,
    Settings,
    choose,
    decide,
    judge,
    keep_view,
    refusal,
)
from gavel.shared.spread import Tally
from gavel.shared.strategies import answer, make_strategy

S = Settings(cooldown_s=100.0, sample=4, budget=3, margin=0.05)
NOW = 1000.0


def _h(iid: str = "a", *, kind: str = "service", group: str = "web", node: str = "n1",
       **kw: object) -> Holding:
    return Holding(instance_id=iid, node_id=node, kind=kind, group=group, **kw)  # type: ignore[arg-type]


# -- rule 1 --------------------------------------------------------------------------------
def test_service_replicas_may_move_jobs_and_system_instances_may_not() -> None:
    assert refusal(_h(), NOW, S) is None
    assert refusal(_h(kind="job", group=""), NOW, S) is Not.KIND
    assert refusal(_h(kind="system"), NOW, S) is Not.KIND


def test_a_spec_opts_in_or_pins() -> None:
    assert refusal(_h(kind="job", group="", move=True), NOW, S) is None
    assert refusal(_h(volumes=True), NOW, S) is Not.VOLUMES
    assert refusal(_h(volumes=True, move=True), NOW, S) is None
    assert refusal(_h(move=False), NOW, S) is Not.PINNED
    assert refusal(_h(kind="system", move=False), NOW, S) is Not.PINNED


def test_cool_down_draining_and_max_parallel() -> None:
    assert refusal(_h(placed_at=NOW - 99.0), NOW, S) is Not.COOLING
    assert refusal(_h(placed_at=NOW - 100.0), NOW, S) is None
    assert refusal(_h(), NOW, S, draining=True) is Not.DRAINING
    assert refusal(_h(max_parallel=2), NOW, S, in_flight=1) is None
    assert refusal(_h(max_parallel=2), NOW, S, in_flight=2) is Not.PARALLEL


# -- rule 2 --------------------------------------------------------------------------------
def test_budget_is_a_sliding_minute() -> None:
    b = Budget(2)
    assert b.left(0.0) == 2
    b.spend(0.0)
    b.spend(30.0)
    assert b.left(59.9) == 0
    assert b.left(60.0) == 1
    assert b.left(90.0) == 2


def test_choose_takes_the_preferred_first_then_draws_within_the_sample() -> None:
    holdings = [_h(f"i{k}", group=f"s{k}") for k in range(50)]
    got = choose(holdings, NOW, S, Budget(3), random.Random(1), prefer=[7, 3])
    assert [h.instance_id for h in got[:2]] == ["i7", "i3"]
    assert len(got) == S.sample
    again = choose(holdings, NOW, S, Budget(3), random.Random(1), prefer=[7, 3])
    assert got == again  # the same seed draws the same candidates


def test_choose_counts_each_service_against_its_max_parallel() -> None:
    holdings = [_h(f"i{k}", group="web", max_parallel=2) for k in range(10)]
    got = choose(holdings, NOW, S, Budget(3), random.Random(2), in_flight={"web": 1})
    assert len(got) == 1
    assert choose(holdings, NOW, S, Budget(3), random.Random(2), in_flight={"web": 2}) == []


def test_choose_leaves_refused_instances_and_stops_when_the_budget_is_spent() -> None:
    holdings = [_h("j", kind="job", group=""), _h("d", node="n9"), _h("ok")]
    got = choose(holdings, NOW, S, Budget(3), random.Random(3), draining={"n9"})
    assert [h.instance_id for h in got] == ["ok"]
    spent = Budget(1)
    spent.spend(NOW)
    assert choose(holdings, NOW, S, spent, random.Random(3)) == []


# -- rules 3-5 -----------------------------------------------------------------------------
CAP = Capacity(cpu=8.0, memory_mb=8192, ports=10)
REQ = Request(instance_id="web-1", cpu=2.0, memory_mb=2048)
BINPACK = make_strategy("binpack")
LEAST = make_strategy("least-loaded")


def _view(node: str, used: float, labels: dict[str, str] | None = None) -> NodeView:
    return NodeView(node_id=node, capacity=CAP, labels=labels or {},
                    committed=Capacity(cpu=8.0 * used, memory_mb=int(8192 * used)))


def _room(view: NodeView) -> Room:
    return Room(view.capacity, view.committed, view.labels)


def _round(holder: NodeView, others: list[NodeView], strategy: object = BINPACK,
           request: Request = REQ, **kw: object) -> tuple[Outcome, str]:
    answers: list[tuple[str, Bid | Decline]] = [
        (holder.node_id, answer(strategy, request, keep_view(holder, request)))]  # type: ignore[arg-type]
    answers += [(v.node_id, answer(strategy, request, v)) for v in others]  # type: ignore[arg-type]
    decision = decide("re-1", request, answers, NOW)
    winner = next((v for v in others if v.node_id == getattr(
        getattr(decision, "winner", None), "node_id", "")), None)
    got = judge(request, holder.node_id, decision, margin=0.05, holder_room=_room(holder),
                winner_room=_room(winner) if winner else None, **kw)  # type: ignore[arg-type]
    return got.outcome, got.winner


def test_keep_view_prices_the_holder_without_the_instance() -> None:
    view = _view("n1", 0.5)
    assert keep_view(view, REQ).committed == Capacity(cpu=2.0, memory_mb=2048)
    assert keep_view(_view("n1", 0.0), REQ).committed == Capacity()


def test_the_holder_keeps_what_it_bids_lowest_for() -> None:
    # binpack: the holder at 75% (with the instance) is fuller than a challenger at 25%
    assert _round(_view("n1", 0.75), [_view("n2", 0.25)]) == (Outcome.KEPT, "n1")


def test_a_fuller_challenger_packs_tighter() -> None:
    # holder at 50% with it (25% without); the challenger at 50% would be 75% with it
    assert _round(_view("n1", 0.5), [_view("n2", 0.5)]) == (Outcome.PACKS, "n2")


def test_a_challenger_within_the_margin_does_not_move_it() -> None:
    # holder 50% with it; challenger at 27% would be 52%: 0.02 better, margin 0.05
    near = NodeView(node_id="n2", capacity=CAP,
                    committed=Capacity(cpu=8.0 * 0.27, memory_mb=int(8192 * 0.27)))
    assert _round(_view("n1", 0.5), [near]) == (Outcome.MARGIN, "n2")


def test_a_lower_bid_that_pays_nothing_does_not_move_it() -> None:
    # least-loaded: an empty node bids 0, the holder 0.25 without it: but moving to an empty
    # node packs nothing and nothing waits
    assert _round(_view("n1", 0.5), [_view("n2", 0.0)], LEAST) == (Outcome.NO_GAIN, "n2")


def test_a_move_that_frees_room_for_waiting_work_pays() -> None:
    big = Shape(cpu=6.0, memory_mb=4096)
    got = _round(_view("n1", 0.5), [_view("n2", 0.0)], LEAST, waiting=[big])
    assert got == (Outcome.FREES, "n2")
    # waiting work the holder's labels refuse is no reason
    gpu = Shape(cpu=6.0, memory_mb=4096, labels={"gpu": "yes"})
    assert _round(_view("n1", 0.5), [_view("n2", 0.0)], LEAST, waiting=[gpu])[0] \
        is Outcome.NO_GAIN


def test_a_holder_that_declines_to_keep_it_is_relieved() -> None:
    pinned = REQ.__class__(instance_id="web-1", cpu=2.0, memory_mb=2048, labels={"zone": "b"})
    holder = _view("n1", 0.5, {"zone": "a"})  # relabelled since it was placed
    assert _round(holder, [_view("n2", 0.6, {"zone": "b"})], LEAST, pinned) == \
        (Outcome.RELIEVED, "n2")


def test_no_bids_and_the_sentence() -> None:
    decision = decide("re-2", REQ, [("n1", Decline(shape=0, reason="no room for cpu"))], NOW)
    got = judge(REQ, "n1", decision, margin=0.05, holder_room=_room(_view("n1", 0.5)))
    assert got.outcome is Outcome.NO_BIDS and not got.moves
    moved = judge(REQ, "n1", decide("re-3", REQ, [
        ("n1", Bid(shape=0, load=0.5)), ("n2", Bid(shape=0, load=0.1))], NOW),
        margin=0.05, holder_room=_room(_view("n1", 0.5)), winner_room=_room(_view("n2", 0.9)))
    assert moved.moves
    assert moved.sentence("n1") == ("re-auction: n2 bid 0.1000, holder n1 keep-bid 0.5000: "
                                    f"{Outcome.PACKS}")
    assert math.isinf(judge(REQ, "n1", decision, margin=0.0,
                            holder_room=_room(_view("n1", 0.5))).keep)


def test_crowded_replicas_spread_onto_an_empty_node_by_the_spread_rule() -> None:
    replica = Request(instance_id="web-1", cpu=0.5, memory_mb=256, group="web")
    held = {"web": {"n1": 3}}  # four on n1, this one left out of its count
    tally = Tally(held, {})
    answers: list[tuple[str, Bid | Decline]] = [
        ("n1", answer(LEAST, replica, keep_view(_view("n1", 0.3), replica))),
        ("n2", answer(LEAST, replica, _view("n2", 0.6)))]  # busier, but holds none
    decision = decide("re-4", replica, answers, NOW, held=held)
    got = judge(replica, "n1", decision, margin=0.05, holder_room=_room(_view("n1", 0.3)),
                winner_room=_room(_view("n2", 0.6)), tally=tally)
    assert (got.outcome, got.winner) == (Outcome.SPREAD, "n2")
    # one replica each: no better place, and the load alone decides (within the margin)
    even = {"web": {"n2": 1}}
    decision = decide("re-5", replica, answers, NOW, held=even)
    got = judge(replica, "n1", decision, margin=0.05, holder_room=_room(_view("n1", 0.3)),
                winner_room=_room(_view("n2", 0.6)), tally=Tally(even, {}))
    assert got.outcome is Outcome.KEPT


def test_the_reauction_bench_runs_both_rounds() -> None:
    from gavel.bench.reauction import Fixture, measure

    f = Fixture(nodes=30, waiting=3)
    f.auction()
    f.reauction()
    ordinary, again = measure(30, 3, pairs=1, rounds=1)
    assert ordinary >= 0.0 and again >= 0.0
