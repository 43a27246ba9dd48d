"""The event loop every gavel process runs on: uvloop, unless told otherwise.

Rule: a node agent spends most of its CPU in the event loop and the NATS client's socket
work (the selector, the transport, task wake-ups), not in gavel's code. uvloop does that work
in C, so an agent spends less CPU a reply and the broker places more a second
(docs/performance.md).
``GAVEL_EVENT_LOOP=asyncio`` runs the standard loop (for debugging, or a platform without
uvloop); anything else is refused with a sentence.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

__all__ = ["LOOPS", "choose", "run"]

T = TypeVar("T")
LOOPS = ("uvloop", "asyncio")


def choose(env: Mapping[str, str]) -> str:
    """The loop `GAVEL_EVENT_LOOP` names (default uvloop); ValueError for another."""
    choice = env.get("GAVEL_EVENT_LOOP", "").strip() or "uvloop"
    if choice not in LOOPS:
        raise ValueError(f"GAVEL_EVENT_LOOP must be 'uvloop' or 'asyncio', not {choice!r}")
    return choice


def run(main: Coroutine[Any, Any, T], env: Mapping[str, str] | None = None) -> T:
    """`asyncio.run(main)` on the chosen loop."""
    try:
        choice = choose(os.environ if env is None else env)
    except ValueError:
        main.close()  # never awaited: say so quietly, then refuse
        raise
    if choice == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
