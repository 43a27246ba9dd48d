"""`bench.waits` rule 2: while a run's placements are awaited, a `stats` the broker did not
answer in time is asked again until the run's own limit; a broker that exited is said at
once. The broker's answers are stand-ins here (a real run: tests/integration/test_bench_run.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from gavel.bench import waits
from gavel.bench.verify import VerifyError
from gavel.transport.client import NoAnswer


class _Broker:
    """A broker process: running (poll None) or exited."""

    def __init__(self, exited: bool = False) -> None:
        self.exited = exited

    def poll(self) -> int | None:
        return 1 if self.exited else None


def _answers(monkeypatch: pytest.MonkeyPatch, answers: list[int | None]) -> list[int]:
    """`call` answers `stats` with these placed counts in turn (None: no answer in time);
    the last is repeated."""
    asked: list[int] = []

    async def call(nc: Any, verb: str, req: Any, reply: Any, timeout: float) -> Any:
        asked.append(len(asked))
        got = answers[min(len(asked) - 1, len(answers) - 1)]
        if got is None:
            raise NoAnswer("the broker did not answer stats within 10s")
        return SimpleNamespace(placed=got)

    monkeypatch.setattr(waits, "call", call)
    return asked


def _until(broker: _Broker, timeout_s: float = 30.0) -> Any:
    return asyncio.run(waits.until_placed(None, 3, lambda s: s.placed, 0,
                                          broker, timeout_s=timeout_s))  # type: ignore[arg-type]


def test_a_stats_not_answered_in_time_is_asked_again() -> None:
    with pytest.MonkeyPatch.context() as mp:
        asked = _answers(mp, [1, None, None, 3])
        stats = _until(_Broker())
    assert stats.placed == 3 and len(asked) == 4


def test_a_broker_that_exited_is_said_at_once() -> None:
    with pytest.MonkeyPatch.context() as mp:
        asked = _answers(mp, [None])
        with pytest.raises(RuntimeError, match="the broker exited while its placements"):
            _until(_Broker(exited=True))
    assert len(asked) == 1


def test_a_broker_that_never_answers_again_ends_at_the_runs_limit() -> None:
    with pytest.MonkeyPatch.context() as mp:
        _answers(mp, [2, None])
        with pytest.raises(VerifyError, match=r"only 2/3 placed in 0.5s \(the broker stopped "
                                              r"answering stats\)"):
            _until(_Broker(), 0.5)
