"""Closing the lease ends its tasks even when one swallowed a cancel (`broker.lease`)."""

from __future__ import annotations

import asyncio
import contextlib

from gavel.broker.lease import Holder, Lease


async def test_close_ends_a_task_that_swallowed_its_cancel() -> None:
    lease = Lease(object(), broker_id="a", ttl_s=1.0, renew_s=0.1, replicas=1)
    never = asyncio.Event()

    async def stubborn() -> None:  # as nats-py's request does when a cancel meets its answer
        with contextlib.suppress(asyncio.CancelledError):
            await never.wait()
        await never.wait()

    task = lease._tasks.spawn(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    closing = asyncio.create_task(lease.close())
    await asyncio.wait({closing}, timeout=30)
    assert closing.done() and task.done(), "close is still waiting for a task that runs on"
    await closing


async def test_a_renewal_that_crashes_loses_the_lease_at_once() -> None:
    """`transport.tasks`: a crashed renewal is reported as it happens, and the lease is lost
    then (rule 3), not when it would have run out or at close."""
    lease = Lease(object(), broker_id="a", ttl_s=1000.0, renew_s=0.1, replicas=1)
    lease.held = Holder(broker_id="a", term="t1")

    async def broken() -> None:
        raise RuntimeError("a bug")

    lease._tasks.spawn(broken(), name="lease-renew")
    for _ in range(3):
        await asyncio.sleep(0)
    assert lease.lost.is_set() and lease.held is None
    assert lease.why_lost == "lease task lease-renew failed: RuntimeError('a bug')"
    await lease.close()
