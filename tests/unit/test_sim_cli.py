"""`gavel sim` end to end: determinism, outputs, plots, bad scenarios."""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gavel.cli.sim import SCENARIOS, add_arguments, run
from gavel.sim.scenario import ScenarioError, load_scenario, parse_scenario


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gavel sim")
    add_arguments(parser)
    return run(parser.parse_args(argv))


@pytest.fixture(scope="module")
def smoke_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("smoke")
    assert _run([str(SCENARIOS / "smoke.toml"), "--out", str(out), "--quiet"]) == 0
    return out


def test_same_scenario_and_seed_give_byte_identical_results(tmp_path: Path,
                                                           smoke_out: Path) -> None:
    again = tmp_path / "again"
    assert _run(["smoke", "--out", str(again), "--quiet", "--no-plots"]) == 0
    assert (again / "results.json").read_bytes() == (smoke_out / "results.json").read_bytes()
    other = tmp_path / "other"
    assert _run(["smoke", "--out", str(other), "--quiet", "--no-plots", "--seed", "8"]) == 0
    assert (other / "results.json").read_bytes() != (smoke_out / "results.json").read_bytes()


def test_results_cover_every_policy_on_the_same_arrivals(smoke_out: Path) -> None:
    result = json.loads((smoke_out / "results.json").read_text())
    names = [p["policy"] for p in result["policies"]]
    assert names == ["gavel:mixed", "central-fresh", "central-stale", "random",
                     "power-of-d", "nomad-binpack"]
    assert len({p["arrivals"] for p in result["policies"]}) == 1
    gavel = result["policies"][0]
    assert set(gavel["strategies"]) == {"least-loaded", "binpack", "headroom"}
    assert sum(s["wins"] for s in gavel["strategies"].values()) == (
        gavel["placements"] + gavel["replacements"] + gavel["migrations"])
    assert gavel["replacements"] + gavel["lost"] > 0  # the failed node's instances
    assert gavel["migrations"] > 0  # the drained node's instances
    with (smoke_out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["policy"] for r in rows] == names


def test_plots_exist_are_substantial_and_distinct(smoke_out: Path) -> None:
    pngs = sorted(smoke_out.glob("*.png"))
    assert [p.name for p in pngs] == ["classes.png", "packing.png", "utilisation.png",
                                      "waits.png", "winshare.png"]
    for png in pngs:
        data = png.read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000, png.name
    assert len({hashlib.sha256(p.read_bytes()).hexdigest() for p in pngs}) == 5
    report = (smoke_out / "report.md").read_text()
    for png in pngs:
        assert f"]({png.name})" in report


def test_progress_goes_to_stderr_and_the_table_to_stdout(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["smoke", "--out", str(tmp_path), "--no-plots", "--policies",
                 "gavel:mixed,random"]) == 0
    captured = capsys.readouterr()
    assert "placements/s" in captured.out and "gavel:mixed" in captured.out
    assert "[" in captured.err and "100%" in captured.err
    result = json.loads((tmp_path / "results.json").read_text())
    assert [p["policy"] for p in result["policies"]] == ["gavel:mixed", "random"]


@pytest.mark.parametrize("name", ["smoke", "binpacking", "failure-storm", "large-fleet",
                                  "heterogeneous", "heterogeneous-1k", "heterogeneous-1k-sampling",
                                  "constrained-sampling", "strategy-mix", "rebalance",
                                  "rebalance-drift"])
def test_shipped_scenarios_parse(name: str) -> None:
    assert load_scenario(SCENARIOS / f"{name}.toml").name == name


GOOD = """
name = "t"
duration_s = 10.0
[[nodes]]
count = 2
cpu = 4.0
memory_mb = 4096
[[gavel]]
name = "g"
mix = [{ strategy = "least-loaded", share = 1.0 }]
[workload]
rate = 1.0
[[workload.classes]]
name = "w"
"""


@pytest.mark.parametrize(("edit", "field", "expected"), [
    (("count = 2", 'count = "two"'), "nodes[0].count", "expected `int`"),
    (("cpu = 4.0", "cpus = 4.0"), "nodes[0].cpus", "not a known field"),
    (("rate = 1.0", "rate = -1.0"), "workload.rate", ">= 0.0"),
    (('strategy = "least-loaded"', 'strategy = "fastest"'), "gavel[0].mix[0]",
     "unknown strategy"),
    (('name = "w"', 'name = "w"\ncpu = { values = [1.0, 2.0], weights = [1.0] }'),
     "workload.classes[0].cpu", "expected 2"),
    (('name = "w"', 'name = "w"\nduration_s = { dist = "gamma", mean = 1.0 }'),
     "workload.classes[0].duration_s.dist", "invalid value"),
    (("duration_s = 10.0\n", ""), "duration_s", "required"),
    (("cpu = 4.0", "cpu = [4.0"), "", "not valid TOML"),
    (("[workload]", "[timing]\nunreachable_s = 200.0\n[workload]"), "timing.offline_s",
     "expected"),
    (("[workload]", "[timing]\ntick_s = 0.0\n[workload]"), "timing.tick_s", "> 0.0"),
])
def test_bad_scenarios_name_the_field_and_what_was_expected(
        edit: tuple[str, str], field: str, expected: str) -> None:
    text = GOOD.replace(*edit, 1)
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text.encode(), "bad.toml")
    message = str(info.value)
    assert message.startswith("bad.toml: ")
    assert field in message and expected in message, message
    assert message.count("\n") == 0 and message.endswith(".")


def test_a_bad_scenario_file_exits_2_with_one_sentence(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD.replace("count = 2", "count = 0"))
    assert _run([str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "nodes[0].count" in err and ">= 1" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()
    assert _run([str(tmp_path / "missing.toml")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert _run([]) == 2


def test_unknown_node_in_an_event_is_a_scenario_error(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD + '\n[[events]]\nkind = "fail"\nat_s = 1.0\nnodes = ["n9999"]\n')
    assert _run([str(bad), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert "n9999" in capsys.readouterr().err


def test_bench_prints_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["--bench", "--nodes", "40", "--placements", "500"]) == 0
    out = capsys.readouterr().out
    assert "placements/s" in out and "gavel:mixed" in out


def test_bench_prints_cpu_time_and_load_beside_wall_time(
        capsys: pytest.CaptureFixture[str]) -> None:
    """On a shared machine wall time is contention: the cpu figure and the load say so."""
    assert _run(["--bench", "--nodes", "40", "--placements", "300"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"gavel:mixed +[0-9.]+ s wall \([0-9.]+ s cpu, load [0-9.]+\)", out), out


def test_bench_runs_a_shipped_scenario_scaled(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["--bench", "--scenario", "heterogeneous-1k", "--nodes", "60",
                 "--placements", "400"]) == 0
    out = capsys.readouterr().out
    assert "bench heterogeneous-1k: 60 nodes, up to 400 arrivals, 7 classes" in out
    assert "request shapes" in out and "gavel:mixed" in out and "400 arrivals" in out


#: the fields results.json had per policy before the steady-state metrics; scripts read them
OLD_FIELDS = {"policy", "kind", "description", "arrivals", "placements", "replacements",
              "migrations", "lost", "abandoned", "pending_end", "unschedulable",
              "unschedulable_rounds", "reasons", "unschedulable_by_class", "rejections", "ties",
              "latency_mean", "latency_p50", "latency_p99", "latency_max", "util_mean",
              "util_p50", "util_p99", "util_max", "imbalance", "stranded_cpu",
              "stranded_memory", "free_cpu", "free_memory", "empty_nodes", "largest_fits",
              "node_utilisation", "strategies", "series"}


@pytest.fixture(scope="module")
def seeds_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("seeds")
    assert _run(["smoke", "--seeds", "3", "--out", str(out), "--quiet", "--no-plots"]) == 0
    return out


def test_seeds_give_every_policy_intervals_and_verdicts(seeds_out: Path) -> None:
    result = json.loads((seeds_out / "results.json").read_text())
    assert result["seeds"] == [7, 8, 9] and result["seed"] == 7
    start, end = result["window_s"]
    assert 0 < start < end == result["duration_s"]
    for p in result["policies"]:
        assert set(p) >= OLD_FIELDS, p["policy"]
        cv = p["intervals"]["util_cv"]
        assert len(cv["values"]) == 3 and cv["low"] <= cv["mean"] <= cv["high"]
        assert cv["values"][0] == p["steady"]["util_cv"]  # the first seed's run
        assert set(p["steady"]["classes"]) == {"web", "db"}
        assert "classes.web.wait_p99" in p["intervals"]
    questions = [v["figure"] for v in result["verdicts"]]
    assert questions[:4] == ["util_cv", "packing_ratio", "stranded_cpu", "all.first_auction"]
    assert "classes.db.wait_p99" in questions
    for v in result["verdicts"]:
        assert v["best"] or "no difference at 3 seeds" in v["sentence"]
    report = (seeds_out / "report.md").read_text()
    assert "3 seeds (7..9)" in report and "## Verdicts" in report
    assert "max/mean (curiosity)" in report
    with (seeds_out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["steady.util_cv.low"] != ""


def test_seeds_give_the_same_bytes_twice(tmp_path: Path, seeds_out: Path) -> None:
    assert _run(["smoke", "--seeds", "3", "--out", str(tmp_path), "--quiet",
                 "--no-plots"]) == 0
    for name in ("results.json", "results.csv", "report.md"):
        assert (tmp_path / name).read_bytes() == (seeds_out / name).read_bytes(), name


def test_a_run_stopped_after_the_first_policy_keeps_its_results(tmp_path: Path) -> None:
    """A real `gavel sim` process, interrupted once it has written its first policy."""
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gavel.cli", "sim", "smoke", "--seeds", "16", "--out", str(out),
         "--no-plots"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=os.environ.copy(),
        # an ignored SIGINT is inherited (a shell's background job has one) and Python keeps
        # it ignored: the child starts with the default, as one run from a terminal does
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if "gavel:mixed: results written" in line:
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.communicate(timeout=300)[1]
    err = "".join(lines) + rest
    assert "ETA" in err and "gavel:mixed seed 7" in err
    assert proc.returncode == 130, err
    assert "stopped; 1 finished policy kept" in err
    result = json.loads((out / "results.json").read_text())
    assert [p["policy"] for p in result["policies"]] == ["gavel:mixed"]
    assert len(result["policies"][0]["intervals"]["util_cv"]["values"]) == 16
    assert "gavel:mixed" in (out / "report.md").read_text()
    assert not list(out.glob(".*.part"))


def test_the_heterogeneous_scenarios_are_labelled_multi_class_and_a_tenth_apart() -> None:
    from gavel.sim.workload import Catalogue

    big = load_scenario(SCENARIOS / "heterogeneous.toml")
    small = load_scenario(SCENARIOS / "heterogeneous-1k.toml")
    for s in (big, small):
        shapes = Catalogue(s.workload.classes).shapes
        assert len(shapes) >= 30
        assert {label for shape in shapes for label, _ in shape.labels} == {"gpu", "zone"}
        assert {g.labels.get("zone") for g in s.nodes} == {"a", "b", "c"}
        assert {g.cpu for g in s.nodes} == {8.0, 16.0, 32.0}
        assert [c.name for c in s.workload.classes] == [
            "service", "batch", "big", "gpu", "pinned-a", "pinned-b", "pinned-c"]
        assert [(e.strategy, e.share) for e in s.gavel[0].mix] == [
            ("least-loaded", 0.4), ("binpack", 0.3), ("spread", 0.2), ("headroom", 0.1)]
    assert (big.initial_nodes(), small.initial_nodes()) == (10_000, 1_000)
    assert (big.workload.max_arrivals, small.workload.max_arrivals) == (1_000_000, 100_000)
    assert big.workload.rate == pytest.approx(10 * small.workload.rate)
