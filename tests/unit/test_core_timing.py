"""Timing: one struct of clocks; ``GAVEL_FAST_TIMERS=1`` shrinks every one tenfold."""

from __future__ import annotations

import msgspec
import pytest

from shared.timing import FAST_FACTOR, Timing


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
        assert getattr(fast, name) == pytest.approx(getattr(base, name) / 10.0), name


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
