"""What a large count does to the broker's other answers: one service scaled from 0 to N, and
one `submit` of N, while `nodes` is asked every `--every-ms` (``python -m
gavel.bench.largecount``; docs/performance.md, "Large counts").

Rules:
1. One `gavel broker --max-instances 0 --max-service-count 0` (no caps) on its own
   nats-server and a fresh state directory, no workers: every instance waits, unschedulable.
2. The submit's array has parallelism 1: its tasks past the first are held, never
   auctioned, so that run weighs the submission's own commits, not the auctions of a hundred
   thousand waiting instances (the scale run weighs those: its replicas all wait).
3. Each run asks `nodes` one at a time on a connection of its own, from its large request
   until every instance of it is in the broker's state (`status` of its last instance
   answers), and reports `nodes` p50 / p99 / slowest and how many took over a second.
4. An ask's figure runs from just before its request is sent to its decoded answer; one
   unanswered within the client's timeout counts as that long, and as unanswered.
5. ``--runs scale`` or ``--runs submit`` measures one of the two alone.
6. Once every instance is in, `status` of every instance (every page, as `gavel status`
   asks) and the dashboard's summary (`status` with ``summary``) are asked once each: how
   long each took, the pages and the largest page's bytes against the server's max payload.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any, Literal

import msgspec

from gavel.bench.statushop import pct
from gavel.shared.api import (
    DeployReply,
    DeployRequest,
    NodesReply,
    NodesRequest,
    ScaleRequest,
    ServiceReply,
    StatsReply,
    StatsRequest,
    StatusReply,
    StatusRequest,
    SubmitReply,
    SubmitRequest,
)
from gavel.shared.messages import Spec
from gavel.transport.client import ClientError, NoAnswer, call, connect
from gavel.transport.natsserver import NatsServer

__all__ = ["main"]

_enc = msgspec.msgpack.Encoder()
#: How long the large requests themselves, and the checks of them, may take to be answered.
LONG_S = 600.0


def _spec(name: str, kind: Literal["job", "service"], count: int,
          parallelism: int | None = None) -> Spec:
    return Spec(name=name, command=["sleep", "600"], cpu=0.01, memory_mb=1, type=kind,
                count=count, parallelism=parallelism)


async def _run(url: str, label: str, start: Callable[[Any], Awaitable[object]],
               landed: Callable[[Any], Awaitable[bool]], every_s: float) -> dict[str, Any]:
    """Rule 2: `start` makes the large request; `landed` says whether all of it is in."""
    asker, maker, checker = [await connect(url) for _ in range(3)]
    took: list[float] = []
    unanswered = 0
    t0 = time.perf_counter()

    async def until_landed() -> float:
        while not await landed(checker):
            await asyncio.sleep(0.5)
        return time.perf_counter() - t0

    try:
        made = asyncio.ensure_future(start(maker))
        done = asyncio.ensure_future(until_landed())
        while not (done.done() and made.done()):
            a = time.perf_counter()
            try:
                await call(asker, "nodes", NodesRequest(), NodesReply)
            except NoAnswer:  # counted as its wait, and as unanswered
                unanswered += 1
            took.append(time.perf_counter() - a)
            await asyncio.sleep(every_s)
        made.result()
        all_in = done.result()
        reads = await _reads(checker)
    finally:
        for nc in (asker, maker, checker):
            await nc.close()
    return {"run": label, "all_in_s": round(all_in, 1), "nodes_asks": len(took),
            "nodes_p50_ms": pct(took, 50), "nodes_p99_ms": pct(took, 99),
            "nodes_max_ms": round(max(took) * 1000, 1),
            "over_1s": sum(t > 1.0 for t in took), "unanswered": unanswered, **reads}


async def _reads(nc: Any) -> dict[str, Any]:
    """Rule 6: every instance's status page by page, then the summary."""
    a = time.perf_counter()
    page = await call(nc, "status", StatusRequest(), StatusReply, LONG_S)
    pages, largest, listed = 1, len(_enc.encode(page)), len(page.instances)
    while page.next:
        page = await call(nc, "status", StatusRequest(after=page.next), StatusReply, LONG_S)
        pages, listed = pages + 1, listed + len(page.instances)
        largest = max(largest, len(_enc.encode(page)))
    status_s = time.perf_counter() - a
    a = time.perf_counter()
    summary = await call(nc, "status", StatusRequest(summary=True), StatusReply, LONG_S)
    return {"status_all_s": round(status_s, 2), "status_pages": pages,
            "status_listed": listed, "status_page_max_bytes": largest,
            "max_payload": nc.max_payload, "summary_s": round(time.perf_counter() - a, 2),
            "summary_bytes": len(_enc.encode(summary)), "summary_total": summary.total}


async def measure(url: str, n: int, every_s: float, runs: Collection[str] = ("scale", "submit")
                  ) -> list[dict[str, Any]]:
    nc = await connect(url)
    try:  # the broker answers before anything counts
        while True:
            try:
                await call(nc, "nodes", NodesRequest(), NodesReply)
                break
            except ClientError:
                await asyncio.sleep(0.2)
    finally:
        await nc.close()

    async def scale(nc: Any) -> object:
        await call(nc, "deploy", DeployRequest(spec=_spec("big", "service", 0)), DeployReply,
                   LONG_S)
        return await call(nc, "scale", ScaleRequest(name="big", count=n), ServiceReply, LONG_S)

    async def scaled(nc: Any) -> bool:  # `stats` counts instances without listing them
        return (await call(nc, "stats", StatsRequest(), StatsReply, LONG_S)).instances >= n

    async def submit(nc: Any) -> object:
        return await call(nc, "submit", SubmitRequest(spec=_spec("many", "job", 1, 1),
                                                      instance_id="many", count=n,
                                                      key="largecount"), SubmitReply, LONG_S)

    async def submitted(nc: Any) -> bool:
        try:
            await call(nc, "status", StatusRequest(instance_id=f"many-{n}"), StatusReply,
                       LONG_S)
        except ClientError:
            return False
        return True

    out = []
    if "scale" in runs:
        out.append(await _run(url, f"scale {n:,}", scale, scaled, every_s))
    if "submit" in runs:
        out.append(await _run(url, f"submit {n:,}", submit, submitted, every_s))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gavel.bench.largecount", description=__doc__)
    p.add_argument("-n", type=int, default=100_000, help="the large count")
    p.add_argument("--every-ms", type=float, default=50.0, help="the gap between `nodes` asks")
    p.add_argument("--runs", default="scale,submit", help="which runs, a comma list")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gavel-large-") as tmp:
        nats = NatsServer(store_dir=Path(tmp) / "js").start()
        broker = subprocess.Popen(
            [sys.executable, "-m", "gavel", "broker", "--nats", nats.url, "--state",
             str(Path(tmp) / "state"), "--max-instances", "0", "--max-service-count", "0"],
            stderr=open(Path(tmp) / "broker.log", "wb"))  # noqa: SIM115
        try:
            print(json.dumps(asyncio.run(measure(nats.url, args.n, args.every_ms / 1000,
                                                 args.runs.split(","))),
                             indent=2))
        finally:
            broker.terminate()
            broker.wait(60)
            nats.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
