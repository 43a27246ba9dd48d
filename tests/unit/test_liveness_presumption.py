"""What a broker that starts presumes: each node silent as long as the heartbeat stream's
server stamps say, relative to the freshest of them, never closer than `unreachable_s` to
offline (a live node's heartbeats may be late on a loaded machine: a node once counted silent
14.1 s under fast timers, whose offline is 12 s, had only been late); and time it could not
hear, for whatever cause, counts against no node."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gavel.shared.health import Deafness, Health, Liveness, silences
from gavel.shared.messages import Heartbeat
from gavel.shared.timing import Timing

T = Timing()  # heartbeat 10, unreachable 30, offline 120


def test_silence_is_counted_from_the_freshest_stamp_not_from_now() -> None:
    stamps = {"a": 1_000.0, "b": 1_090.0, "@probe": 1_100.0}
    assert silences(stamps, ["a", "b", "c"]) == {"a": 100.0, "b": 10.0}
    # Everyone silenced together (an outage) looks like no silence at all.
    assert silences({"a": 5.0, "b": 5.0}, ["a", "b"]) == {"a": 0.0, "b": 0.0}
    assert silences({}, ["a"]) == {}


@pytest.mark.parametrize(("silent", "offline_at"), [
    (0.0, 120.0),      # heard at start: the full offline_s
    (80.0, 40.0),      # 80 s silent already: offline 40 s after start
    (90.0, 30.0),      # unreachable_s short of offline: still that long to be heard
    (100.0, 30.0),     # closer than that: unreachable_s, never less
    (111.0, 30.0),     # a heartbeat short: late heartbeats on a loaded machine still count
    (10_000.0, 30.0),  # long dead: offline unreachable_s after start
    (-5.0, 120.0),     # a stamp from the future counts as heard at start
])
def test_a_presumed_node_is_offline_after_what_is_left_but_never_within_unreachable_s(
        silent: float, offline_at: float) -> None:
    live = Liveness(T)
    live.presume("n", 1_000.0, silent)
    assert live.health("n", 1_000.0 + offline_at - 0.001) is not Health.OFFLINE
    assert live.health("n", 1_000.0 + offline_at) is Health.OFFLINE
    assert live.eligible(1_000.0) == []  # presumed, not heard


def test_the_first_presumption_stands_and_a_heartbeat_overrules_it() -> None:
    live = Liveness(T)
    live.presume("n", 1_000.0, 100.0)
    live.presume("n", 1_000.0, 0.0)
    assert live.health("n", 1_030.0) is Health.OFFLINE
    live.record(Heartbeat(node_id="n"), 1_030.0)
    assert live.health("n", 1_030.0) is Health.HEALTHY


def test_deafness_lasts_from_the_first_cause_to_the_last_end() -> None:
    d = Deafness()
    assert not d.deaf and d.end("connection", 5.0) is None
    assert d.begin("feed", 10.0) is True
    assert d.begin("connection", 12.0) is False  # already deaf
    assert d.begin("feed", 11.0) is False  # a cause begins once
    assert d.since == 10.0
    assert d.end("feed", 15.0) is None  # the connection is still down
    assert d.deaf
    assert d.end("connection", 20.0) == 10.0
    assert not d.deaf and d.since is None
    assert d.begin("feed", 30.0) is True and d.end("feed", 29.0) == 0.0  # never negative


def test_a_node_late_on_a_loaded_machine_is_not_offline_at_a_fast_restart() -> None:
    """The case seen: fast timers (heartbeat 1 s, unreachable 3 s, offline 12 s), a node
    14.1 s behind the freshest stamp whose heartbeat then comes 2.5 s after the start."""
    live = Liveness(T.scaled(10))
    live.presume("n", 1_000.0, 14.1)
    assert live.health("n", 1_002.5) is Health.UNREACHABLE  # late, not given up on
    live.record(Heartbeat(node_id="n"), 1_002.5)
    assert live.health("n", 1_002.5) is Health.HEALTHY


@given(st.lists(st.tuples(st.sampled_from(["begin", "end"]),
                          st.sampled_from(["connection", "feed"]),
                          st.floats(min_value=0.0, max_value=10.0)), max_size=40))
def test_every_deaf_moment_is_owed_once(steps: list[tuple[str, str, float]]) -> None:
    """The shifts handed out add up to the time during which some cause was on."""
    d = Deafness()
    now, on, owed, deaf_time, last = 0.0, set[str](), 0.0, 0.0, 0.0
    for op, cause, dt in steps:
        now += dt
        if on:
            deaf_time += now - last
        last = now
        if op == "begin":
            d.begin(cause, now)
            on.add(cause)
        else:
            owed += d.end(cause, now) or 0.0
            on.discard(cause)
        assert d.deaf == bool(on)
    if on:
        owed += now - (now if d.since is None else d.since)
    assert owed == pytest.approx(deaf_time)
