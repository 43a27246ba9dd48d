"""`worker.usage` on cgroup files written in a temp dir (the kernel's formats), and the
broker's usage gauges held to their series limit (`broker.metrics`)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from gavel.broker import metrics
from gavel.shared.health import Liveness
from gavel.shared.messages import Heartbeat, InstanceReport
from gavel.shared.timing import Timing
from gavel.worker.cgroups import Cgroup
from gavel.worker.usage import MIN_INTERVAL_S, Meter, Usage


def _v2(tmp_path: Path, usec: int, memory: int) -> Cgroup:
    (tmp_path / "cpu.stat").write_text(f"usage_usec {usec}\nuser_usec 1\nsystem_usec 2\n")
    (tmp_path / "memory.current").write_text(f"{memory}\n")
    (tmp_path / "memory.events").write_text("oom_kill 0\n")
    return Cgroup("v2", (tmp_path,), tmp_path, 64)


def test_cpu_is_a_rate_between_readings_and_memory_what_is_charged(tmp_path: Path) -> None:
    now = [100.0]
    meter = Meter(clock=lambda: now[0])
    cg = _v2(tmp_path, 5_000_000, 32 * 1024 * 1024)
    assert meter.measure("i", cg) == Usage(cpu=0.0, memory_mb=32.0)  # no rate from one
    now[0] += 2.0
    _v2(tmp_path, 6_000_000, 16 * 1024 * 1024)  # one cpu second in two seconds
    assert meter.measure("i", cg) == Usage(cpu=0.5, memory_mb=16.0)
    now[0] += MIN_INTERVAL_S / 2  # too soon to say anything new: the last figure
    _v2(tmp_path, 9_000_000, 1)
    assert meter.measure("i", cg) == Usage(cpu=0.5, memory_mb=16.0)


def test_no_cgroup_or_unreadable_files_measure_nothing(tmp_path: Path) -> None:
    meter = Meter(clock=lambda: 0.0)
    assert meter.measure("i", None) == Usage()
    gone = Cgroup("v2", (tmp_path / "gone",), tmp_path / "gone", 64)
    assert meter.measure("i", gone) == Usage()


def test_a_counter_that_went_back_starts_again(tmp_path: Path) -> None:
    now = [0.0]
    meter = Meter(clock=lambda: now[0])
    cg = _v2(tmp_path, 9_000_000, 0)
    meter.measure("i", cg)
    now[0] += 2
    _v2(tmp_path, 1_000_000, 0)
    assert meter.measure("i", cg).cpu == 0.0
    meter.keep([])
    assert meter._last == {}


def test_instance_usage_series_are_limited_to_the_busiest() -> None:
    liveness = Liveness(Timing())
    n = metrics.USAGE_SERIES_MAX + 50
    reports = [InstanceReport(instance_id=f"i-{k:04d}", state="running", cpu_used=k / 1000,
                              memory_used_mb=1.0) for k in range(n)]
    liveness.record(Heartbeat(node_id="a", instances=reports), 0.0)
    registry = CollectorRegistry()

    class Usage(Collector):
        def collect(self):  # type: ignore[no-untyped-def]
            return metrics._usage(liveness)

    registry.register(Usage())
    text = generate_latest(registry).decode()
    series = [line for line in text.splitlines()
              if line.startswith("gavel_instance_cpu_used{")]
    assert len(series) == metrics.USAGE_SERIES_MAX
    assert any(f'instance="i-{n - 1:04d}"' in s for s in series)  # the busiest is kept
    assert not any('instance="i-0000"' in s for s in series)  # the idlest is not
    assert "gavel_instance_usage_omitted 50.0" in text
    assert 'gavel_node_cpu_used{node="a"}' in text
