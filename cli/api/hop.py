"""What the HTTP hop costs: submit -> placed through the HTTP API and through the NATS API
directly, side by side in one run (``python -m gavel.cli.api.hop``; docs/performance.md).

Rules:
1. One cluster for both: `gavel up` (no gateway, no dashboard, no NATS auth) on a temporary
   state directory, its HTTP API served in its own process as `gavel up` serves it. This
   process asks through both doors: `gavel.client.Client` on NATS, and plain HTTP/1.1 on a
   fresh connection per request (as ``curl`` would).
2. Submissions alternate between the two doors, one at a time, each a one-instance job with
   an id of this run's: both see the same cluster at the same moments, and nothing queues.
3. A submission's figures are from just before its request is sent to its answer (the
   reply) and to its ``placed`` event (heard on a subscription made before the first).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import msgspec

from gavel.bench.statushop import http, pct, with_api
from gavel.client import Client
from gavel.shared import subjects
from gavel.shared.messages import Event, Spec
from gavel.transport.inbound import Decode, Malformed

__all__ = ["main", "measure"]


async def measure(nats_url: str, api_port: int, n: int) -> dict[str, Any]:
    """Rules 2 and 3: `n` submissions through each door."""
    spec = Spec(name="hop", command=[sys.executable, "-c", "pass"], cpu=0.01, memory_mb=16)
    placed: dict[str, asyncio.Future[float]] = {}
    dec: Decode[Event] = Decode(Event)
    figures: dict[str, dict[str, list[float]]] = {
        door: {"reply": [], "placed": []} for door in ("nats", "http")}
    async with await Client.connect(nats_url) as client:
        async def heard(msg: Any) -> None:
            e = dec(msg.data)
            if isinstance(e, Malformed):
                return
            got = placed.get(e.instance_id)
            if e.type == "placed" and got is not None and not got.done():
                got.set_result(time.perf_counter())

        await client.nc.subscribe(subjects.EVENTS_ALL, cb=heard)
        await client.nc.flush()
        body_of = {"spec": msgspec.to_builtins(spec)}
        for k in range(2 * n):
            door = ("nats", "http")[k % 2]
            iid = f"hop-{door}-{k}"
            placed[iid] = asyncio.get_running_loop().create_future()
            t0 = time.perf_counter()
            if door == "nats":
                await client.submit(spec, instance_id=iid)
            else:
                status, said = await http(api_port, "POST", "/v1/instances", json.dumps(
                    {**body_of, "instance_id": iid}).encode())
                if status != 200:
                    raise RuntimeError(f"POST /v1/instances: {status} {said.decode()}")
            t1 = time.perf_counter()
            t2 = await asyncio.wait_for(placed[iid], 60)
            figures[door]["reply"].append(t1 - t0)
            figures[door]["placed"].append(t2 - t0)
    out: dict[str, Any] = {"submissions_each": n}
    for door, f in figures.items():
        out[door] = {"reply_p50_ms": pct(f["reply"], 50), "reply_p99_ms": pct(f["reply"], 99),
                     "placed_p50_ms": pct(f["placed"], 50),
                     "placed_p99_ms": pct(f["placed"], 99)}
    out["hop_p50_ms"] = round(out["http"]["placed_p50_ms"] - out["nats"]["placed_p50_ms"], 2)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gavel.cli.api.hop", description=__doc__)
    p.add_argument("-n", type=int, default=200, help="submissions through each door")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    return with_api(args.workers, lambda url, port: measure(url, port, args.n))


if __name__ == "__main__":
    sys.exit(main())
