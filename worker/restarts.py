"""Restarting a process in place: which ends restart it, how long to wait, when to give up.

Pure: the caller passes `now` (wall-clock seconds, so the count survives a worker restart
through ``agent.json``).

Rules:
1. A job's process is restarted when it exits non-zero (a signal it did not get from its
   worker counts), a service's whenever it ends, and any instance's when its checks find it
   unhealthy. An end whose status is unknown (a process re-adopted after a worker restart,
   no longer our child) restarts a service and ends a job as exited, as it always did.
2. The restarts of the last `interval_s` are counted: while there are fewer than `attempts`,
   the k-th of them (k >= 1) starts after `delay(k)` (the back-off); with `attempts` of them
   in the window the policy is spent and the node hands the instance back to the broker.
3. A policy of no attempts restarts nothing, and an exit is then the instance's end where it
   ran (exited, or failed with a non-zero status), as before restart policies existed; an
   unhealthy instance is handed back at once.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence

from gavel.shared.spec import Restart, Spec

__all__ = ["describe_exit", "plan", "restarts_on_exit"]


def restarts_on_exit(spec: Spec, code: int | None) -> bool:
    """Rule 1: whether the process ending with `code` (None: unknown) is restarted."""
    if spec.service:
        return True
    return code is not None and code != 0


def plan(policy: Restart, recent: Sequence[float], now: float) -> tuple[float | None, list[float]]:
    """Rule 2: the wait before the next restart (None: the policy is spent), and the times
    of the restarts still inside the policy's interval at `now`, the next one not included.
    `policy` is resolved (`restart_policy`)."""
    assert policy.attempts is not None and policy.interval_s is not None, "a resolved policy"
    window = [t for t in recent if now - t < policy.interval_s]
    if len(window) >= policy.attempts:
        return None, window
    return policy.delay(len(window) + 1), window


def describe_exit(code: int | None) -> str:
    """How a process ended, as an operator reads it."""
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"
