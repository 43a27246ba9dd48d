"""Who owns a task: every task a part starts is spawned on the part's `Tasks`.

Rules:
1. A task has one owner. `Tasks.spawn` keeps a strong reference to it until it ends and
   forgets it then, so the owner holds exactly the tasks still running.
2. A task that ends with an exception is reported at once, not when its owner closes: one
   log line, "<owner> task <name> failed", with its traceback, and the owner's `crashed`
   hook is called with a `Crashed` naming it, so the part reacts now (the broker stops
   with it, the worker's agent stops and leaves its instances to the next). A task that
   is cancelled, or returns, is no crash, nor one that fails once its owner told it to
   stop: what it raised on the way out changes nothing (logged at debug).
3. Nothing outlives its owner: `aclose` cancels every task and awaits them, bounded; one
   still running after the bound is logged as "<owner> task <name> did not stop within
   <s>s", never a part that cannot stop. A task spawned once the owner is closed is
   cancelled before it runs.
4. One task's crash leaves its siblings running. That is why this is not an
   `asyncio.TaskGroup`: a group cancels every sibling at the first failure and raises it
   only when its `async with` block ends, whereas a part here lives from `start` to
   `close` rather than in one block, holds per-request tasks whose failure is that
   request's alone, and decides for itself what a crash of one loop means.
5. `until` runs one piece of work as long as a part is not told to stop: a part told to
   stop while it starts, or while it waits for something, stops there rather than when the
   work ends (each JetStream request of a start can wait out its timeout). A cancel the
   work swallows is repeated until one takes (nats-py's first connect swallows one that
   lands while it sets up an attempt, and retries a refused credential for ever).
   `opened_until` is `until` for work that opens something to close (a connection): what
   it opened, or None when told to stop first - anything opened meanwhile is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

__all__ = ["CANCEL_AGAIN_S", "Crashed", "Tasks", "opened_until", "until"]

#: Rule 5: how long `until` waits for a cancel to take before it cancels again.
CANCEL_AGAIN_S = 0.05

T = TypeVar("T")


class _Closable(Protocol):
    async def close(self) -> Any: ...


C = TypeVar("C", bound=_Closable)


class Crashed(Exception):
    """A task of a part ended with an exception (rule 2); its sentence names the task."""

    def __init__(self, owner: str, name: str, error: BaseException) -> None:
        super().__init__(f"{owner} task {name} failed: {error!r}")
        self.owner, self.name, self.error = owner, name, error


class Tasks:
    """The tasks one part started (rules 1-4). `owner` names the part in every line logged."""

    def __init__(self, owner: str, log: logging.Logger, *,
                 crashed: Callable[[Crashed], None] | None = None) -> None:
        self.owner = owner
        self._log = log
        self._crashed = crashed
        self._running: set[asyncio.Task[Any]] = set()
        self._closed = False

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
        """Run `coro` as a task this owner holds until it ends (rule 1)."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        if self._closed:  # rule 3: it never runs
            task.cancel()
            return task
        self._running.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._running.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            return
        name = task.get_name()
        if self._closed:
            self._log.debug("%s task %s failed as it stopped: %r", self.owner, name, error)
            return
        self._log.error("%s task %s failed", self.owner, name, exc_info=error)
        if self._crashed is not None:
            self._crashed(Crashed(self.owner, name, error))

    def __len__(self) -> int:
        return len(self._running)

    def __bool__(self) -> bool:
        return bool(self._running)

    @property
    def running(self) -> frozenset[asyncio.Task[Any]]:
        """The tasks still running."""
        return frozenset(self._running)

    def cancel(self) -> None:
        """Cancel every task and take no more, without waiting (an abort; `aclose` awaits)."""
        self._closed = True
        for task in list(self._running):
            task.cancel()

    async def aclose(self, timeout: float | None) -> None:
        """Rule 3: cancel every task and wait up to `timeout` for all of them to end."""
        self.cancel()
        await self.wait(timeout)

    async def wait(self, timeout: float | None) -> None:
        """Wait up to `timeout` (None: as long as they take) for the tasks running now to
        end; log each one that has not."""
        if not self._running:
            return
        _, stuck = await asyncio.wait(set(self._running), timeout=timeout)
        for task in stuck:
            self._log.error("%s task %s did not stop within %gs", self.owner, task.get_name(),
                            timeout)


async def until(stopped: asyncio.Event, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """Rule 5: `work` as a task, awaited until it ends or `stopped` is set, whichever comes
    first; if `stopped` came first the task is cancelled, and awaited. The caller reads the
    task: `cancelled()`, or `result()` (what the work returned, or raised)."""
    doing = asyncio.ensure_future(work)
    told = asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait((doing, told), return_when=asyncio.FIRST_COMPLETED)
    finally:
        told.cancel()
        while not doing.done():
            doing.cancel()
            await asyncio.wait((doing,), timeout=CANCEL_AGAIN_S)
    return doing


async def opened_until(stopped: asyncio.Event, opening: Coroutine[Any, Any, C]) -> C | None:
    """Rule 5: what `opening` opened, or None when `stopped` was set first (then anything
    it opened meanwhile is closed); what it raised is raised."""
    doing = await until(stopped, opening)
    if doing.cancelled():
        return None
    opened = doing.result()
    if stopped.is_set():
        with contextlib.suppress(Exception):
            await opened.close()
        return None
    return opened
