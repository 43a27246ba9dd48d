"""The dashboard's usage history (`gavel.cli.ui.usage`): a point per instance at most every
interval, the last few kept, only running instances, at most so many of them."""

from __future__ import annotations

from gavel.cli.ui.usage import History
from gavel.shared.api import InstanceStatus


def inst(iid: str, cpu: float, mb: float, state: str = "running",
         node: str = "n1") -> InstanceStatus:
    return InstanceStatus(instance_id=iid, name="x", state=state, node_id=node, cpu_used=cpu,
                          memory_used_mb=mb)


def test_a_point_at_most_every_interval_and_the_last_ones_kept() -> None:
    h = History(every_s=2.0, points=3)
    for t in (0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0):
        h.record(t, [inst("a", t / 10, 100 + t)])
    assert h.of("a") == [[4.0, 0.4, 104.0], [6.0, 0.6, 106.0], [8.0, 0.8, 108.0]]
    assert h.of("never") == []


def test_only_running_instances_on_a_node_and_the_gone_forgotten() -> None:
    h = History(every_s=1.0)
    h.record(0.0, [inst("a", 1, 1), inst("q", 1, 1, state="queued", node=""),
                   inst("p", 1, 1, state="placed")])
    assert (h.of("a"), h.of("q"), h.of("p")) == ([[0.0, 1.0, 1.0]], [], [])
    h.record(1.0, [inst("a", 2, 2, state="succeeded")])
    assert h.of("a") == []


def test_at_most_so_many_instances_the_first_heard_first() -> None:
    h = History(every_s=1.0, instances_max=2)
    h.record(0.0, [inst("a", 1, 1), inst("b", 1, 1), inst("c", 1, 1)])
    assert [bool(h.of(i)) for i in "abc"] == [True, True, False]
    h.record(1.0, [inst("b", 1, 1), inst("c", 1, 1)])  # a gone: c has room now
    assert [len(h.of(i)) for i in "abc"] == [0, 2, 1]
