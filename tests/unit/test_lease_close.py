"""Closing the lease ends its tasks even when one swallowed a cancel (`broker.lease`)."""

from __future__ import annotations

import asyncio
import contextlib

from gavel.broker.lease import Lease


async def test_close_ends_a_task_that_swallowed_its_cancel() -> None:
    lease = Lease(object(), broker_id="a", ttl_s=1.0, renew_s=0.1, replicas=1)
    never = asyncio.Event()

    async def stubborn() -> None:  # as nats-py's request does when a cancel meets its answer
        with contextlib.suppress(asyncio.CancelledError):
            await never.wait()
        await never.wait()

    task = asyncio.create_task(stubborn())
    lease._tasks.append(task)
    await asyncio.sleep(0)
    closing = asyncio.create_task(lease.close())
    await asyncio.wait({closing}, timeout=30)
    assert closing.done() and task.done(), "close is still waiting for a task that runs on"
    await closing
