"""The converger stops when told, even where a call took the cancel as an answer: nats-py's
`flush` waits with `asyncio.wait_for`, which before Python 3.12 returns the PONG that lands
with a cancel instead of raising it. The link check then went on looping, and the worker's
stop waited `close_s` (10 s) for it."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, cast

from gavel.shared.timing import Timing
from gavel.worker.converge import Converger


class SwallowingFlush:
    """A connection whose flush, cancelled, returns as if its PONG had come."""

    is_connected = True

    def __init__(self) -> None:
        self.flushing = asyncio.Event()

    async def flush(self, timeout: int = 0) -> None:
        self.flushing.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()


async def test_a_cancel_the_link_checks_flush_swallowed_still_stops_the_converger() -> None:
    conn = SwallowingFlush()
    # close_s short: close() gives up on a loop that went on after its cancel within it
    converger = Converger(node_id="n", timing=Timing(close_s=1.0),
                          supervisor=cast(Any, None), set_draining=lambda _: None)
    converger.start_link_watch(lambda: cast(Any, conn))
    await asyncio.wait_for(conn.flushing.wait(), 30)
    await converger.close()
    running = [t.get_name() for t in converger._loops.running]
    for task in converger._loops.running:  # the failing case's loop, not left to the loop
        task.cancel()
    assert running == []
