"""The broker's metrics say what `gavel status` says: a running instance is counted as
running, not as the ``queued`` its record in git keeps while node.json places it; and an
answer to an RFB that came too late for its round, or from a node the broker had not heard
yet, is left out of the auction without being counted as a rejected message (a replay still
is)."""

from __future__ import annotations

from typing import Any

import msgspec
import nats
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from gavel.shared import subjects
from gavel.shared.messages import RFB, Bid, BidReply
from gavel.transport import wire
from tests.integration.harness import Cluster, FakeNode, sleeper_spec, wait_for

pytestmark = pytest.mark.integration
_enc = msgspec.msgpack.Encoder()


def samples(registry: CollectorRegistry, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name == name:
                out[next(iter(s.labels.values()), "")] = s.value
    return out


async def test_instances_are_counted_in_the_state_status_shows(cluster: Cluster) -> None:
    broker = await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    iid = await cluster.submit(sleeper_spec("sleepy", cpu=0.5))

    async def running() -> bool:
        return bool((await cluster.status(iid)).state == "running")
    await wait_for(running, 15, what="the instance to run")
    assert samples(broker.metrics.registry, "gavel_instances") == {"running": 1.0}


async def test_answers_too_late_or_from_a_node_not_yet_heard_are_not_rejects(
        cluster: Cluster) -> None:
    broker = await cluster.start_broker()
    await cluster.start_agent("node-a")
    silent = await FakeNode(cluster.url, "node-s").start()  # heard, never bids: each round
    silent.bidding = False                                  # runs to its deadline
    await cluster.wait_nodes(2)
    eager = FakeNode(cluster.url, "node-q")  # bids on every broadcast, never heard
    eager.heartbeating = False
    await eager.start()
    late_nc = await nats.connect(cluster.url)
    rfbs: list[RFB] = []

    async def keep(msg: Any) -> None:
        rfbs.append(msgspec.msgpack.decode(msg.data, type=RFB))

    await late_nc.subscribe(subjects.RFB, cb=keep)
    await wire.subscribed(late_nc)
    try:
        iid = await cluster.submit(sleeper_spec("s", cpu=0.5))
        await wait_for(lambda: bool(cluster.holders(iid)), 15, what="the placement")
        assert cluster.holders(iid) == ["node-a"]
        assert dict(broker.rejects.counts) == {}
        assert broker.auctioneer.core.late_total >= 1  # node-q's answer, left out
        aid = rfbs[0].auction_id
        assert aid not in broker.auctioneer.auctions
        # node-s answers after the close: too late, not hostile. Its second answer is a
        # replay, and so is node-a's answer given again.
        late = BidReply(auction_id=aid, node_id="node-s",
                        answers=[Bid(shape=0, load=0.0, strategy="fake")])
        replay = BidReply(auction_id=aid, node_id="node-a",
                          answers=[Bid(shape=0, load=0.0, strategy="fake")])
        before = broker.auctioneer.core.late_total
        await late_nc.publish(subjects.BIDS.format(node="node-s"), _enc.encode(late))
        await late_nc.publish(subjects.BIDS.format(node="node-a"), _enc.encode(replay))
        await late_nc.flush()
        await wait_for(lambda: broker.rejects.counts.get("bid for an unknown auction") == 1,
                       10, what="the replay counted")
        assert broker.auctioneer.core.late_total == before + 1
        assert broker.rejects.counts.get("bid from a node that was not asked", 0) == 0
        assert broker.rejects.counts.get("late bid", 0) == 0
    finally:
        await late_nc.close()
        await eager.close()
        await silent.close()
