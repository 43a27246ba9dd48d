"""A broker killed between the commit that moved everything off a node and that node's KV
put leaves the old node.json in KV; the node would keep running what git moved away. The
next broker mirrors an empty node.json for every node the heartbeat stream has heard that
holds nothing in git. Real nats-server (JetStream), real state repository.
"""

from __future__ import annotations

import json

import nats
import pytest

from gavel.shared import subjects
from tests.integration.harness import Cluster, FakeNode, wait_for

pytestmark = pytest.mark.integration


async def test_a_heard_node_with_nothing_in_git_gets_its_stale_kv_entry_emptied(
        cluster: Cluster) -> None:
    node = await FakeNode(cluster.url, "node-z").start()
    inspector = await nats.connect(cluster.url)
    try:
        first = await cluster.start_broker()  # makes the stream and the bucket
        await wait_for(lambda: "node-z" in first.liveness.known(), 30, what="node-z heard")
        await cluster.stop_broker()
        kv = await inspector.jetstream().key_value(subjects.NODES_BUCKET)
        stale = {"node_id": "node-z", "instances": {"moved-away": {
            "instance_id": "moved-away", "auction_id": "a", "cpu": 0.1, "memory_mb": 8}}}
        await kv.put("node-z", json.dumps(stale).encode())  # what the dead broker left
        await cluster.start_broker()

        async def emptied() -> bool:
            entry = await kv.get("node-z")
            return not json.loads(entry.value or b"{}").get("instances")
        await wait_for(emptied, 30, every=0.2, what="node-z's node.json emptied in KV")
    finally:
        await inspector.close()
        await node.close()
