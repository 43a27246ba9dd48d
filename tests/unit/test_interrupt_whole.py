"""`bench.interrupt` rule 4: a start in a thread is waited for when its caller is cancelled,
so the cleanup that follows the cancel stops what the start made."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

from gavel.bench.interrupt import whole


async def test_a_cancel_is_raised_only_once_the_start_in_its_thread_has_ended() -> None:
    began, ended = threading.Event(), threading.Event()

    def start() -> str:
        began.set()
        time.sleep(0.3)
        ended.set()
        return "started"

    task = asyncio.ensure_future(whole(start))
    while not began.is_set():
        await asyncio.sleep(0.005)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert ended.is_set()  # what the start made exists before the cleanup runs


async def test_the_result_of_a_start_not_cancelled_comes_back() -> None:
    assert await whole(lambda: 42) == 42
