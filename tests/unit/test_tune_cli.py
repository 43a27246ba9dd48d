"""`gavel tune`'s command line: a value out of bounds, or ``--auto`` beside a value, is one
sentence and exit 2 before anything is asked; no value reads, values pin, ``--auto``
releases, and the answer is printed as settings, pins and rounds."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from gavel.cli import tunecmd, verbflags
from gavel.cli.main import main
from gavel.shared.api import TuneReply

#: Nothing listens there: a line that got as far as asking would exit 1, not 2.
NOWHERE = ["--nats", "nats://127.0.0.1:1"]


@pytest.mark.parametrize(("argv", "sentence"), [
    (["--batch-max", "0"], "argument --batch-max: '0' must be greater than 0"),
    (["--batch-max", "10001"], "argument --batch-max: '10001' must be at most 10000"),
    (["--max-auctions", "2.5"], "argument --max-auctions: '2.5' is not a whole number"),
    (["--max-auctions", "1001"], "argument --max-auctions: '1001' must be at most 1000"),
    (["--commit-gap-ms", "-1"], "argument --commit-gap-ms: '-1' must be 0 or more"),
    (["--commit-gap-ms", "nan"], "argument --commit-gap-ms: 'nan' must be 0 or more"),
    (["--commit-gap-ms", "inf"], "argument --commit-gap-ms: 'inf' must be a finite number"),
    (["--commit-gap-ms", "10000.5"], "argument --commit-gap-ms: '10000.5' must be at most 10000"),
])
def test_a_bad_value_is_one_sentence_and_exit_2(
        argv: list[str], sentence: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["tune", *NOWHERE, *argv])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().endswith(f"gavel tune: error: {sentence}")


def test_auto_beside_a_value_is_one_sentence_and_exit_2(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", *NOWHERE, "--auto", "--commit-gap-ms", "3"]) == 2
    assert capsys.readouterr().err.strip() == (
        "gavel tune: --auto tunes every value: give it alone, or only the values to pin")


REPLY = TuneReply(batch_max=8, max_auctions=2, commit_gap_ms=12.5, pinned=["batch_max"],
                  level=0, changes=0, round_ms=[4.0, 1.0, 3.0, 2.0], rounds=7,
                  placed_total=40)


class Asked:
    """Stands in for `gavel.client.Client`: what `tune` was asked, and `REPLY`."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []

    async def __aenter__(self) -> Asked:
        return self

    async def __aexit__(self, *_: object) -> None:
        return None

    async def tune(self, **kw: Any) -> TuneReply:
        self.asked.append(kw)
        return REPLY


@pytest.mark.parametrize(("argv", "asked", "whose"), [
    ([], {"batch_max": None, "max_auctions": None, "commit_gap_ms": None, "apply": False},
     "since the last change"),
    (["--batch-max", "8", "--commit-gap-ms", "12.5"],
     {"batch_max": 8, "max_auctions": None, "commit_gap_ms": 12.5, "apply": True},
     "the settings replaced"),
    (["--auto"], {"batch_max": None, "max_auctions": None, "commit_gap_ms": None,
                  "apply": True}, "the settings replaced"),
])
async def test_no_value_reads_values_pin_and_auto_releases(
        argv: list[str], asked: dict[str, Any], whose: str,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    client = Asked()

    async def connect(*_: object, **__: object) -> Asked:
        return client

    monkeypatch.setattr(tunecmd.Client, "connect", connect)
    p = argparse.ArgumentParser()
    p.add_argument("--json", action="store_true")
    verbflags.tune_arguments(p)
    args = p.parse_args(argv)
    args.nats, args.creds = "nats://x:1", None
    assert await tunecmd.tune(args) == 0
    assert client.asked == [asked]
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in out[1:4]] == [
        ["batch-max", "8", "pinned"], ["max-auctions", "2", "tuned"],
        ["commit-gap-ms", "12.5", "tuned"]]
    assert out[4] == "tuner level 0, 0 changes; 40 placed since the broker started"
    assert out[5] == (f"{whose}: 7 bid rounds closed, p50 2.0 ms, p99 4.0 ms (of the last 4)")
