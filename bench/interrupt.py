"""Every harness (`chaos`, `chaosha`, `bench`) stops what it started on any way out.

Rules:
1. A harness's main coroutine runs under `stopped_by_signals`: SIGTERM and SIGHUP cancel it
   as Ctrl-C (SIGINT, which `asyncio.run` already turns into a cancel) does, so its one
   `finally` - the cleanup that stops the cluster, the workers and their instances - runs
   on every way out but SIGKILL. Without it SIGTERM ended the harness at once and left a
   whole cluster, instances and all, running.
2. The cleanup itself blocks rather than awaits: a second signal while it runs cannot cut
   it short.
3. `Interrupted` is what the run raises then: the harness reports a broken run, exit 1.
4. A start that blocks runs in a thread through `whole`: a cancel waits for the thread to
   end before it goes on, so what the thread started is there when the cleanup stops it.
   (`asyncio.to_thread` lets the cancel through at once while its thread goes on starting
   brokers and workers after the cleanup has run.)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import signal
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["Interrupted", "stopped_by_signals", "whole"]

T = TypeVar("T")
_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
#: Rule 4's threads: a harness runs at most a start and a restart at once.
_STARTS = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="start")


class Interrupted(Exception):
    """The run was stopped by a signal; what it started has been stopped."""


async def stopped_by_signals(run: Awaitable[T]) -> T:
    """Rule 1: `run`, cancelled by SIGTERM or SIGHUP (and SIGINT), then `Interrupted`."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(run)
    got: list[str] = []

    def stop(sig: signal.Signals) -> None:
        got.append(sig.name)
        task.cancel()

    for sig in _SIGNALS:
        loop.add_signal_handler(sig, stop, sig)
    try:
        return await task
    except asyncio.CancelledError:
        if not got and not task.cancelled():
            raise
        raise Interrupted(f"stopped by {got[0] if got else 'SIGINT'}") from None
    finally:
        for sig in _SIGNALS:
            loop.remove_signal_handler(sig)


async def whole(start: Callable[[], T]) -> T:
    """Rule 4: `start()` in a thread; a cancel is raised only once the thread has ended (a
    start not yet begun never begins). Blocking, as the cleanup is (rule 2)."""
    running = _STARTS.submit(start)
    try:
        return await asyncio.wrap_future(running)
    except asyncio.CancelledError:
        concurrent.futures.wait([running])
        raise
