"""The check state machine (`worker.checks.CheckMachine`) with the clock passed in: grace,
intervals, checking -> healthy, consecutive failures -> unhealthy."""

from __future__ import annotations

from gavel.shared.messages import Health
from gavel.shared.spec import Check
from gavel.worker.checks import OUTPUT_MAX, Change, CheckMachine

HTTP = Check(type="http", port="web", path="/health", interval_s=10.0, grace_s=5.0, failures=2)
EXEC = Check(type="exec", command=["probe"], interval_s=4.0)


def test_no_checks_is_healthy_from_the_start() -> None:
    m = CheckMachine([], started=0.0)
    assert m.health is Health.HEALTHY and m.due(0.0) == [] and m.wake_at() is None


def test_no_check_before_its_grace_then_every_interval() -> None:
    m = CheckMachine([HTTP], started=100.0)
    assert m.due(104.9) == [] and m.wake_at() == 105.0
    assert m.due(105.0) == [0]
    assert m.wake_at() is None  # running: not due again until it answered
    assert m.due(200.0) == []
    m.result(0, True, "HTTP 200 OK")
    assert m.wake_at() == 115.0  # interval counted from the start of its run
    assert m.due(114.0) == [] and m.due(115.5) == [0]
    m.result(0, True, "")
    assert m.wake_at() == 125.5


def test_a_late_answer_runs_the_next_at_once() -> None:
    m = CheckMachine([EXEC], started=0.0)
    assert m.due(0.0) == [0]
    m.result(0, True, "")  # answered at once
    assert m.due(4.0) == [0]
    m.result(0, True, "")  # pretend it answered at 9: it was due at 8, so it runs again now
    assert m.due(9.0) == [0]


def test_checking_until_every_check_passed_once() -> None:
    m = CheckMachine([HTTP, EXEC], started=0.0)
    assert m.health is Health.CHECKING
    assert m.due(0.0) == [1]  # the http check is still in its grace
    assert m.result(1, True, "exit status 0") is None
    assert m.health is Health.CHECKING
    assert m.due(5.0) == [0, 1]
    assert m.result(0, False, "connection refused") is None  # one failure of two allowed
    assert m.result(1, True, "") is None
    assert m.due(15.0) == [0, 1]
    assert m.result(0, True, "HTTP 200 OK") == Change(Health.HEALTHY)
    assert m.health is Health.HEALTHY
    assert m.result(1, True, "") is None  # no change, no news


def test_consecutive_failures_make_it_unhealthy_and_that_is_final() -> None:
    m = CheckMachine([HTTP], started=0.0)
    m.due(5.0)
    assert m.result(0, True, "HTTP 200 OK") == Change(Health.HEALTHY)
    m.due(15.0)
    assert m.result(0, False, "HTTP 500") is None
    m.due(25.0)
    assert m.result(0, True, "HTTP 200 OK") is None  # a pass resets the count
    m.due(35.0)
    assert m.result(0, False, "HTTP 500 Internal Server Error") is None
    m.due(45.0)
    change = m.result(0, False, "HTTP 503 Service Unavailable")
    assert change == Change(Health.UNHEALTHY, "http web/health", "HTTP 503 Service Unavailable")
    assert m.health is Health.UNHEALTHY and m.final
    assert m.due(1000.0) == [] and m.wake_at() is None
    assert m.result(0, True, "") is None  # a late answer changes nothing


def test_never_healthy_is_unhealthy_too_with_the_output_truncated() -> None:
    m = CheckMachine([EXEC], started=0.0)
    for t in (0.0, 4.0):
        assert m.due(t) == [0]
        last = m.result(0, False, "x" * (OUTPUT_MAX * 3))
    assert last is None  # EXEC allows 3 failures (the default)
    m.due(8.0)
    change = m.result(0, False, "y" * (OUTPUT_MAX * 3))
    assert change is not None and change.health is Health.UNHEALTHY
    assert change.check == "exec probe" and change.output == "y" * OUTPUT_MAX
