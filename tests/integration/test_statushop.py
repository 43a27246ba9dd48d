"""`python -m gavel.bench.statushop`'s measure against a real broker and the HTTP API: both
doors answer the same instance's status, and each gets its figures (`bench.statushop`)."""

from __future__ import annotations

import pytest

from gavel.bench.statushop import measure
from gavel.cli.api import app
from tests.integration.harness import Cluster

pytestmark = pytest.mark.integration


async def test_both_doors_answer_and_are_measured(cluster: Cluster) -> None:
    await cluster.start_broker()
    server = await app.start(cluster.url, None, port=0)
    try:
        out = await measure(cluster.url, server.port, 3)
    finally:
        await server.close()
    assert out["asks_each"] == 3
    for door in ("nats", "http"):
        assert 0 < out[door]["p50_ms"] <= out[door]["p99_ms"]
