"""The simulator's pictures say what they show (`gavel.sim.plots`): every plot of several
policies names them in a legend, the packing time series is one small panel per policy
rather than a tangle of all of them, an error bar is drawn only where seeds give an interval,
and the console says once why one seed names no winner."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import msgspec
import pytest
from matplotlib.container import ErrorbarContainer

from gavel.cli.sim import add_arguments, run
from gavel.sim.plots import figures
from gavel.sim.policies import SimResult
from gavel.sim.verdicts import ONE_SEED


def _simulate(out: Path, *flags: str) -> SimResult:
    parser = argparse.ArgumentParser(prog="gavel sim")
    add_arguments(parser)
    assert run(parser.parse_args(["smoke", "--out", str(out), "--quiet", "--no-plots",
                                  *flags])) == 0
    return msgspec.json.decode((out / "results.json").read_bytes(), type=SimResult)


@pytest.fixture(scope="module")
def one_seed(tmp_path_factory: pytest.TempPathFactory) -> SimResult:
    return _simulate(tmp_path_factory.mktemp("one"))


def _legend_texts(fig: Any) -> set[str]:
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    for sub in getattr(fig, "subfigs", []):
        legends += list(sub.legends)
    return {t.get_text() for leg in legends for t in leg.get_texts()}


def _error_bars(fig: Any) -> int:
    return sum(isinstance(c, ErrorbarContainer) for ax in fig.axes for c in ax.containers)


def test_classes_names_every_policy_in_a_legend(one_seed: SimResult) -> None:
    drawn = figures(one_seed)
    try:
        names = {p.policy for p in one_seed.policies}
        assert names <= _legend_texts(drawn["classes.png"])
    finally:
        for fig in drawn.values():
            plt.close(fig)


def test_packing_draws_each_policy_against_its_bound_in_a_panel_of_its_own(
        one_seed: SimResult) -> None:
    drawn = figures(one_seed)
    try:
        fig = drawn["packing.png"]
        names = [p.policy for p in one_seed.policies]
        panels = {ax.get_title(): ax for ax in fig.axes if ax.get_title() in names}
        assert sorted(panels) == sorted(names)
        for ax in panels.values():
            assert [ln.get_label() for ln in ax.get_lines()] == ["nodes in use",
                                                                "packing bound"]
    finally:
        for fig in drawn.values():
            plt.close(fig)


def test_no_error_bar_at_one_seed_and_intervals_at_two(one_seed: SimResult,
                                                       tmp_path: Path) -> None:
    drawn = figures(one_seed)
    try:
        assert {name: _error_bars(fig) for name, fig in drawn.items()} == dict.fromkeys(
            drawn, 0)
    finally:
        for fig in drawn.values():
            plt.close(fig)
    two = figures(_simulate(tmp_path / "two", "--seeds", "2"))
    try:
        assert _error_bars(two["utilisation.png"]) > 0 and _error_bars(two["waits.png"]) > 0
    finally:
        for fig in two.values():
            plt.close(fig)


def test_one_seed_is_said_once_not_in_every_verdict(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _simulate(tmp_path / "said", "--policies", "gavel:mixed,random")
    out = capsys.readouterr().out
    assert out.count(ONE_SEED) == 1
    assert out.count("no difference") == 0 and out.count("best mean") >= 4
    report = (tmp_path / "said" / "report.md").read_text()
    assert report.count(ONE_SEED) == 1 and "no difference" not in report
