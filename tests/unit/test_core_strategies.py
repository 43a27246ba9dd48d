"""Strategies: each one's price, the registry, and `answer` (feasibility, then the price and
its marginal step for one more of the same shape)."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gavel.shared.auction import Auction, Verdict
from gavel.shared.feasibility import NodeView, Refusal
from gavel.shared.messages import Bid, BidReply, Capacity, Decline, HostStats, Request, Shape
from gavel.shared.reasons import Reason
from gavel.shared.strategies import REGISTRY, answer, make_strategy, names
from gavel.shared.strategies.headroom import Headroom

CAP = Capacity(cpu=4.0, memory_mb=1000, ports=10)


def node(*, cpu: float = 0.0, memory_mb: int = 0, cpu_ratio: float = 0.0,
         memory_ratio: float = 0.0, node_id: str = "n1", draining: bool = False) -> NodeView:
    return NodeView(node_id=node_id, capacity=CAP,
                    committed=Capacity(cpu=cpu, memory_mb=memory_mb),
                    stats=HostStats(cpu_ratio=cpu_ratio, memory_ratio=memory_ratio),
                    draining=draining)


REQ = Shape(cpu=1.0, memory_mb=100)


def bid_of(name: str, n: NodeView, r: Shape = REQ, **params: float) -> Bid:
    got = answer(make_strategy(name, params or None), r, n)
    assert isinstance(got, Bid), got
    assert got.strategy == name
    assert got.shape == 0
    return got


def price(name: str, n: NodeView, r: Shape = REQ, **params: float) -> float:
    return bid_of(name, n, r, **params).load


def step(name: str, n: NodeView, r: Shape = REQ, **params: float) -> float:
    return bid_of(name, n, r, **params).step


# -- the registry -------------------------------------------------------------------------


def test_registry_lists_the_four_strategies_sorted() -> None:
    assert names() == ["binpack", "headroom", "least-loaded", "spread"]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_make_strategy_builds_the_named_strategy(name: str) -> None:
    assert make_strategy(name).name == name


def test_unknown_strategy_names_the_choices() -> None:
    with pytest.raises(ValueError) as err:
        make_strategy("fastest")
    assert str(err.value) == (
        "unknown strategy 'fastest': expected one of binpack, headroom, least-loaded, spread"
    )


# -- least-loaded -------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "params", "words"), [
    ("headroom", {"ceilng": 0.7}, "strategy headroom has no parameter 'ceilng' (it takes "
     "ceiling)"),
    ("binpack", {"ceiling": 0.5}, "strategy binpack has no parameter 'ceiling' (it takes "
     "none)"),
    ("least-loaded", {"x": 1.0}, "no parameter 'x'"),
    ("spread", {"x": 1.0}, "no parameter 'x'"),
])
def test_a_parameter_the_strategy_does_not_take_is_refused(
        name: str, params: dict[str, float], words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        make_strategy(name, params)


def test_least_loaded_bids_max_of_measured_and_committed_averaged() -> None:
    # cpu: max(1/4, 0.5) = 0.5; memory: max(500/1000, 0.1) = 0.5
    assert price("least-loaded", node(cpu=1.0, memory_mb=500, cpu_ratio=0.5,
                                      memory_ratio=0.1)) == pytest.approx(0.5)
    assert price("least-loaded", node()) == 0.0


def test_least_loaded_prefers_the_emptier_node() -> None:
    assert price("least-loaded", node(cpu=1.0)) < price("least-loaded", node(cpu=2.0))
    assert price("least-loaded", node(cpu_ratio=0.1)) < price("least-loaded", node(cpu_ratio=0.9))


# -- binpack ------------------------------------------------------------------------------


def test_binpack_bids_one_minus_utilisation_after_placement() -> None:
    # after: cpu 2/4 = 0.5, memory 600/1000 = 0.6 -> 0.55 -> load 0.45
    assert price("binpack", node(cpu=1.0, memory_mb=500)) == pytest.approx(0.45)


def test_binpack_prefers_the_fuller_node() -> None:
    assert price("binpack", node(cpu=3.0)) < price("binpack", node(cpu=1.0))


def test_binpack_never_bids_below_zero() -> None:
    assert price("binpack", node(cpu_ratio=1.5, memory_ratio=1.5)) == 0.0


# -- spread -------------------------------------------------------------------------------


def test_spread_counts_commitments_only() -> None:
    # (2/4 + 250/1000) / 2
    assert price("spread", node(cpu=2.0, memory_mb=250)) == pytest.approx(0.375)
    # A busy host with nothing committed still looks empty to spread, not to least-loaded.
    busy = node(cpu_ratio=0.9, memory_ratio=0.9)
    assert price("spread", busy) == 0.0
    assert price("least-loaded", busy) == pytest.approx(0.9)


# -- headroom -----------------------------------------------------------------------------


def test_headroom_bids_current_utilisation_under_the_ceiling() -> None:
    # now: (1/4 + 0.1)/2 = 0.175; after: (2/4 + 0.2)/2 = 0.35 <= 0.8
    assert price("headroom", node(cpu=1.0, memory_mb=100)) == pytest.approx(0.175)


def test_headroom_declines_over_its_default_ceiling() -> None:
    # after: (4/4 + 0.4)/2 = 0.7 fits; with 0.9 measured memory it is (1 + 0.9)/2 = 0.95.
    n = node(cpu=3.0, memory_mb=300, memory_ratio=0.9)
    got = answer(make_strategy("headroom"), REQ, n)
    assert got == Decline(shape=0, reason=Reason.OVER_CEILING, detail="0.8")
    assert Headroom().bid(REQ, n) == Refusal(Reason.OVER_CEILING, "0.8")


def test_headroom_ceiling_param_moves_the_line() -> None:
    n = node(cpu=1.0, memory_mb=100)  # after placement: 0.35
    assert isinstance(answer(make_strategy("headroom", {"ceiling": 0.35}), REQ, n), Bid)
    got = answer(make_strategy("headroom", {"ceiling": 0.3}), REQ, n)
    assert got == Decline(shape=0, reason=Reason.OVER_CEILING, detail="0.3")
    assert isinstance(answer(make_strategy("headroom", {"ceiling": 1.0}), REQ,
                             node(cpu=3.0, memory_mb=900)), Bid)


@pytest.mark.parametrize("ceiling", [0.0, -0.5, 1.01, 2.0, math.nan, math.inf])
def test_headroom_rejects_a_bad_ceiling(ceiling: float) -> None:
    with pytest.raises(ValueError, match=r"headroom ceiling must be in \(0, 1\], got"):
        make_strategy("headroom", {"ceiling": ceiling})


# -- answer: feasibility before price -----------------------------------------------------


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_strategy_declines_what_feasibility_refuses(name: str) -> None:
    strategy = make_strategy(name)
    assert answer(strategy, REQ, node(draining=True)) == Decline(
        shape=0, reason=Reason.DRAINING)
    assert answer(strategy, Shape(cpu=5.0, memory_mb=1), node(), 2) == Decline(
        shape=2, reason=Reason.NO_ROOM_CPU, detail="5")
    labelled = Shape(cpu=0.1, memory_mb=1, labels={"gpu": "a100"})
    assert answer(strategy, labelled, node()) == Decline(
        shape=0, reason=Reason.MISSING_LABEL, detail="gpu=a100")


nodes = st.builds(
    node,
    cpu=st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0]),
    memory_mb=st.integers(0, 900),
    cpu_ratio=st.floats(0.0, 1.0),
    memory_ratio=st.floats(0.0, 1.0),
)
requests = st.builds(Shape, cpu=st.floats(0.01, 1.0), memory_mb=st.integers(1, 100))


@pytest.mark.parametrize("name", sorted(REGISTRY))
@given(n=nodes, r=requests)
def test_every_bid_is_a_finite_non_negative_load(name: str, n: NodeView, r: Shape) -> None:
    got = answer(make_strategy(name), r, n)
    if isinstance(got, Bid):
        assert math.isfinite(got.load) and got.load >= 0.0
        assert not math.isnan(got.step) and got.step != -math.inf
    else:
        assert got.reason in set(Reason)
    # Whatever a strategy answers, an auction accepts it.
    auction = Auction("a", [Request(instance_id="i", cpu=r.cpu, memory_mb=r.memory_mb)], ["n1"],
                      opened_at=0.0, deadline_s=1.0)
    assert auction.receive(BidReply(auction_id="a", node_id="n1", answers=[got]),
                           0.0) is Verdict.ACCEPTED


@pytest.mark.parametrize("name", sorted(REGISTRY))
@given(n=nodes, a=requests, b=requests)
def test_depends_on_request_flag_is_honest(name: str, n: NodeView, a: Shape,
                                          b: Shape) -> None:
    """The simulator caches a bid when the flag is False: the load must then ignore it."""
    strategy = make_strategy(name)
    if not strategy.depends_on_request:
        assert strategy.bid(a, n) == strategy.bid(b, n)


def test_request_dependent_strategies_do_depend_on_the_request() -> None:
    small = Shape(cpu=0.1, memory_mb=10)
    big = Shape(cpu=3.0, memory_mb=500)
    assert make_strategy("binpack").depends_on_request
    assert price("binpack", node(), small) != price("binpack", node(), big)
    assert make_strategy("headroom").depends_on_request
    assert isinstance(answer(make_strategy("headroom", {"ceiling": 0.5}), small, node()), Bid)
    assert isinstance(answer(make_strategy("headroom", {"ceiling": 0.5}), big, node()), Decline)


# -- the marginal step --------------------------------------------------------------------


def test_least_loaded_step_is_the_committed_share_one_more_adds() -> None:
    # now 0; after one: (1/4 + 100/1000)/2 = 0.175
    assert step("least-loaded", node()) == pytest.approx(0.175)
    assert step("least-loaded", node(cpu=1.0, memory_mb=100)) > 0.0


def test_least_loaded_step_is_zero_while_measured_use_dominates() -> None:
    # Measured use (0.9) stays above the committed share after one more: the price holds.
    assert step("least-loaded", node(cpu_ratio=0.9, memory_ratio=0.9)) == 0.0


def test_spread_step_is_the_committed_share_of_the_shape() -> None:
    assert step("spread", node()) == pytest.approx(0.175)
    assert step("spread", node(cpu=2.0, memory_mb=250)) == pytest.approx(0.175)
    # Host stats do not move spread's price, nor its step.
    assert step("spread", node(cpu_ratio=0.9, memory_ratio=0.9)) == pytest.approx(0.175)
    # A bigger shape costs more per instance.
    assert step("spread", node(), Shape(cpu=2.0, memory_mb=200)) == pytest.approx(0.35)


def test_binpack_step_is_negative_so_a_node_keeps_packing() -> None:
    # now 1 - 0.175 = 0.825; after one more 1 - 0.35 = 0.65
    assert price("binpack", node()) == pytest.approx(0.825)
    assert step("binpack", node()) == pytest.approx(-0.175)
    assert step("binpack", node(cpu=1.0, memory_mb=100)) < 0.0


def test_headroom_step_is_positive_under_the_ceiling() -> None:
    assert step("headroom", node()) == pytest.approx(0.175)


def test_headroom_step_is_inf_when_one_more_would_cross_the_ceiling() -> None:
    # Now (2/4 + 500/1000)/2 = 0.5; with this one (3/4 + 0.6)/2 = 0.675 fits 0.8; with
    # another (1 + 0.7)/2 = 0.85 does not.
    n = node(cpu=2.0, memory_mb=500)
    assert price("headroom", n) == pytest.approx(0.5)
    assert step("headroom", n) == math.inf
    assert step("headroom", n, ceiling=0.9) == pytest.approx(0.175)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_step_stays_finite_when_capacity_runs_out(name: str) -> None:
    """Room is the broker's to charge (it knows every award it made); the step only prices.
    A node full for one shape must still be able to win a smaller one in the same batch."""
    strategy = make_strategy(name, {"ceiling": 1.0} if name == "headroom" else None)
    shape = Shape(cpu=1.0, memory_mb=100, ports=1)
    # Room for this one and not a second, whichever resource runs out: cpu, memory, ports.
    for committed in (Capacity(cpu=3.0), Capacity(memory_mb=850), Capacity(ports=9)):
        last = NodeView(node_id="n1", capacity=CAP, committed=committed)
        got = answer(strategy, shape, last)
        assert isinstance(got, Bid) and math.isfinite(got.step), (committed, got)


def test_step_is_inf_when_the_strategy_refuses_another() -> None:
    strategy = make_strategy("headroom", {"ceiling": 0.5})
    shape = Shape(cpu=1.0, memory_mb=100)
    n = NodeView(node_id="n1", capacity=CAP, committed=Capacity(cpu=0.5, memory_mb=300))
    got = answer(strategy, shape, n)
    assert isinstance(got, Bid) and got.step == math.inf, got


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_answer_echoes_the_shape_index(name: str) -> None:
    strategy = make_strategy(name)
    got = answer(strategy, REQ, node(), 4)
    assert isinstance(got, Bid) and got.shape == 4
    refused = answer(strategy, REQ, node(draining=True), 4)
    assert isinstance(refused, Decline) and refused.shape == 4


def _plus(n: NodeView, r: Shape) -> NodeView:
    c = n.committed
    return NodeView(node_id=n.node_id, capacity=n.capacity, stats=n.stats, labels=n.labels,
                    draining=n.draining,
                    committed=Capacity(cpu=c.cpu + r.cpu, memory_mb=c.memory_mb + r.memory_mb,
                                       ports=c.ports + r.ports))


@pytest.mark.parametrize("name", sorted(REGISTRY))
@given(n=nodes, r=requests)
def test_step_is_the_price_once_the_node_holds_one_more(name: str, n: NodeView,
                                                        r: Shape) -> None:
    """The definition: load + step is the strategy's price after winning this one, and inf
    exactly when the strategy itself would then refuse (room is charged by the broker)."""
    strategy = make_strategy(name)
    now = answer(strategy, r, n)
    if not isinstance(now, Bid):
        return
    then = strategy.bid(r, _plus(n, r))
    if now.step == math.inf:
        assert isinstance(then, Refusal)
    else:
        assert not isinstance(then, Refusal)
        assert now.load + now.step == pytest.approx(then, abs=1e-12)
