"""Asking JetStream again: what the broker makes there (the KV mirror's bucket, the
heartbeat stream, the event history) when JetStream cannot answer yet.

Rules:
1. JetStream that is off (nobody answers its API) is final: the broker runs without what it
   could not make, as it would on a server without JetStream.
2. JetStream that is there but cannot answer yet - "temporarily unavailable" while its
   meta leader is elected (after a server restart, or a partition's heal), or no answer in
   time - is asked again every `retry_s` until it answers. Giving up there would leave the
   whole run (a leadership's whole term) without it.
3. With several brokers (`ha`) JetStream is known to be on (the lease lives there), so
   every failure is rule 2's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from enum import StrEnum

import nats.errors
import nats.js.errors

__all__ = ["Made", "again", "verdict", "why"]

#: JetStream's "temporarily unavailable" (no meta leader yet).
_UNAVAILABLE = 10008


class Made(StrEnum):
    MADE = "made"
    #: Rule 1: not in this run.
    NEVER = "never"
    #: Rule 2: ask again.
    LATER = "later"


def _transient(exc: BaseException) -> bool:
    """Rule 2: JetStream answers, just not yet."""
    if isinstance(exc, nats.js.errors.APIError):
        return exc.err_code == _UNAVAILABLE
    return isinstance(exc, (nats.errors.TimeoutError, TimeoutError))


def verdict(exc: BaseException, ha: bool) -> Made:
    """What an attempt that raised `exc` means: rule 2 or 3's LATER, else rule 1's NEVER."""
    return Made.LATER if ha or _transient(exc) else Made.NEVER


def why(exc: BaseException) -> str:
    """The sentence a log line gives for `exc`."""
    return str(exc) or type(exc).__name__


async def again(attempt: Callable[[], Awaitable[tuple[Made, str]]], retry_s: float
                ) -> tuple[bool, str]:
    """Rule 2's loop: `attempt` every `retry_s` until it is not LATER; True once made,
    False (and why) if rule 1 ends it."""
    while True:
        await asyncio.sleep(retry_s)
        made, reason = await attempt()
        if made is not Made.LATER:
            return made is Made.MADE, reason
