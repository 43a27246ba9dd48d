"""`gavel bench --tuning` in memory: which runs it makes (capacity first, then pairs whose
order alternates), the rates it derives from capacity, the ratios and their medians, the
verdicts, and the flags it refuses. (The runs themselves are `bench.run`'s, tested end to
end in tests/integration/test_bench_run.py.)"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gavel.bench import tuning as tu
from gavel.bench.run import Options, Result
from gavel.cli.main import main
from tests.unit.test_bench_targets import _result


def _fake(p99: dict[tuple[bool, float], list[float]], rate: dict[bool, list[float]],
          capacity: list[float]) -> tuple[Any, list[Options]]:
    """A runner whose figures come from the tables, per (tuned, offered rate) in turn."""
    made: list[Options] = []

    def run(opts: Options) -> Result:
        made.append(opts)
        tuned = opts.batch_max is None
        if opts.rate:
            return _result(round_p99_ms=p99[(tuned, opts.rate)].pop(0),
                           placements_per_s=opts.rate)
        if not tuned and opts.batch_max == 24:
            return _result(placements_per_s=capacity.pop(0))
        return _result(placements_per_s=rate[tuned].pop(0))
    return run, made


def test_capacity_comes_first_and_sets_the_open_loops_rates() -> None:
    run, made = _fake({(t, r): [10.0, 12.0] for t in (True, False)
                       for r in (1000.0, 2500.0, 4000.0)},
                      {True: [9000.0, 8000.0], False: [9500.0, 9000.0]}, [5000.0, 5000.0])
    report = tu.compare(Options(agents=50, placements=2000), run, pairs=2)
    assert report.capacity == 5000.0
    first = made[0]
    assert (first.rate, first.max_auctions, first.batch_max, first.commit_gap_ms) == (
        0.0, 1, 24, 20.0)
    rates = [c.rate for c in report.comparisons]
    assert rates == [1000.0, 2500.0, 4000.0, 0.0]
    opened = [o for o in made if o.rate == 1000.0]
    assert [o.placements for o in opened] == [round(1000 * tu.OPEN_S)] * 4
    # defaults are nothing given; the reference is the latency-tuned settings
    assert sum(o.batch_max is None and o.max_auctions is None and o.commit_gap_ms is None
               for o in opened) == 2
    closed = [o for o in made if not o.rate][2:]
    assert {(o.max_auctions, o.batch_max, o.commit_gap_ms) for o in closed} == {
        (None, None, None), (16, 256, 0.0)}
    assert all(o.agents == 50 and o.placements == 2000 for o in closed)


def test_the_order_within_a_pair_alternates() -> None:
    run, made = _fake({(t, r): [10.0] * 2 for t in (True, False)
                       for r in (1000.0, 2500.0, 4000.0)},
                      {True: [1.0] * 2, False: [1.0] * 2}, [5000.0] * 2)
    tu.compare(Options(), run, pairs=2)
    seq = [o.batch_max is None for o in made if o.rate == 2500.0]
    assert seq == [True, False, False, True]


def test_ratios_are_medians_of_the_pairs_and_each_is_judged() -> None:
    p99 = {(True, 1000.0): [10.0, 30.0, 12.0], (False, 1000.0): [10.0, 10.0, 10.0],
           (True, 2500.0): [14.0] * 3, (False, 2500.0): [10.0] * 3,
           (True, 4000.0): [16.0] * 3, (False, 4000.0): [10.0] * 3}
    run, _ = _fake(p99, {True: [8000.0, 9000.0, 9500.0], False: [10_000.0] * 3},
                   [5000.0] * 3)
    report = tu.compare(Options(), run, pairs=3)
    by = {c.rate: c for c in report.comparisons}
    assert by[1000.0].ratios == [1.0, 3.0, 1.2] and by[1000.0].ratio == 1.2
    assert by[1000.0].met and by[2500.0].met  # 1.4 <= 1.5
    assert by[4000.0].ratio == 1.6 and not by[4000.0].met
    assert by[0.0].ratio == 0.9 and by[0.0].met  # at the bound is met
    assert not report.met
    d = report.as_dict()
    assert d["all_met"] is False and len(d["comparisons"]) == 4
    assert "MISSED" in by[4000.0].line() and "met" in by[0.0].line()


@pytest.mark.parametrize("flag", [["--batch-max", "24"], ["--rate", "100"], ["--targets"],
                                  ["--scale", "0.1"], ["--ha"]])
def test_flags_of_one_run_do_not_go_with_tuning(flag: list[str],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--tuning", *flag]) == 2
    assert "cannot go with --tuning" in capsys.readouterr().err


def test_an_open_loop_run_is_never_tiny() -> None:
    run, made = _fake({(t, r): [1.0] for t in (True, False) for r in (20.0, 50.0, 80.0)},
                      {True: [1.0], False: [1.0]}, [100.0])
    tu.compare(dataclasses.replace(Options(), placements=40), run)
    assert min(o.placements for o in made if o.rate) == 500
