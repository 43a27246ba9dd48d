"""What the HTTP hop costs on a read: one instance's status through the HTTP API
(``GET /v1/instances/ID``) and through the NATS API directly, side by side in one run
(``python -m gavel.bench.statushop``; docs/api.md).

Rules:
1. One cluster for both: `gavel up` (no gateway, no dashboard, no NATS auth) on a temporary
   state directory, its HTTP API served in its own process as `gavel up` serves it. This
   process asks through both doors: the NATS API on one connection (the call
   `gavel.client.Client.status` makes), and plain HTTP/1.1 on a fresh connection per request
   (as ``curl`` would).
2. The asks alternate between the doors, one at a time, for the same instance, after a warm
   up through each that is not counted: both see the same cluster at the same moments, and
   nothing queues.
3. An ask's figure runs from just before its request is sent to its decoded answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from gavel.shared.api import SubmitReply, SubmitRequest
from gavel.shared.messages import Spec
from gavel.transport.client import call, connect, status

__all__ = ["main", "measure"]

#: Asks through each door before the counted ones (connections, caches, code paths warm).
WARM = 20


async def http(port: int, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    """One request on a connection of its own, as ``curl`` would (rule 1): its status and
    body. A `body` goes as JSON."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    sent = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
    if body:
        sent += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    w.write(f"{sent}\r\n".encode() + body)
    data = await r.read()
    w.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), rest


def pct(values: list[float], pct: float) -> float:
    """Nearest rank, in milliseconds."""
    ranked = sorted(values)
    k = max(0, min(len(ranked) - 1, round(pct / 100 * len(ranked) + 0.5) - 1))
    return round(ranked[k] * 1000, 2)


async def measure(nats_url: str, api_port: int, n: int) -> dict[str, Any]:
    """Rules 2 and 3: `n` counted asks through each door."""
    spec = Spec(name="statushop", command=[sys.executable, "-c", "import time; "
                                           "time.sleep(3600)"], cpu=0.01, memory_mb=16)
    nc = await connect(nats_url)
    try:
        iid = (await call(nc, "submit", SubmitRequest(spec=spec, instance_id="statushop",
                                                      key="statushop"), SubmitReply)
               ).instance_id
        figures: dict[str, list[float]] = {"nats": [], "http": []}
        for k in range(2 * (WARM + n)):
            door = ("nats", "http")[k % 2]
            t0 = time.perf_counter()
            if door == "nats":
                await status(nc, iid)
            else:
                code, said = await http(api_port, "GET", f"/v1/instances/{iid}")
                if code != 200:
                    raise RuntimeError(f"GET /v1/instances/{iid}: {code} {said.decode()}")
                json.loads(said)
            if k >= 2 * WARM:
                figures[door].append(time.perf_counter() - t0)
    finally:
        await nc.close()
    out: dict[str, Any] = {"asks_each": n}
    for door, f in figures.items():
        out[door] = {"p50_ms": pct(f, 50), "p99_ms": pct(f, 99)}
    out["hop_p50_ms"] = round(out["http"]["p50_ms"] - out["nats"]["p50_ms"], 2)
    out["hop_p99_ms"] = round(out["http"]["p99_ms"] - out["nats"]["p99_ms"], 2)
    return out


def with_api(workers: int, run: Callable[[str, int], Coroutine[Any, Any, dict[str, Any]]]) -> int:
    """Rule 1's cluster: `gavel up` with `workers` workers and its HTTP API on a temporary
    state directory; `run(nats_url, api_port)`'s figures printed as JSON. 1 when it did not
    come up with its API."""
    with tempfile.TemporaryDirectory(prefix="gavel-hop-") as tmp:
        proc = subprocess.Popen([sys.executable, "-m", "gavel", "up", "--no-gateway",
                                 "--no-ui", "--no-auth", "--workers", str(workers),
                                 "--state", str(Path(tmp) / "up"), "--api-port", "0"],
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            nats_url, port = "", 0
            for line in proc.stdout:
                if m := re.search(r"nats-server at (nats://\S+?),", line):
                    nats_url = m.group(1)
                if m := re.search(r"HTTP API: http://127\.0\.0\.1:(\d+)/", line):
                    port = int(m.group(1))
                if line.startswith("try:"):
                    break
            if not (nats_url and port):
                print("gavel up did not come up with its HTTP API", file=sys.stderr)
                return 1
            print(json.dumps(asyncio.run(run(nats_url, port)), indent=2))
            return 0
        finally:
            proc.terminate()
            proc.wait(60)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gavel.bench.statushop", description=__doc__)
    p.add_argument("-n", type=int, default=500, help="counted asks through each door")
    args = p.parse_args(argv)
    return with_api(1, lambda url, port: measure(url, port, args.n))


if __name__ == "__main__":
    sys.exit(main())
