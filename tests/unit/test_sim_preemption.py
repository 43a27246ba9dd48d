"""The preemption scenario in virtual time (`sim.preemption`) and the central scheduler with
preemption it is compared with (`sim.baselines.central_preempting`)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gavel.cli.sim import add_arguments
from gavel.cli.sim import run as run_cli
from gavel.shared.feasibility import NodeView
from gavel.shared.messages import Capacity, Shape, Victim
from gavel.sim.baselines import central_preempting
from gavel.sim.preemption import Kind, PreemptionScenario, load, main, run

ROOT = Path(__file__).resolve().parents[2]
SMALL = PreemptionScenario(
    name="small", seed=3, duration_s=1800.0, nodes=6, cpu=4.0, memory_mb=8192,
    urgent_from_s=300.0,
    fill=Kind(name="batch", priority=10, rate=0.08, cpu=1.0, memory_mb=512, duration_s=400.0),
    urgent=Kind(name="urgent", priority=80, rate=0.02, cpu=2.0, memory_mb=1024,
                duration_s=120.0))


def test_preemption_serves_urgent_work_at_once_and_counts_its_evictions() -> None:
    off, bids, central = run(SMALL)
    assert (off.preemptions, off.preemptions_per_hour) == (0, 0.0)
    assert bids.urgent_waiting == 0 and central.urgent_waiting == 0
    assert bids.urgent_p99_wait_s == SMALL.round_s  # one bid round, whatever the queue
    assert central.urgent_p99_wait_s == 0.0
    assert off.urgent_p99_wait_s > bids.urgent_p99_wait_s
    assert bids.preemptions > 0 and bids.preemptions_per_hour == round(
        bids.preemptions / (SMALL.duration_s / 3600.0), 1)


def test_same_scenario_same_figures() -> None:
    assert run(SMALL) == run(SMALL)


def test_the_scenario_file_loads() -> None:
    s = load(ROOT / "sim" / "scenarios" / "preemption.toml")
    assert s.urgent.priority - s.fill.priority >= 10 and s.duration_s == 3600.0


def _view(node: str, *residents: Victim, cpu: float = 4.0) -> NodeView:
    committed = Capacity()
    for r in residents:
        committed.charge(r)
    return NodeView(node_id=node, capacity=Capacity(cpu=cpu, memory_mb=4096),
                    committed=committed, residents=residents)


def _v(iid: str, priority: int, cpu: float = 1.0) -> Victim:
    return Victim(instance_id=iid, priority=priority, cpu=cpu, memory_mb=100)


def test_the_central_scheduler_places_before_it_displaces() -> None:
    views = {"n1": _view("n1", _v("a", 10, 4.0)), "n2": _view("n2", _v("b", 10, 2.0))}
    assert central_preempting(views, Shape(cpu=1.0, memory_mb=100, priority=80)) == ("n2", [])


def test_the_central_scheduler_takes_the_cheapest_displacement() -> None:
    views = {"n1": _view("n1", _v("a", 10), _v("b", 10), _v("c", 10), _v("d", 10)),
             "n2": _view("n2", _v("e", 30, 2.0), _v("f", 60, 2.0))}
    need = Shape(cpu=2.0, memory_mb=100, priority=80)
    assert central_preempting(views, need) == ("n2", ["e"])  # one eviction beats two
    assert central_preempting(views, Shape(cpu=2.0, memory_mb=100, priority=65)) == (
        "n2", ["e"])
    assert central_preempting(views, Shape(cpu=2.0, memory_mb=100, priority=15)) is None


def test_the_command_prints_the_three_schedulers(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    text = (ROOT / "sim" / "scenarios" / "preemption.toml").read_text()
    small = tmp_path / "small.toml"
    small.write_text(text.replace("duration_s = 3600.0", "duration_s = 700.0")
                     .replace("nodes = 40", "nodes = 4"))
    assert main([str(small)]) == 0
    direct = capsys.readouterr().out
    for policy in ("gavel, no preemption", "gavel, preemption by bids",
                   "central, preemption"):
        assert policy in direct
    parser = argparse.ArgumentParser(prog="gavel sim")
    add_arguments(parser)
    assert run_cli(parser.parse_args([str(small)])) == 0  # `gavel sim FILE` runs it too
    assert capsys.readouterr().out == direct
