"""Restarting in place, the pure part (`worker.restarts`): which ends restart, the back-off,
the window, with the clock passed in."""

from __future__ import annotations

import signal

from gavel.shared.spec import Restart, Spec, restart_policy
from gavel.worker.restarts import describe_exit, plan, restarts_on_exit

JOB = Spec(name="j", command=["x"])
SERVICE = Spec(name="s", command=["x"], type="service")


def policy(**kw: float) -> Restart:
    return restart_policy(Spec(name="p", command=["x"], restart=Restart(**kw)))  # type: ignore[arg-type]


def test_a_job_restarts_on_a_nonzero_exit_a_service_on_any() -> None:
    assert restarts_on_exit(JOB, 1) and restarts_on_exit(JOB, -signal.SIGKILL)
    assert not restarts_on_exit(JOB, 0)
    assert not restarts_on_exit(JOB, None)  # unknown status (re-adopted): ends as exited
    assert restarts_on_exit(SERVICE, 0) and restarts_on_exit(SERVICE, 1)
    assert restarts_on_exit(SERVICE, None)


def test_the_kth_restart_waits_delay_k_then_the_policy_is_spent() -> None:
    p = policy(attempts=4, interval_s=100.0, delay_s=1.0, backoff=2.0, max_delay_s=5.0)
    times: list[float] = []
    delays = []
    now = 1000.0
    while True:
        delay, window = plan(p, times, now)
        if delay is None:
            break
        delays.append(delay)
        times = [*window, now]
        now += delay + 0.5
    assert delays == [1.0, 2.0, 4.0, 5.0]  # doubling, capped at max_delay_s
    assert len(times) == 4


def test_restarts_older_than_the_interval_no_longer_count() -> None:
    p = policy(attempts=2, interval_s=60.0, delay_s=0.2, backoff=2.0, max_delay_s=10.0)
    assert plan(p, [0.0, 10.0], 30.0) == (None, [0.0, 10.0])
    assert plan(p, [0.0, 10.0], 60.0) == (0.4, [10.0])  # the first left the window
    assert plan(p, [0.0, 10.0], 70.0) == (0.2, [])  # a fresh window: back to the first delay


def test_no_attempts_is_spent_at_once() -> None:
    assert plan(policy(attempts=0), [], 5.0) == (None, [])


def test_nomads_defaults_per_type() -> None:
    job, service = restart_policy(JOB), restart_policy(SERVICE)
    assert (job.attempts, job.interval_s, service.attempts, service.interval_s) == (
        3, 86_400.0, 2, 1_800.0)
    assert plan(job, [], 0.0) == (15.0, [])
    assert plan(service, [0.0], 1.0) == (30.0, [0.0])


def test_an_exit_as_an_operator_reads_it() -> None:
    assert describe_exit(3) == "exit status 3"
    assert describe_exit(0) == "exit status 0"
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(None) == "exit status unknown"
