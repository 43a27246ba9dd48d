"""`gavel status NAME` of a periodic job (`gavel.cli.readouts.periodic`): its fire times as
its schedule reads them, in its own time zone, which the table names."""

from __future__ import annotations

import pytest

from gavel.cli import readouts
from gavel.shared.api import PeriodicStatus
from gavel.shared.records import PeriodicRun


def test_fire_times_are_shown_in_the_jobs_time_zone_and_the_zone_is_said(
        capsys: pytest.CaptureFixture[str]) -> None:
    p = PeriodicStatus(name="nightly", schedule="0 2 * * *", time_zone="Europe/Riga",
                       last_run="2026-12-02T00:00:00Z", next_run="2026-12-03T00:00:00Z",
                       history=[PeriodicRun(at="2026-12-02T00:00:00Z",
                                            instance_id="nightly-20261202t000000z",
                                            outcome="succeeded"),
                                PeriodicRun(at="2026-07-01T23:00:00Z", skipped="skipped: x")])
    readouts.periodic(p)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "periodic job nightly: schedule '0 2 * * *' (Europe/Riga), overlap skip"
    assert lines[1] == "last run 2026-12-02 02:00:00 EET  next run 2026-12-03 02:00:00 EET"
    assert lines[2].split() == ["FIRE", "TIME", "(Europe/Riga)", "RUN", "OUTCOME"]
    assert lines[3].split()[:4] == ["2026-12-02", "02:00:00", "EET", "nightly-20261202t000000z"]
    assert lines[4].split()[:3] == ["2026-07-02", "02:00:00", "EEST"]  # summer time


def test_utc_by_default_and_nothing_yet_is_a_dash(capsys: pytest.CaptureFixture[str]) -> None:
    readouts.periodic(PeriodicStatus(name="tick", schedule="@hourly",
                                     next_run="2026-12-02T07:00:00Z"))
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "last run -  next run 2026-12-02 07:00:00 UTC"
    assert lines[2].split() == ["FIRE", "TIME", "(UTC)", "RUN", "OUTCOME"]
