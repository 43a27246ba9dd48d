"""`gavel submit --wait[=MODE]` parses as the docs say: a bare --wait (before or after the
spec) waits for a job's end, --wait=running for running and healthy, anything else is
refused naming the forms."""

from __future__ import annotations

import pytest

from gavel.cli.cmdline import build_parser, wait_modes


def parse(*argv: str) -> str | None:
    args = build_parser().parse_args(wait_modes(list(argv)))
    assert args.spec.name == "job.toml"
    wait: str | None = args.wait
    return wait


def test_a_bare_wait_is_the_end_and_never_takes_the_spec_for_its_value() -> None:
    assert parse("submit", "--wait", "job.toml") == "end"
    assert parse("submit", "job.toml", "--wait") == "end"
    assert parse("submit", "job.toml") is None


def test_wait_running_and_wait_end() -> None:
    assert parse("submit", "job.toml", "--wait=running") == "running"
    assert parse("submit", "--wait=end", "job.toml") == "end"


def test_another_wait_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("submit", "job.toml", "--wait=healthy")
    assert "say --wait=end or --wait=running" in capsys.readouterr().err


def test_other_verbs_keep_their_own_wait() -> None:
    assert wait_modes(["deploy", "web.toml", "--wait"]) == ["deploy", "web.toml", "--wait"]
