"""The leadership lease against a real nats-server's JetStream KV (one server: R1).

One broker holds it at a time; a standby takes it only once the holder's lease lapsed or it
let go; a refused renewal, or the TTL running out on the holder's own clock, loses it at
once; every new holder's revision is above the last one's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any

import nats
import nats.js.api
import pytest

from gavel.broker.lease import Lease
from gavel.shared import subjects
from gavel.transport.natsserver import NatsServer
from tests.integration.harness import wait_for

pytestmark = pytest.mark.integration


class Conns:
    """Connections to the test's nats-server, each closed at the end."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.made: list[Any] = []

    async def new(self) -> Any:
        nc = await nats.connect(self.url)
        self.made.append(nc)
        return nc

    async def lease(self, name: str, ttl: float = 2.0, renew: float = 0.3,
                    clock: Callable[[], float] | None = None) -> Lease:
        kw: dict[str, Any] = {} if clock is None else {"clock": clock}
        got = Lease(await self.new(), broker_id=name, ttl_s=ttl, renew_s=renew, replicas=1,
                    **kw)
        await got.open()
        return got


@pytest.fixture
async def conns(nats_url: str) -> AsyncIterator[Conns]:
    c = Conns(nats_url)
    yield c
    for nc in c.made:
        with contextlib.suppress(Exception):
            await nc.close()


async def test_one_holds_and_a_standby_takes_over_only_once_it_lapsed(
        conns: Conns) -> None:
    a, b = await conns.lease("a"), await conns.lease("b")
    first = await asyncio.wait_for(a.acquire(), 10)
    await a.announce(first)
    standby = asyncio.ensure_future(b.acquire())
    await wait_for(lambda: b.holder is not None and b.holder.epoch == first, 10,
                   what="the standby's watch names the holder and its epoch")
    await asyncio.sleep(3 * a.ttl_s)  # renewed all along: the standby waits
    assert a.valid() and not standby.done()
    await a.nc.close()  # the holder's host goes: no more renewals
    second = await asyncio.wait_for(standby, 20)
    assert second > first  # epochs only grow
    assert b.valid()
    await wait_for(lambda: a.lost.is_set(), 10, what="the old holder's own clock says lost")
    assert not a.valid() and "own clock" in a.why_lost
    await b.close()
    await a.close()


async def test_a_refused_renewal_loses_the_lease_at_once(conns: Conns) -> None:
    a = await conns.lease("a", ttl=30.0, renew=0.3)
    await asyncio.wait_for(a.acquire(), 10)
    other = await conns.new()
    await other.request(subjects.LEADER_KEY, b'{"broker_id":"x"}', timeout=2)  # behind its back
    await wait_for(lambda: a.lost.is_set(), 10, what="the holder to notice")
    assert not a.valid() and "refused" in a.why_lost
    await a.close()


async def test_the_lease_runs_out_on_the_holders_own_clock(conns: Conns) -> None:
    now = [0.0]
    a = await conns.lease("a", ttl=30.0, renew=0.3, clock=lambda: now[0])
    await asyncio.wait_for(a.acquire(), 10)
    assert a.valid()
    now[0] += 30.0  # paused past the TTL (SIGSTOP, a stalled host): the server would still
    assert not a.valid()  # renew it, but by its own clock the lease is gone
    await wait_for(lambda: a.lost.is_set(), 10, what="lost")
    await a.close()


async def test_letting_go_hands_the_lease_over_at_once(conns: Conns) -> None:
    a = await conns.lease("a", ttl=120.0, renew=0.5)
    b = await conns.lease("b", ttl=120.0, renew=0.5)
    first = await asyncio.wait_for(a.acquire(), 10)
    standby = asyncio.ensure_future(b.acquire())
    await wait_for(lambda: b.holder is not None, 10, what="the standby sees the holder")
    await a.release()
    assert not a.valid()
    # Far within the 120 s a lapse would take: the standby saw the delete marker.
    second = await asyncio.wait_for(standby, 30)
    assert second > first and b.valid()
    await b.release()
    await a.close()
    await b.close()


async def test_a_create_retried_past_the_ttl_that_lands_fresh_is_a_whole_lease(
        conns: Conns) -> None:
    """A standby's create goes unanswered for longer than the TTL (the stream electing a
    leader after a partition) and then lands, stored by that very attempt (no duplicate):
    the lease is the whole TTL from that attempt, not one that ran out before it began."""
    now = [0.0]
    a = await conns.lease("a", ttl=30.0, renew=0.3, clock=lambda: now[0])
    js = a.nc.jetstream()
    await js.delete_stream(subjects.LEADER_STREAM)  # nothing stores a create for now
    acquiring = asyncio.ensure_future(a.acquire())
    await wait_for(lambda: a._tried_at > float("-inf"), 10, what="a create sent, unanswered")
    await asyncio.sleep(0.5)  # a few more, all unanswered ("no responders")
    now[0] += 60.0  # longer than the TTL since the first
    await js.create_key_value(bucket=subjects.LEADER_BUCKET, history=1, ttl=30.0, replicas=1,
                              storage=nats.js.api.StorageType.FILE)
    await asyncio.wait_for(acquiring, 20)
    assert a.valid(), a.why_lost
    await asyncio.sleep(1.0)
    assert a.valid() and not a.lost.is_set()
    await a.close()


async def test_a_create_answered_as_a_duplicate_counts_from_its_first_send(
        conns: Conns, nats_server: NatsServer) -> None:
    """The other side of that rule: a create whose first attempt the server stored late
    (it was frozen) is answered "duplicate" on a retry; the lease is counted from the first
    send, so a create stored more than a TTL after it was sent holds nothing."""
    now = [0.0]
    a = await conns.lease("a", ttl=30.0, renew=0.3, clock=lambda: now[0])
    assert nats_server.proc is not None
    os.killpg(nats_server.proc.pid, signal.SIGSTOP)  # requests wait in the socket
    try:
        acquiring = asyncio.ensure_future(a.acquire())
        await wait_for(lambda: a._tried_at > float("-inf"), 10, what="a create sent")
        now[0] += 60.0
        await asyncio.sleep(2.5)  # the first attempt times out; a retry is in flight
    finally:
        os.killpg(nats_server.proc.pid, signal.SIGCONT)
    await asyncio.wait_for(acquiring, 20)
    await wait_for(lambda: a.lost.is_set(), 10, what="the late lease counted as run out")
    assert "own clock" in a.why_lost
    await a.close()
