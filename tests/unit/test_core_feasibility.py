"""Feasibility: the hard constraints checked before any strategy, in a fixed order."""

from __future__ import annotations

import msgspec
import pytest

from gavel.shared.feasibility import NodeView, Refusal, check, shortfall
from gavel.shared.messages import Bid, Capacity, Request, Spec
from gavel.shared.reasons import DECLINES, Reason, render
from gavel.shared.strategies import WARM_BONUS, answer, make_strategy


def node(*, cpu: float = 4.0, memory_mb: int = 1024, ports: int = 4,
         committed: Capacity | None = None, labels: dict[str, str] | None = None,
         draining: bool = False) -> NodeView:
    return NodeView(node_id="n1", capacity=Capacity(cpu=cpu, memory_mb=memory_mb, ports=ports),
                    committed=committed or Capacity(), labels=labels or {}, draining=draining)


def req(*, cpu: float = 1.0, memory_mb: int = 128, ports: int = 0,
        labels: dict[str, str] | None = None) -> Request:
    return Request(instance_id="i-1", cpu=cpu, memory_mb=memory_mb, ports=ports,
                   labels=labels or {})


def test_a_node_with_room_and_labels_may_bid() -> None:
    n = node(labels={"region": "eu", "disk": "ssd"})
    assert check(req(labels={"region": "eu"}), n) is None


@pytest.mark.parametrize(
    ("node_labels", "detail"),
    [
        ({}, "region=eu"),
        ({"region": "us"}, "region=eu"),
        ({"region": "eu"}, "zone=b"),
        ({"zone": "b"}, "region=eu"),
        ({"region": "EU", "zone": "b"}, "region=eu"),
    ],
)
def test_missing_label_names_the_first_missing_pair(node_labels: dict[str, str],
                                                    detail: str) -> None:
    # Requested labels are checked in sorted key order, whatever the dict order.
    request = req(labels={"zone": "b", "region": "eu"})
    assert check(request, node(labels=node_labels)) == Refusal(Reason.MISSING_LABEL, detail)


def test_draining_declines_everything() -> None:
    assert check(req(cpu=0.01, memory_mb=1), node(draining=True)) == Refusal(Reason.DRAINING)


def test_cpu_is_reserved_against_capacity_minus_committed() -> None:
    n = node(cpu=4.0, committed=Capacity(cpu=3.0))
    assert check(req(cpu=1.0), n) is None  # exactly full is allowed
    assert check(req(cpu=1.5), n) == Refusal(Reason.NO_ROOM_CPU, "1.5")
    assert check(req(cpu=2.0), n) == Refusal(Reason.NO_ROOM_CPU, "2")


def test_cpu_rounding_does_not_refuse_an_exact_fit() -> None:
    # 0.6 - (0.1 + 0.2) is 0.29999999999999993 in floating point.
    n = node(cpu=0.6, committed=Capacity(cpu=0.1 + 0.2))
    assert check(req(cpu=0.3), n) is None


def test_memory_is_reserved_against_capacity_minus_committed() -> None:
    n = node(memory_mb=1024, committed=Capacity(memory_mb=768))
    assert check(req(memory_mb=256), n) is None
    assert check(req(memory_mb=257), n) == Refusal(Reason.NO_ROOM_MEMORY, "257")


def test_ports_are_reserved_against_capacity_minus_committed() -> None:
    n = node(ports=3, committed=Capacity(ports=2))
    assert check(req(ports=1), n) is None
    assert check(req(ports=2), n) == Refusal(Reason.NO_ROOM_PORTS)


def test_first_failing_check_wins_in_fixed_order() -> None:
    everything_wrong = req(cpu=99.0, memory_mb=99_999, ports=99, labels={"gpu": "yes"})
    full = Capacity(cpu=4.0, memory_mb=1024, ports=4)
    n = node(committed=full, draining=True)
    assert check(everything_wrong, n) == Refusal(Reason.MISSING_LABEL, "gpu=yes")
    n = node(committed=full, draining=True, labels={"gpu": "yes"})
    assert check(everything_wrong, n) == Refusal(Reason.DRAINING)
    n = node(committed=full, labels={"gpu": "yes"})
    assert check(everything_wrong, n) == Refusal(Reason.NO_ROOM_CPU, "99")
    assert check(req(memory_mb=99_999, ports=99), node()) == Refusal(Reason.NO_ROOM_MEMORY,
                                                                     "99999")


def test_capacity_does_its_own_arithmetic() -> None:
    a, b = Capacity(cpu=4.0, memory_mb=1024, ports=4), Capacity(cpu=1.5, memory_mb=24, ports=1)
    assert a - b == Capacity(cpu=2.5, memory_mb=1000, ports=3)
    assert a + b == Capacity(cpu=5.5, memory_mb=1048, ports=5)
    assert a == Capacity(cpu=4.0, memory_mb=1024, ports=4)  # + and - make new values
    room = a.copy()
    room.charge(req(cpu=1.0, memory_mb=24, ports=2), -1)  # a shape counts like a capacity
    assert room == Capacity(cpu=3.0, memory_mb=1000, ports=2) and room is not a
    room.charge(b, times=2)
    assert room == Capacity(cpu=6.0, memory_mb=1048, ports=4)


def test_the_fit_check_is_the_nodes_and_the_auctions_alike() -> None:
    """One check: the first of cpu, memory, ports that does not fit, cpu with a rounding
    allowance (a float sum of awards that fills a node exactly still fits)."""
    free = Capacity(cpu=0.30000000000000004 - 0.1, memory_mb=100, ports=1)
    assert shortfall(req(cpu=0.2, memory_mb=100, ports=1), free) is None
    assert shortfall(req(cpu=0.3, memory_mb=999, ports=9), free) == Refusal(
        Reason.NO_ROOM_CPU, "0.3")
    assert shortfall(req(cpu=0.1, memory_mb=101, ports=9), free) == Refusal(
        Reason.NO_ROOM_MEMORY, "101")
    assert shortfall(req(cpu=0.1, memory_mb=1, ports=2), free) == Refusal(Reason.NO_ROOM_PORTS)


def test_an_image_needs_a_container_engine_on_the_node() -> None:
    image = Request(instance_id="i-1", cpu=1.0, memory_mb=128, image="gavel-web:v1")
    assert check(image, node()) == Refusal(Reason.NO_ENGINE)
    assert check(image, msgspec.structs.replace(node(), engine=True)) is None
    assert check(req(), node()) is None  # a process needs none


def test_a_process_asking_for_root_is_declined_at_bid_time_where_root_is_refused() -> None:
    """Issue 29: declined in the auction (so placed where root is allowed, or waiting),
    not won and then failed at start."""
    root = Request.of("i-1", Spec(name="r", command=["id"], root=True, cpu=1.0))
    refusing = msgspec.structs.replace(node(), allow_root=False)
    assert root.shape().root and root.shape().key() != req().shape().key()
    assert check(root, refusing) == Refusal(Reason.ROOT_REFUSED)
    assert Reason.ROOT_REFUSED in DECLINES
    assert check(root, node()) is None  # a view that cannot know (the broker's) says yes
    assert check(req(), refusing) is None  # only a spec that asks
    container = Request.of("i-2", Spec(name="c", image="gavel-web:v1", root=True, cpu=1.0))
    assert check(container, msgspec.structs.replace(refusing, engine=True)) is None


def test_every_named_volume_must_be_held_and_the_first_missing_is_named() -> None:
    wants = Request(instance_id="i-1", cpu=1.0, memory_mb=128, volumes=["logs", "data"])
    assert check(wants, node()) == Refusal(Reason.MISSING_VOLUME, "data")
    held = msgspec.structs.replace(node(), volumes=frozenset({"data"}))
    assert check(wants, held) == Refusal(Reason.MISSING_VOLUME, "logs")
    assert check(wants, msgspec.structs.replace(held, volumes=frozenset({"data", "logs"}))) \
        is None
    assert Reason.MISSING_VOLUME in DECLINES and Reason.NO_ENGINE in DECLINES
    assert render(Reason.MISSING_VOLUME, "data") == "missing host volume data"


def test_a_warm_node_outbids_a_cold_one_by_the_documented_amount() -> None:
    image = Request(instance_id="i-1", cpu=1.0, memory_mb=128, image="gavel-web:v1")
    cold = msgspec.structs.replace(node(), engine=True)
    warm = msgspec.structs.replace(cold, images=frozenset({"gavel-web:v1"}))
    strategy = make_strategy("least-loaded")
    a, b = answer(strategy, image.shape(), warm), answer(strategy, image.shape(), cold)
    assert isinstance(a, Bid) and isinstance(b, Bid)
    assert a.warm and not b.warm
    assert b.load - a.load == pytest.approx(WARM_BONUS)
    plain = answer(strategy, req().shape(), cold)  # no image: no price for one
    assert isinstance(plain, Bid) and plain.load == a.load
