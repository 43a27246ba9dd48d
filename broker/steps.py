"""Long reads in steps: a pure computation over every replica of a large service, written as
a generator that yields where the event loop may run other work, and returns its result.

Rules:
1. A computation in steps (`Steps`) is pure: it yields every `EVERY` items it reads and
   reads no clock; what it returns is what the same code returns run to its end in one go
   (`at_once`), whoever drives it. The tests call `at_once`; the broker calls `drive`.
2. `drive` runs the steps on the event loop and gives the loop a turn once a slice of
   `slice_s` has passed since the last, so no single step of the loop is longer than a
   slice plus one step's `EVERY` items: a pass over a hundred thousand replicas no longer
   holds the API's answers back for the whole of it (docs/performance.md, "Large counts").
   It says how long the steps themselves ran, the loop's other work between them left out.
3. What a computation reads between two of its steps may change meanwhile (a commit
   adopted, a heartbeat heard): it reads each item once, as it is when it comes to it, and
   never iterates a container that may grow under it (it copies the keys first).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import TypeVar

__all__ = ["EVERY", "SLICE_S", "Steps", "at_once", "chunks", "drive"]

T = TypeVar("T")
#: A computation in steps that returns a T (rule 1).
Steps = Generator[None, None, T]
#: Items a computation reads between two yields (rule 1).
EVERY = 500
#: How long the steps run before the loop gets a turn (rule 2).
SLICE_S = 0.02


def chunks(items: Sequence[T]) -> Iterator[Sequence[T]]:
    """`items` in runs of `EVERY`, for a computation to yield between (rule 1)."""
    for at in range(0, len(items), EVERY):
        yield items[at:at + EVERY]


def at_once(steps: Steps[T]) -> T:
    """Rule 1: the computation run to its end in one go."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


async def drive(steps: Steps[T], slice_s: float | None = None,
                clock: Callable[[], float] = time.perf_counter) -> tuple[T, float]:
    """Rule 2: the computation's result, and the seconds of `clock` its own steps ran
    (`slice_s` None: `SLICE_S`)."""
    if slice_s is None:
        slice_s = SLICE_S
    ran = 0.0
    began = clock()
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value, ran + clock() - began
        now = clock()
        if now - began >= slice_s:
            ran += now - began
            await asyncio.sleep(0)
            began = clock()
