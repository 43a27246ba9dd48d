"""Liveness: healthy, then unreachable at 30 s of silence, then offline at 120 s."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gavel.shared.health import Health, Liveness
from gavel.shared.messages import Heartbeat
from gavel.shared.timing import Timing


def hb(node: str, seq: int = 0) -> Heartbeat:
    return Heartbeat(node_id=node, seq=seq)


@pytest.mark.parametrize(
    ("quiet", "health"),
    [
        (0.0, Health.HEALTHY),
        (10.0, Health.HEALTHY),
        (29.999, Health.HEALTHY),
        (30.0, Health.UNREACHABLE),
        (119.999, Health.UNREACHABLE),
        (120.0, Health.OFFLINE),
        (1e6, Health.OFFLINE),
    ],
)
def test_thresholds(quiet: float, health: Health) -> None:
    live = Liveness(Timing())
    live.record(hb("n1"), now=1000.0)
    assert live.health("n1", 1000.0 + quiet) is health


def test_fast_timing_moves_the_thresholds() -> None:
    live = Liveness(Timing.from_env({"GAVEL_FAST_TIMERS": "1"}))
    live.record(hb("n1"), now=0.0)
    assert live.health("n1", 2.9) is Health.HEALTHY
    assert live.health("n1", 3.0) is Health.UNREACHABLE
    assert live.health("n1", 12.0) is Health.OFFLINE


def test_a_node_never_heard_is_offline_and_not_known() -> None:
    live = Liveness(Timing())
    assert live.health("ghost", 0.0) is Health.OFFLINE
    assert live.known() == []
    assert live.eligible(0.0) == []


def test_record_returns_the_health_before_the_heartbeat() -> None:
    live = Liveness(Timing())
    assert live.record(hb("n1", 1), 0.0) is None
    assert live.record(hb("n1", 2), 10.0) is Health.HEALTHY
    assert live.record(hb("n1", 3), 50.0) is Health.UNREACHABLE
    assert live.record(hb("n1", 4), 500.0) is Health.OFFLINE
    assert live.health("n1", 500.0) is Health.HEALTHY  # a heartbeat brings it back
    assert live.heartbeats["n1"].seq == 4


def test_only_healthy_nodes_are_eligible_sorted() -> None:
    live = Liveness(Timing())
    live.record(hb("c"), 95.0)  # healthy at 100
    live.record(hb("a"), 80.0)  # healthy at 100
    live.record(hb("b"), 60.0)  # unreachable at 100 (40 s quiet)
    live.record(hb("d"), 0.0)   # unreachable at 100
    live.record(hb("e"), -30.0)  # offline at 100 (130 s quiet)
    assert live.eligible(100.0) == ["a", "c"]
    assert live.known() == ["a", "b", "c", "d", "e"]
    assert live.eligible(200.0) == []


def test_a_presumed_node_gets_the_full_thresholds_but_is_not_eligible() -> None:
    """A restarted broker presumes nodes it holds placements for as heard at start."""
    live = Liveness(Timing())
    live.presume("n1", 100.0)
    live.presume("n1", 500.0)  # the first presumption stands
    assert live.health("n1", 129.0) is Health.HEALTHY
    assert live.health("n1", 130.0) is Health.UNREACHABLE
    assert live.health("n1", 220.0) is Health.OFFLINE
    assert live.eligible(101.0) == []
    live.record(hb("n1"), 300.0)  # a real heartbeat takes over
    assert live.health("n1", 320.0) is Health.HEALTHY
    assert live.eligible(320.0) == ["n1"]


def _brute(live: Liveness, now: float) -> list[str]:
    return sorted(n for n in live.last_seen if live.health(n, now) is Health.HEALTHY)


def test_the_kept_eligible_list_is_a_node_crossing_the_threshold_exactly() -> None:
    live = Liveness(Timing())  # unreachable at 30 s
    live.record(hb("a"), now=0.0)
    live.record(hb("b"), now=10.0)
    assert live.eligible(20.0) == ["a", "b"]
    assert live.eligible(29.999) == ["a", "b"]  # kept
    assert live.eligible(30.0) == ["b"]  # a crossed: looked again
    live.record(hb("a"), now=31.0)  # a returns: looked again at once
    assert live.eligible(31.0) == ["a", "b"]
    assert live.eligible(40.0) == ["a"]
    live.shift(5.0)  # deaf for 5 s: b is healthy again until 45
    assert live.eligible(44.0) == ["a", "b"]


@given(st.lists(st.tuples(st.sampled_from(["record", "eligible", "shift"]),
                          st.sampled_from(["n1", "n2", "n3", "n4"]),
                          st.floats(min_value=0.0, max_value=40.0)), max_size=60))
def test_the_kept_eligible_list_always_equals_a_fresh_count(
        steps: list[tuple[str, str, float]]) -> None:
    live = Liveness(Timing())
    now = 0.0
    for op, node, dt in steps:
        now += dt
        if op == "record":
            live.record(hb(node), now)
        elif op == "shift":
            live.shift(dt / 4)
        assert live.eligible(now) == _brute(live, now)
