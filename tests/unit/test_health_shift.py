"""A broker that was deaf must not count its own outage against the nodes."""

from __future__ import annotations

from gavel.shared.health import Health, Liveness
from gavel.shared.messages import Heartbeat
from gavel.shared.timing import Timing


def test_shift_forgives_the_observers_outage() -> None:
    t = Timing()
    live = Liveness(t)
    live.record(Heartbeat(node_id="a"), 0.0)
    live.presume("b", 0.0)
    at = t.offline_s + 5.0
    assert live.health("a", at) is Health.OFFLINE
    live.shift(at - 1.0)  # deaf for all but the last second
    assert live.health("a", at) is Health.HEALTHY
    assert live.health("b", at) is Health.HEALTHY
