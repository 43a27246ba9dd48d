"""Timing: one struct of clocks; ``GAVEL_FAST_TIMERS=1`` shrinks every clock of the protocol
tenfold, and leaves the machine's waits (rule 3)."""

from __future__ import annotations

import msgspec
import pytest

from gavel.shared.timing import FAST_FACTOR, MACHINE, Timing


def test_defaults_are_the_documented_clocks() -> None:
    t = Timing()
    assert (t.heartbeat_s, t.unreachable_s, t.offline_s, t.provisioning_s) == (
        10.0, 30.0, 120.0, 15.0)
    assert t.cancel_grace_s == 60.0
    assert t.kill_grace_s == 30.0


@pytest.mark.parametrize("flag", ["1", "true", "yes", "on", " 1 ", "TRUE"])
def test_fast_timers_shrink_every_clock_tenfold(flag: str) -> None:
    fast = Timing.from_env({"GAVEL_FAST_TIMERS": flag})
    assert FAST_FACTOR == 10.0
    assert (fast.heartbeat_s, fast.unreachable_s, fast.offline_s, fast.provisioning_s) == (
        1.0, 3.0, 12.0, 1.5)
    base = Timing()
    for name in Timing.__struct_fields__:
        shrunk = 1.0 if name in MACHINE else 10.0  # rule 3: the machine's waits stay
        assert getattr(fast, name) == pytest.approx(getattr(base, name) / shrunk), name


def test_the_floors_and_caps_around_other_clocks() -> None:
    """A question a protocol clock paces waits that clock, or the machine's least if longer;
    the floors and caps keep their defaults, and fast timers leave the machine's floor."""
    t = Timing()
    assert (t.answer_least_s, t.landed_least_s, t.put_least_s, t.retake_s, t.fetch_least_s,
            t.logs_look_s, t.exec_look_s, t.loops_close_s, t.endpoints_least_s, t.rewatch_s,
            t.idle_watch_s) == (1.0, 0.5, 0.1, 0.1, 1.0, 0.25, 0.2, 5.0, 2.0, 1.0, 60.0)
    assert (t.heartbeat_answer_s, t.answer_within(0.3), t.answer_within(2.0)) == (10.0, 1.0, 2.0)
    assert t.link_s == 6.0
    fast = t.scaled(FAST_FACTOR)
    assert (fast.heartbeat_answer_s, fast.link_s) == (1.0, 1.5)
    assert fast.answer_within(0.05) == 1.0
    slow = Timing(heartbeat_s=20.0, unreachable_s=40.0, answer_least_s=3.0)
    assert (slow.heartbeat_answer_s, slow.answer_within(2.0), slow.link_s) == (20.0, 3.0, 13.0)


def test_the_machine_waits_are_the_answers_pushes_shutdowns_starts_and_polls() -> None:
    """Rule 3: only waits on another process, a shutdown or a child's start, and the pace of
    looking again at another process, are kept from fast timers; every
    clock that existed before them (the protocol's) is still shrunk."""
    assert frozenset({"call_s", "ack_s", "push_s", "close_s", "flush_s", "answer_s",
                      "node_answer_s", "interest_s", "ask_s", "poll_s", "poll_max_s",
                      "start_s", "jetstream_s", "connect_s", "lapse_s", "stale_lock_s",
                      "orphan_s", "engine_call_s", "engine_ask_s", "confine_s", "scrape_s",
                      "explain_s", "follow_s", "goodbye_s", "wait_s", "failover_s",
                      "watch_s", "glance_s", "ask_pause_s", "up_s", "respawn_s",
                      "stop_grace_s", "refresh_s", "settle_s", "head_s", "keepalive_s",
                      "caddy_s", "caddy_ask_s", "caddy_start_s", "reconnect_s", "demo_s",
                      "demo_pause_s", "answer_least_s", "landed_least_s", "put_least_s",
                      "retake_s", "fetch_least_s", "logs_look_s", "exec_look_s",
                      "loops_close_s", "endpoints_least_s"}) == MACHINE
    assert set(Timing.__struct_fields__) >= MACHINE
    protocol = {"heartbeat_s", "unreachable_s", "offline_s", "provisioning_s", "bid_deadline_s",
                "lease_grace_s", "cancel_grace_s", "kill_grace_s", "tick_s", "mirror_s",
                "retention_s", "retry_s", "retry_max_s", "rewatch_s", "idle_watch_s"}
    assert protocol | MACHINE == set(Timing.__struct_fields__)
    assert not protocol & MACHINE


@pytest.mark.parametrize("env", [{}, {"GAVEL_FAST_TIMERS": ""}, {"GAVEL_FAST_TIMERS": "0"},
                                 {"GAVEL_FAST_TIMERS": "no"}, {"OTHER": "1"}])
def test_without_the_flag_timing_is_the_default(env: dict[str, str]) -> None:
    # The test session itself runs with GAVEL_FAST_TIMERS=1 in os.environ (tests/conftest.py);
    # from_env must read only the mapping it is given.
    assert Timing.from_env(env) == Timing()


def test_scaled_divides_and_keeps_the_original() -> None:
    base = Timing(heartbeat_s=8.0)
    half = base.scaled(2.0)
    assert half.heartbeat_s == 4.0
    assert half.offline_s == 60.0
    assert base.heartbeat_s == 8.0


def test_timing_config_forbids_unknown_fields() -> None:
    assert msgspec.convert({"heartbeat_s": 5.0}, Timing) == Timing(heartbeat_s=5.0)
    with pytest.raises(msgspec.ValidationError, match="hearbeat_s"):
        msgspec.convert({"hearbeat_s": 5.0}, Timing)


def test_default_and_fast_clocks_have_no_problem() -> None:
    assert Timing().problem() is None
    assert Timing().scaled(FAST_FACTOR).problem() is None
    assert Timing(retention_s=0.0).problem() is None


@pytest.mark.parametrize(("timing", "words"), [
    (Timing(tick_s=float("inf")), "`timing.tick_s` expected a finite number of seconds above 0"),
    (Timing(kill_grace_s=float("nan")), "`timing.kill_grace_s`"),
    (Timing(bid_deadline_s=0.0), "`timing.bid_deadline_s`"),
    (Timing(retention_s=-1.0), "`timing.retention_s` expected a finite number of seconds 0 or"),
    (Timing(heartbeat_s=30.0), "a node is heard from before it counts as unreachable"),
    (Timing(offline_s=29.0), "got 10.0, 30.0, 29.0."),
])
def test_unusable_clocks_are_named_in_one_sentence(timing: Timing, words: str) -> None:
    problem = timing.problem()
    assert problem is not None and words in problem
    assert problem.endswith(".") and "\n" not in problem


def test_decoding_refuses_clocks_at_or_below_zero() -> None:
    for bad in ({"tick_s": 0.0}, {"heartbeat_s": -1.0}, {"retention_s": -0.5}):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(bad, Timing)
