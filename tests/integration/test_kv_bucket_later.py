"""A broker that starts while JetStream cannot answer yet still mirrors node.json into KV
once it can (`broker.kvbucket` rule 2): one server of a three-server cluster is up (no
quorum: JetStream's API says "temporarily unavailable"), the broker starts and places work,
then the other two come up. Given up on at the start, the mirror would stay off for the
broker's whole run and the node's KV entry would never appear.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
import pytest

from gavel.shared import subjects
from gavel.shared.messages import Spec
from gavel.transport.natscluster import NatsCluster
from tests.integration.harness import Cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


async def test_a_broker_started_before_jetstream_answers_mirrors_once_it_does(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    nats_cluster = NatsCluster(tmp_path / "nats", 3)
    nats_cluster.start_one(0)
    cluster = Cluster(nats_cluster.servers[0].url, tmp_path)
    witness: Any = None
    try:
        with caplog.at_level(logging.WARNING, logger="gavel.broker"):
            broker = await cluster.start_broker()
        assert any("cannot make the KV bucket yet" in r.message for r in caplog.records), \
            [r.message for r in caplog.records]
        assert not broker.mirror.enabled
        await cluster.start_agent("node-a")
        await cluster.wait_nodes(1, timeout=60)
        iid = await cluster.submit(Spec(name="s", command=["sleep", "600"], cpu=0.1,
                                        memory_mb=8))
        await wait_for(lambda: cluster.holders(iid) == ["node-a"], 60, what="the placement")
        for i in range(1, len(nats_cluster.servers)):
            nats_cluster.start_one(i)
        witness = await nats.connect(nats_cluster.urls, max_reconnect_attempts=-1,
                                     reconnect_time_wait=0.2)
        js = witness.jetstream(timeout=5)

        async def mirrored() -> bool:
            try:
                kv = await js.key_value(subjects.NODES_BUCKET)
                entry = await kv.get("node-a")
            except (nats.js.errors.Error, nats.errors.Error):
                return False
            return iid in json.loads(entry.value or b"{}").get("instances", {})
        await wait_for(mirrored, 90, every=0.5, what="node-a's KV entry, holding the instance")
        assert broker.mirror.enabled
    finally:
        if witness is not None:
            await witness.close()
        await cluster.close()
        nats_cluster.stop()
