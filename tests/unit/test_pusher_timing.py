"""A broker's pusher backs off by the broker's `Timing`: its first pause `retry_s`, doubling up
to `retry_max_s`, both clocks of the protocol that fast timers shrink (`shared.timing` rule 1);
the HA broker's pusher is made the same way (`broker.ha`)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from gavel.cli.daemons import _pusher_of
from gavel.shared.timing import Timing


def test_the_pushers_back_off_is_the_brokers_timing(tmp_path: Path) -> None:
    fast = Timing.from_env({"GAVEL_FAST_TIMERS": "1"})
    metrics: Any = SimpleNamespace(registry=CollectorRegistry())
    ledger: Any = SimpleNamespace(path=tmp_path, ref="refs/heads/state")
    pusher = _pusher_of("file:///nowhere.git", metrics, fast)(ledger, lambda: None)
    try:
        assert (pusher.backoff_s, pusher.max_backoff_s) == (fast.retry_s, fast.retry_max_s)
        assert (fast.retry_s, fast.retry_max_s) == (0.05, 6.0)
        assert Timing().retry_max_s == 60.0  # production's cap, as it was
    finally:
        pusher._pool.shutdown()
