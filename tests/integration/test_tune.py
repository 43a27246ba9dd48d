"""`gavel tune` against a real broker over a real nats-server: pinned at runtime, the rounds
that follow carry at most the batch pinned, `gavel tune` reads the pins and the rounds since,
and `--auto` hands every value back to the tuner."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from typing import Any

from gavel.shared.api import SubmitReply, SubmitRequest
from gavel.shared.messages import Spec
from tests.integration.harness import Cluster, FakeNode, wait_for

SPEC = Spec(name="tiny", command=["true"], cpu=0.01, memory_mb=1)
COUNT = 20


async def _tune(cluster: Cluster, *flags: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "gavel", "tune", "--nats", cluster.url, *flags],
        capture_output=True, text=True, timeout=60)


async def _tune_json(cluster: Cluster, *flags: str) -> dict[str, Any]:
    done = await _tune(cluster, "--json", *flags)
    assert done.returncode == 0, done.stderr
    got: dict[str, Any] = json.loads(done.stdout)
    return got


async def test_tune_pins_reads_and_releases_a_running_broker(cluster: Cluster) -> None:
    broker = await cluster.start_broker()
    nodes = [await FakeNode(cluster.url, f"n{i}").start() for i in (1, 2)]
    try:
        await cluster.wait_nodes(2)
        a = broker.auctioneer
        pinned = await _tune_json(cluster, "--batch-max", "8", "--max-auctions", "2")
        assert (pinned["batch_max"], pinned["max_auctions"]) == (8, 2)
        assert pinned["pinned"] == ["batch_max", "max_auctions"] and pinned["level"] == 0
        assert (a.core.batch_max, a.core.max_auctions) == (8, 2)
        assert a.tuner.pinned_gap_s is None  # the gap is still tuned

        got = await cluster.call("submit", SubmitRequest(spec=SPEC, count=COUNT), SubmitReply)
        ids = got.ids()
        await wait_for(lambda: all(cluster.ledger().state().placement_of(i) for i in ids), 60,
                       what=f"{COUNT} placed")
        await wait_for(lambda: a.placed_total >= COUNT, 30, what="their awards told")
        read = await _tune_json(cluster)  # only read: nothing changes
        assert read["pinned"] == ["batch_max", "max_auctions"]
        assert read["rounds"] >= COUNT // 8 + 1 == 3  # no round carried more than 8
        assert len(read["round_ms"]) == read["rounds"] and read["placed_total"] >= COUNT
        assert (a.core.batch_max, a.core.max_auctions) == (8, 2)
        shown = await _tune(cluster)
        assert shown.returncode == 0, shown.stderr
        said = re.search(r"since the last change: (\d+) bid rounds closed", shown.stdout)
        # more may close meanwhile: an award the fake nodes never confirm is offered again
        assert "pinned" in shown.stdout and said and int(said[1]) >= read["rounds"], \
            shown.stdout

        released = await _tune_json(cluster, "--auto")
        assert released["pinned"] == [] and released["rounds"] >= read["rounds"]
        assert a.tuner.tuning and a.tuner.pinned_batch_max is None
        refused = await _tune(cluster, "--auto", "--batch-max", "8")
        assert refused.returncode == 2 and refused.stderr.strip() == (
            "gavel tune: --auto tunes every value: give it alone, or only the values to pin")
    finally:
        for n in nodes:
            await n.close()
