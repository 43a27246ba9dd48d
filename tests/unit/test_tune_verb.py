"""The `tune` verb (`broker.auctioneer` rule 13): applied, a fresh tuner pinning what is given
takes over at once - the core's batch size and rounds in flight and the committer's gap
change before the next pass - and the reply hands back the rounds the settings replaced;
only read, nothing changes; a value out of bounds, or a value given only to be read, is
refused in a sentence."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gavel.shared import subjects
from gavel.shared.api import TuneReply, TuneRequest
from gavel.shared.messages import ApiError
from gavel.shared.tuning import AUCTIONS_MOST, BATCH_MOST, GAP_MS_MOST, LADDER
from tests.unit.fuzzkit import Msg, Wire
from tests.unit.test_tuning_broker import _answer, _answer_rounds, _broker

TOP = len(LADDER) - 1


async def _tune(b: Any, **fields: Any) -> TuneReply:
    reply = await b.api.tune(TuneRequest(**fields))
    assert isinstance(reply, TuneReply), reply
    return reply


async def test_applied_pins_take_over_at_once_from_a_fresh_tuner(tmp_path: Path) -> None:
    b = _broker(tmp_path, queued=5000)  # a backlog: the tuner jumps to the throughput end
    a = b.auctioneer
    try:
        a.reconcile(b.now())
        _answer_rounds(a, 3)
        assert (a.tuner.level, a.tuner.changes) == (TOP, 1)
        before, placed = list(a.since_tuned), a.placed_total
        assert len(before) == 3
        old = a.tuner
        b._wake.clear()
        got = await _tune(b, batch_max=8, max_auctions=2, commit_gap_ms=5.0)
        assert b._wake.is_set()  # a pass runs now under the new settings
        # the settings in force at once, before any pass
        assert (a.core.batch_max, a.core.max_auctions, b.committer.gap_s) == (8, 2, 0.005)
        assert a.tuner is not old and (a.tuner.level, a.tuner.changes) == (0, 0)
        assert got == TuneReply(batch_max=8, max_auctions=2, commit_gap_ms=5.0,
                                pinned=["batch_max", "max_auctions", "commit_gap_ms"],
                                level=0, changes=0, round_ms=[1000 * s for s in before],
                                rounds=3, placed_total=placed)
        assert list(a.since_tuned) == [] and a.since_tuned_total == 0  # a new record
        # rounds opened before the change and closed after it are in neither record (only
        # those are answered: a pass the closes run may open rounds under the new settings)
        for aid in list(a.auctions):
            _answer(a, aid)
        read = await _tune(b, apply=False)
        assert (read.rounds, read.round_ms) == (0, []) == (a.since_tuned_total, [])
        # (those opened under the new settings are its record's: the next test)
        assert (a.tuner.level, a.batch_max, a.max_auctions) == (0, 8, 2)  # nothing tuned
    finally:
        b.committer.close()


async def test_the_next_pass_opens_the_rounds_pinned(tmp_path: Path) -> None:
    b = _broker(tmp_path, queued=100)
    a = b.auctioneer
    try:
        await _tune(b, batch_max=8, max_auctions=2)
        a.reconcile(b.now())
        assert [len(x.requests) for x in a.auctions.values()] == [8, 8]
        _answer_rounds(a, 3)
        assert a.since_tuned_total == 3 == len(a.since_tuned)
        assert all(len(x.requests) == 8 for x in a.auctions.values())
    finally:
        b.committer.close()


async def test_what_is_not_pinned_starts_from_the_latency_end(tmp_path: Path) -> None:
    b = _broker(tmp_path, queued=5000)
    a = b.auctioneer
    try:
        a.reconcile(b.now())
        assert a.tuner.level == TOP
        got = await _tune(b, batch_max=8)
        assert got.pinned == ["batch_max"] and (got.level, got.changes) == (0, 0)
        assert (a.core.batch_max, a.core.max_auctions) == (8, LADDER[0].max_auctions)
        assert b.committer.gap_s == LADDER[0].gap_cap_s  # as a broker started with it
        assert (got.max_auctions, got.commit_gap_ms) == (LADDER[0].max_auctions,
                                                         1000 * LADDER[0].gap_cap_s)
        a.max_auctions = 3  # the setter still pins, on the tuner now in force
        assert a.tuner.pinned_max_auctions == 3 and a.core.max_auctions == 3
        assert (await _tune(b, apply=False)).pinned == ["batch_max", "max_auctions"]
    finally:
        b.committer.close()


async def test_applied_with_nothing_given_everything_is_tuned_again(tmp_path: Path) -> None:
    b = _broker(tmp_path, queued=5000, batch_max=10, max_auctions=1, commit_gap_s=0.005)
    a = b.auctioneer
    try:
        a.reconcile(b.now())
        assert (a.batch_max, a.max_auctions, a.tuner.tuning) == (10, 1, False)
        got = await _tune(b)
        assert got.pinned == [] and a.tuner.tuning
        assert (a.core.batch_max, a.core.max_auctions, b.committer.gap_s) == (
            LADDER[0].batch_max, LADDER[0].max_auctions, LADDER[0].gap_cap_s)
        a.reconcile(b.now())  # the backlog climbs again: tuned
        assert (a.tuner.level, a.batch_max) == (TOP, LADDER[TOP].batch_max)
    finally:
        b.committer.close()


async def test_only_read_nothing_changes(tmp_path: Path) -> None:
    b = _broker(tmp_path, queued=5000)
    a = b.auctioneer
    try:
        a.reconcile(b.now())
        _answer_rounds(a, 2)
        tuner = a.tuner
        settings = (a.core.batch_max, a.core.max_auctions, b.committer.gap_s)
        for _ in range(2):  # read twice: the record is not reset by reading
            b._wake.clear()
            got = await _tune(b, apply=False)
            assert not b._wake.is_set()
            assert a.tuner is tuner and (tuner.level, tuner.changes) == (TOP, 1)
            assert (a.core.batch_max, a.core.max_auctions, b.committer.gap_s) == settings
            assert (got.batch_max, got.max_auctions, got.commit_gap_ms / 1000) == settings
            assert (got.pinned, got.level, got.changes, got.rounds) == ([], TOP, 1, 2)
            assert got.round_ms == [1000 * s for s in a.since_tuned]
    finally:
        b.committer.close()


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"batch_max": 0}, "Expected `int` >= 1 - at `$.batch_max`"),
    ({"batch_max": BATCH_MOST + 1}, f"Expected `int` <= {BATCH_MOST} - at `$.batch_max`"),
    ({"batch_max": 2.5}, "Expected `int | null`, got `float` - at `$.batch_max`"),
    ({"max_auctions": 0}, "Expected `int` >= 1 - at `$.max_auctions`"),
    ({"max_auctions": AUCTIONS_MOST + 1},
     f"Expected `int` <= {AUCTIONS_MOST} - at `$.max_auctions`"),
    ({"max_auctions": True}, "Expected `int | null`, got `bool` - at `$.max_auctions`"),
    ({"commit_gap_ms": -1.0}, "Expected `float` >= 0.0 - at `$.commit_gap_ms`"),
    ({"commit_gap_ms": math.nan}, "Expected `float` >= 0.0 - at `$.commit_gap_ms`"),
    ({"commit_gap_ms": math.inf}, f"Expected `float` <= {GAP_MS_MOST} - at `$.commit_gap_ms`"),
    ({"commit_gap_ms": GAP_MS_MOST + 1},
     f"Expected `float` <= {GAP_MS_MOST} - at `$.commit_gap_ms`"),
    ({"apply": False, "batch_max": 8},
     "tune: values are only read with apply=false: apply them, or leave them out"),
    ({"apply": False, "commit_gap_ms": 0.0},
     "tune: values are only read with apply=false: apply them, or leave them out"),
]


@pytest.mark.parametrize(("fields", "sentence"), REFUSED)
async def test_a_bad_value_is_refused_in_a_sentence_and_changes_nothing(
        tmp_path: Path, fields: dict[str, Any], sentence: str) -> None:
    b = _broker(tmp_path, queued=0)
    a = b.auctioneer
    try:
        wire = Wire()
        b.api.nc = wire
        tuner, settings = a.tuner, (a.core.batch_max, a.core.max_auctions, b.committer.gap_s)
        payload = msgspec.msgpack.encode({"kind": "tune", **fields})
        await b.api._serve("tune", Msg(subjects.API.format(verb="tune"), payload,
                                       reply="_INBOX.t"))
        [(to, data)] = wire.sent
        answer = msgspec.msgpack.decode(data, type=ApiError | TuneReply)
        assert to == "_INBOX.t" and answer == ApiError(
            error=f"malformed tune request: {sentence}")
        assert a.tuner is tuner
        assert (a.core.batch_max, a.core.max_auctions, b.committer.gap_s) == settings
    finally:
        b.committer.close()


def test_a_value_given_only_to_be_read_is_refused_where_the_request_is_made() -> None:
    with pytest.raises(ValueError, match="values are only read with apply=false"):
        TuneRequest(apply=False, max_auctions=2)
