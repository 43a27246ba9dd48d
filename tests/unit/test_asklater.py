"""`transport.asklater`: which failures of JetStream are asked again, and the loop."""

from __future__ import annotations

import asyncio

import nats.errors
import nats.js.errors

from gavel.transport.asklater import Made, again, verdict


def test_temporarily_unavailable_and_no_answer_in_time_are_asked_again() -> None:
    unavailable = nats.js.errors.ServiceUnavailableError(code=503, err_code=10008)
    for exc in (unavailable, nats.errors.TimeoutError(), TimeoutError()):
        assert verdict(exc, ha=False) is Made.LATER


def test_jetstream_off_or_refusing_is_final_unless_several_brokers_run() -> None:
    refused = nats.js.errors.BadRequestError(code=400, err_code=10058)
    for exc in (nats.errors.NoRespondersError(), refused):
        assert verdict(exc, ha=False) is Made.NEVER
        assert verdict(exc, ha=True) is Made.LATER  # rule 3: JetStream is known to be on


def test_the_loop_asks_until_an_answer_that_is_not_later() -> None:
    answers = [(Made.LATER, "electing"), (Made.LATER, "electing"), (Made.MADE, "")]
    asked: list[int] = []

    async def attempt() -> tuple[Made, str]:
        asked.append(1)
        return answers.pop(0)

    assert asyncio.run(again(attempt, 0.0)) == (True, "")
    assert len(asked) == 3
    answers[:] = [(Made.LATER, "electing"), (Made.NEVER, "no responders")]
    assert asyncio.run(again(attempt, 0.0)) == (False, "no responders")
