"""`gavel bench --targets` in memory: the targets as the throughput issue states them, the
verdict arithmetic, scaling, and the flags that cannot go together. (A real scaled run of a
target: tests/integration/test_bench_run.py.)"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest

from gavel.bench import targets as tg
from gavel.bench.run import Options, Result
from gavel.cli.bench import add_arguments
from gavel.cli.main import main


def _result(**figures: Any) -> Result:
    """A `Result` with every field zero (or empty) but `figures`."""
    base: dict[str, Any] = {}
    for f in dataclasses.fields(Result):
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        base[f.name] = "" if f.type == "str" else (False if f.type == "bool" else 0)
    return Result(**{**base, **figures})


def test_the_issue_s_targets_with_its_numbers() -> None:
    bounds = {t.name: {(b.key, b.limit, b.most) for b in t.bounds} for t in tg.TARGETS}
    assert bounds == {
        "sampled": {("placements_per_s", 5000, False), ("round_p99_ms", 20, True)},
        "broadcast": {("placements_per_s", 1000, False), ("round_p99_ms", 50, True)},
        "10k": {("placements_per_s", 2000, False), ("broker_rss_mb", 300, True)},
        "idle": {("idle_worker_cpu_pct", 1, True), ("idle_worker_rss_mb", 40, True)},
    }
    by = {t.name: t.options() for t in tg.TARGETS}
    assert (by["sampled"].agents, by["sampled"].mode) == (1000, "sampled")
    assert (by["broadcast"].agents, by["broadcast"].mode) == (1000, "broadcast")
    assert (by["10k"].agents, by["10k"].mode) == (10_000, "sampled")
    assert by["idle"].idle_s > 0  # the idle worker is measured only when asked for
    # The README's rows: the latency settings for sampled, one round and a batch wait for
    # broadcast.
    s, b = by["sampled"], by["broadcast"]
    assert (s.max_auctions, s.batch_max, s.commit_gap_ms) == (1, 24, 20.0)
    assert (b.rate, b.max_auctions, b.batch_wait_ms) == (1100.0, 1, 100.0)
    assert all(not o.progress for o in by.values())


def test_a_bound_is_met_at_its_limit_and_on_its_side_only() -> None:
    most, least = tg.at_most("round_p99_ms", 20), tg.at_least("placements_per_s", 5000)
    assert most.holds(20) and most.holds(19.9) and not most.holds(20.01)
    assert least.holds(5000) and least.holds(6000) and not least.holds(4999.9)
    assert str(most) == "round_p99_ms <= 20" and str(least) == "placements_per_s >= 5000"


def test_a_bound_on_a_figure_no_run_reports_is_refused() -> None:
    with pytest.raises(ValueError, match="'round_p98_ms', which no bench run reports"):
        tg.at_most("round_p98_ms", 20)


def test_checks_read_the_run_s_figures() -> None:
    (sampled,) = tg.by_name(["sampled"])
    found = tg.checks(sampled, _result(placements_per_s=5123.4, round_p99_ms=20.5))
    assert [(c.bound.key, c.value, c.met) for c in found] == [
        ("placements_per_s", 5123.4, True), ("round_p99_ms", 20.5, False)]
    assert found[1].as_dict() == {"key": "round_p99_ms", "limit": 20, "at_most": True,
                                  "value": 20.5, "met": False}
    line = tg.report_line(sampled, 2, 3, found)
    assert line.startswith("sampled    run 2/3  placements_per_s 5,123.40 >= 5,000 met")
    assert line.endswith("round_p99_ms 20.50 <= 20 MISSED")


def test_targets_by_name_keep_their_order_and_refuse_strangers() -> None:
    assert [t.name for t in tg.by_name([])] == ["sampled", "broadcast", "10k", "idle"]
    assert [t.name for t in tg.by_name(["idle", "sampled"])] == ["sampled", "idle"]
    with pytest.raises(ValueError, match="no target named 'fast' \\(the targets: sampled, "):
        tg.by_name(["sampled", "fast"])


def test_scaling_shrinks_agents_and_placements_and_keeps_the_rest() -> None:
    opts = Options(agents=10_000, placements=50_000, batch_max=24, processes=4)
    assert tg.scaled(opts, 1.0) is opts
    small = tg.scaled(opts, 0.01)
    assert (small.agents, small.placements, small.processes) == (100, 500, 4)
    assert small.batch_max == 24
    tiny = tg.scaled(opts, 0.00001)
    assert (tiny.agents, tiny.placements, tiny.processes) == (4, 40, 4)
    few = tg.scaled(Options(agents=300, placements=1000, processes=4), 0.01)
    assert (few.agents, few.processes) == (4, 4)
    assert tg.scaled(Options(agents=100, processes=8), 0.05).processes == 5


@pytest.mark.parametrize(("argv", "said"), [
    (["--targets", "--batch-max", "8"],
     "gavel bench: --batch-max cannot go with --targets: each target runs with its own "
     "settings."),
    (["--targets", "--agents", "10"], "gavel bench: --agents cannot go with --targets"),
    (["--repeat", "2"], "gavel bench: --repeat only goes with --targets."),
    (["--only", "sampled"], "gavel bench: --only only goes with --targets."),
    (["--targets", "--only", "fast"], "gavel bench: --only: no target named 'fast'"),
])
def test_flags_that_do_not_go_together_are_refused_with_a_sentence(
        argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", *argv]) == 2
    assert capsys.readouterr().err.startswith(said)


def test_a_missed_bound_sets_the_exit_status_unless_the_run_was_scaled(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The verdict wiring only: each run's figures stand in for a bench run (real runs:
    tests/integration/test_bench_run.py)."""
    ran: list[Options] = []

    async def fake_run(opts: Options) -> Result:
        ran.append(opts)
        return _result(placements_per_s=4900.0, round_p99_ms=12.0)

    monkeypatch.setattr("gavel.bench.run.run", fake_run)
    assert main(["bench", "--targets", "--only", "sampled", "--repeat", "2"]) == 3
    out = capsys.readouterr().out
    assert out.count("placements_per_s 4,900.00 >= 5,000 MISSED") == 2
    assert out.rstrip().endswith("0 of 2 runs met every bound")
    assert [o.agents for o in ran] == [1000, 1000]
    assert main(["bench", "--targets", "--only", "sampled", "--scale", "0.1"]) == 0
    assert "(scaled: not a verdict on the targets)" in capsys.readouterr().out
    assert ran[-1].agents == 100


def test_the_help_names_every_target() -> None:
    p = argparse.ArgumentParser()
    add_arguments(p)
    (only,) = [a for a in p._actions if a.dest == "only"]
    assert only.help is not None
    assert only.help.endswith(": " + ", ".join(t.name for t in tg.TARGETS))
