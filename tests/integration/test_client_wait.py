"""`Client.wait` (`gavel.client.runwait`) against a real broker and worker: an instance that
never passes its check is `TimedOut` naming the last failing check, and an event heard by a
`Watch` made before the submit ends the wait even when it came before the wait began (an
error event leaves no trace in the status)."""

from __future__ import annotations

import asyncio
import sys

import msgspec
import pytest

from gavel.client import Client, Ended, SyncClient, TimedOut
from gavel.shared import subjects
from gavel.shared.api import InstanceStatus
from gavel.shared.messages import Event, EventType, Spec
from gavel.shared.reasons import Reason
from gavel.shared.spec import Check, Restart
from tests.integration.harness import Cluster, wait_for

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


def _down() -> Spec:
    """A service that declares its port and never listens on it."""
    return Spec(name="down", type="service", command=SLEEP, ports=["web"], cpu=0.1,
                restart=Restart(attempts=5, delay_s=3600, interval_s=7200),
                checks=[Check(type="tcp", port="web", interval_s=0.1, failures=2)])


async def test_a_wait_names_the_last_failing_check(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    async with await Client.connect(cluster.url) as client, \
            await client.watch("down-1") as watch:
        await client.submit(_down(), instance_id="down-1")
        with pytest.raises(TimedOut) as timed_out:
            await client.wait("down-1", 5, watch=watch)
    assert str(timed_out.value) == ("down-1 not healthy within 5s: unhealthy: "
                                    "tcp web: connection refused")
    assert timed_out.value.status.instance_id == "down-1"

    def sync_wait() -> str:  # the sync client's: the same wait, from a thread of its own
        with SyncClient(cluster.url) as c, c.watch("down-2") as watch:
            c.submit(_down(), instance_id="down-2")
            try:
                c.wait("down-2", 5, watch=watch)
            except TimedOut as exc:
                return str(exc)
        return "healthy"
    assert await asyncio.to_thread(sync_wait) == ("down-2 not healthy within 5s: unhealthy: "
                                                  "tcp web: connection refused")


async def test_started_waits_through_unschedulable_until_a_node_runs_it(
        cluster: Cluster) -> None:
    """`Client.started` (what a follow of logs waits for): an instance unschedulable for
    want of nodes is not the end of it - the broker asks again when a node comes."""
    await cluster.start_broker()
    job = Spec(name="late", command=[sys.executable, "-c", "print('hi')"], cpu=0.1)
    async with await Client.connect(cluster.url) as client:
        await client.submit(job, instance_id="late-1")
        with pytest.raises(TimedOut) as timed_out:
            await client.started("late-1", 2)
        assert str(timed_out.value).startswith("late-1 not running within 2s: unschedulable")
        with pytest.raises(Ended):  # what `wait` makes of the same: no node will take it
            await client.wait("late-1", 2)
        await cluster.start_agent("node-a")

        def sync_started() -> InstanceStatus:  # the sync client's: the same wait
            with SyncClient(cluster.url) as c:
                return c.started("late-1", 60)
        ran = await asyncio.to_thread(sync_started)
        assert ran.node_id == "node-a" and ran.state in ("running", "succeeded")


async def test_an_event_heard_before_the_wait_began_ends_it(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    async with await Client.connect(cluster.url) as client:
        watch = await client.watch("held-1")
        await client.submit(_down(), instance_id="held-1")
        await wait_for(lambda: cluster.holders("held-1") != [], 30, what="held-1 placed")
        # The error the auctioneer says of an auction on a pinned ref: the status keeps none.
        said = Event(instance_id="held-1", type=EventType.ERROR, reason=Reason.PINNED,
                     detail="refs/tags/v1")
        await client.nc.publish(subjects.EVENTS.format(instance="held-1"),
                                msgspec.msgpack.encode(said))
        await client.nc.flush()
        with pytest.raises(TimedOut):  # heard by nobody: the status alone does not say it
            await client.wait("held-1", 1)
        with pytest.raises(Ended) as ended:
            await client.wait("held-1", 30, watch=watch)
        await watch.close()
    assert str(ended.value) == f"held-1: {Reason.PINNED} refs/tags/v1"
    assert ended.value.status.state == "error"
