"""The machine's own ceilings, measured in the same run as the broker.

Rules: `nats_reqreply` is raw nats-py request/reply echo: its rate with many requests in
flight (one responder) — the most a Python NATS client on this machine can exchange — and
the p99 of one request at a time, the least a bid round (a request and its replies) can
take on this machine as loaded now. `git_cli_commits_per_s` is the naive ledger: one
`git commit` subprocess per placement in a working tree. Each is bounded in count and time.
"""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats

from gavel.transport import wire

__all__ = ["ReqReply", "git_cli_commits_per_s", "nats_reqreply"]


@dataclass(frozen=True)
class ReqReply:
    per_s: float
    p99_ms: float


async def nats_reqreply(url: str, seconds: float = 2.0, in_flight: int = 64,
                        one_s: float = 1.0) -> ReqReply:
    """The rate over `seconds` with `in_flight` requests out, then the p99 of requests made
    one at a time over `one_s` (at most 2,000)."""
    server: Any = await nats.connect(url)
    client: Any = await nats.connect(url)

    async def echo(msg: Any) -> None:
        await server.publish(msg.reply, msg.data)

    await server.subscribe("bench.echo", cb=echo)
    # Not flush(): its PONG can beat the SUB to the server, and the first request then
    # finds no responder. See transport.wire rule 6.
    await wire.subscribed(server)
    await client.request("bench.echo", b"warm", timeout=5)  # the inbox set up off the clock
    done = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await client.request("bench.echo", b"x" * 64, timeout=5)
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    elapsed = time.perf_counter() - start
    took: list[float] = []
    stop = time.perf_counter() + one_s
    while time.perf_counter() < stop and len(took) < 2000:
        sent = time.perf_counter()
        await client.request("bench.echo", b"x" * 64, timeout=5)
        took.append(time.perf_counter() - sent)
    await client.close()
    await server.close()
    took.sort()
    return ReqReply(done / elapsed, 1000 * took[min(len(took) - 1, int(0.99 * len(took)))])


def git_cli_commits_per_s(count: int = 40) -> float:
    with tempfile.TemporaryDirectory(prefix="gavel-gitcli-") as tmp:
        repo = Path(tmp)
        env = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "b@x",
               "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "b@x", "PATH": "/usr/bin:/bin"}
        subprocess.run(["git", "init", "-q", str(repo)], check=True, env=env)
        (repo / "nodes").mkdir()
        start = time.perf_counter()
        for k in range(count):
            path = repo / "nodes" / f"n{k % 10}.json"
            path.write_text(f'{{"placement": {k}}}\n')
            subprocess.run(["git", "-C", str(repo), "add", str(path)], check=True, env=env)
            subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", f"place {k}"],
                           check=True, env=env)
        return count / (time.perf_counter() - start)
