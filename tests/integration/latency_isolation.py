"""Submit -> running with and without isolation, side by side in one sitting (not a test:
``python -m tests.integration.latency_isolation [ROUNDS] [PER_ROUND]``).

A real nats-server, broker and worker (in this process, as the integration tests run them),
the worker's cgroups on where the host has them; each round starts a fresh cluster with
isolation off, then one with isolation on, and submits instances one at a time, each timed
from the submit call to the worker reporting it running (a round's first, the node's first
award, waits for the node to settle and is not counted). Rounds alternate, so load on the
machine falls on both alike."""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gavel.shared.messages import EventType, Spec
from gavel.transport.natsserver import NatsServer
from gavel.worker.cgroups import detect
from gavel.worker.isolation import configure, off
from tests.integration.harness import Cluster, wait_for


async def _round(url: str, root: Path, mode: str, n: int) -> list[float]:
    cluster = Cluster(url, root)
    node = f"lat-{mode}-{os.getpid()}-{root.name}"
    iso = configure("uids", (400_000, 465_535), allow_root=False, owner=node,
                    leases=root / "leases") if mode == "uids" else off()
    await cluster.start_broker()
    agent = await cluster.start_agent(node, cgroups=detect("auto", node), isolation=iso)
    await cluster.wait_nodes(1)
    running: dict[str, float] = {}
    report = agent._report

    async def timed(instance_id: str, attempt: int, type_: str, *a: object, **kw: object
                    ) -> None:
        if type_ == EventType.RUNNING:
            running[instance_id] = time.perf_counter()
        await report(instance_id, attempt, type_, *a, **kw)  # type: ignore[arg-type]

    agent._report = timed  # type: ignore[method-assign]
    agent._supervisor._report = timed
    out: list[float] = []
    try:
        for _ in range(n + 1):  # the first of a round (the node's first award) not counted
            t0 = time.perf_counter()
            iid = await cluster.submit(Spec(name="lat", command=["/bin/sh", "-c", "sleep 30"],
                                              cpu=0.05, memory_mb=32))
            await wait_for(lambda iid=iid: iid in running, 30, every=0.001)  # type: ignore[misc]
            out.append(running[iid] - t0)
    finally:
        await cluster.close()
    return out[1:]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] * 1000


async def main(rounds: int, per_round: int) -> None:
    got: dict[str, list[float]] = {"off": [], "uids": []}
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        server = NatsServer(store_dir=Path(tmp) / "js", log=Path(tmp) / "nats.log").start()
        try:
            for r in range(rounds):
                for mode in ("off", "uids"):
                    root = Path(tmp) / f"{mode}{r}"
                    root.mkdir()
                    got[mode] += await _round(server.url, root, mode, per_round)
        finally:
            server.stop()
    for mode, xs in got.items():
        print(f"isolation {mode:4}: n={len(xs)} p50 {_pct(xs, 0.5):.1f} ms  "
              f"p90 {_pct(xs, 0.9):.1f} ms  p99 {_pct(xs, 0.99):.1f} ms  "
              f"mean {statistics.mean(xs) * 1000:.1f} ms  slowest "
              f"{', '.join(f'{x * 1000:.0f}' for x in sorted(xs)[-3:])} ms")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 4,
                     int(sys.argv[2]) if len(sys.argv) > 2 else 50))
