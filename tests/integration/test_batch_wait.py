"""The batch wait (`broker.auctioneer` rule 4) with the real pieces: requests that arrive
within the wait share one auction; a full batch does not wait."""

from __future__ import annotations

import asyncio
import time

from gavel.shared.messages import Spec
from tests.integration.harness import Cluster, wait_for

SPEC = Spec(name="svc", command=["sleep", "60"], cpu=0.1, memory_mb=16)


def _auctions(cluster: Cluster, iids: list[str]) -> set[str]:
    st = cluster.ledger().state()
    placed = [st.placement(i) for i in iids]
    assert all(p is not None for p in placed)
    return {p.auction_id for p in placed if p is not None}


def _placed(cluster: Cluster, iids: list[str]) -> bool:
    st = cluster.ledger().state()
    return all(st.placement_of(i) is not None for i in iids)


async def test_requests_arriving_within_the_wait_share_one_auction(cluster: Cluster) -> None:
    await cluster.start_broker(batch_wait_s=1.0)
    await cluster.start_agent("node-a")
    await cluster.start_agent("node-b")
    await cluster.wait_nodes(2)
    iids = []
    for k in range(3):  # three submissions, each its own commit, well inside the wait
        iids.append(await cluster.submit(SPEC, f"w-{k}"))
        await asyncio.sleep(0.1)
    await wait_for(lambda: _placed(cluster, iids), 15, what="placed")
    assert len(_auctions(cluster, iids)) == 1


async def test_without_a_wait_each_submission_is_auctioned_at_once(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    iids = []
    for k in range(3):
        iids.append(await cluster.submit(SPEC, f"n-{k}"))
        await wait_for(lambda: _placed(cluster, iids), 15, what="placed")
    assert len(_auctions(cluster, iids)) == 3


async def test_a_full_batch_does_not_wait(cluster: Cluster) -> None:
    await cluster.start_broker(batch_wait_s=60.0, batch_max=2)
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    started = time.monotonic()
    first = await cluster.submit(SPEC, "f-0")
    await asyncio.sleep(0.3)
    assert not _placed(cluster, [first])  # one request: it waits for company
    second = await cluster.submit(SPEC, "f-1")
    await wait_for(lambda: _placed(cluster, [first, second]), 15, what="placed")
    assert time.monotonic() - started < 30
    assert len(_auctions(cluster, [first, second])) == 1
