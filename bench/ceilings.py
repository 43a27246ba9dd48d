"""The machine's own ceilings, measured in the same run as the broker.

Rules:
1. `nats_reqreply_per_s` is raw nats-py request/reply echo, one responder and many requests
   in flight: the most a Python NATS client on this machine can exchange.
2. A `Probe` makes one raw request/reply at a time, every `every_s`, on connections of its
   own, for as long as it runs beside the rounds: the p99 of those is the least a bid round
   (a request and its replies) takes on this machine under the same load, measured over the
   same seconds - a p99 taken in a second before the run says more about that second.
3. `git_cli_commits_per_s` is the naive ledger: one `git commit` subprocess per placement in
   a working tree. Each is bounded in count and time.
4. Rule 1 measures two processes exchanging, not what bounds a bench run; the ceiling of the
   run's own shape is the bare auctioneer (`bench.bare`), which needs the run's agents and
   no broker, so `bench.run` measures it on either side of the broker's life (its rule 6).
"""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats

from gavel.transport import wire

__all__ = ["Probe", "git_cli_commits_per_s", "nats_reqreply_per_s"]


async def nats_reqreply_per_s(url: str, seconds: float = 2.0, in_flight: int = 64) -> float:
    """Rule 1."""
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
    await client.close()
    await server.close()
    return done / elapsed


@dataclass
class Probe:
    """Rule 2: `start`, then `stop` for the p99 in ms (its task is its own: `stop` ends it)."""

    url: str
    every_s: float = 0.01
    took: list[float] = field(default_factory=list)
    _conns: list[Any] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    _stopping: bool = False

    async def start(self) -> None:
        server: Any = await nats.connect(self.url)
        client: Any = await nats.connect(self.url)
        self._conns = [client, server]

        async def echo(msg: Any) -> None:
            await server.publish(msg.reply, msg.data)

        await server.subscribe("bench.probe", cb=echo)
        await wire.subscribed(server)
        await client.request("bench.probe", b"warm", timeout=5)
        self._task = asyncio.create_task(self._loop(client), name="reqreply-probe")

    async def _loop(self, client: Any) -> None:
        # Stopped by a flag, not a cancel: on this Python a cancel that lands as nats-py's
        # `wait_for` gets its reply is lost, and the loop would run on for ever.
        while not self._stopping:
            sent = time.perf_counter()
            await client.request("bench.probe", b"x" * 64, timeout=5)
            self.took.append(time.perf_counter() - sent)
            await asyncio.sleep(self.every_s)

    async def stop(self) -> float:
        self._stopping = True
        if self._task is not None:
            await self._task  # ends after the request in flight; one that failed is raised
        for conn in self._conns:
            await conn.close()
        took = sorted(self.took)
        return 1000 * took[min(len(took) - 1, int(0.99 * len(took)))] if took else 0.0


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
