"""A node flooding its own heartbeat subject as fast as it can, until SIGTERM: heartbeats far
larger than anything it could hold (5,500 made-up instances, about 800 KB) and valid-size
ones, a quarter of a second of each in turn (so that either kind is, in turn, the newest).
Run as ``python -m tests.integration.flooder URL SEED NODE``; prints ``flooding`` once it
is, and its counts as JSON when it stops."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time

import msgspec
import nats

from gavel.shared import subjects
from gavel.shared.messages import Capacity, Heartbeat, InstanceReport


async def flood(url: str, seed: str, node: str) -> dict[str, int]:
    nc = await nats.connect(url, nkeys_seed=seed, max_reconnect_attempts=-1,
                            inbox_prefix=subjects.NODE_INBOX.format(node=node),
                            pending_size=64 << 20)
    big = msgspec.msgpack.encode(Heartbeat(
        node_id=node, strategy="flood", capacity=Capacity(cpu=4, memory_mb=4096),
        instances=[InstanceReport(instance_id=f"made-up-instance-{k:06d}", state="running",
                                  pid=100_000 + k, ports={"http": 20_000 + k % 1000})
                   for k in range(5_500)]))
    small = msgspec.msgpack.encode(Heartbeat(node_id=node, strategy="flood",
                                             capacity=Capacity(cpu=4, memory_mb=4096)))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    sent = {"big": 0, "small": 0, "big_bytes": len(big), "small_bytes": len(small)}
    subject = subjects.HEARTBEAT.format(node=node)
    said = False
    while not stop.is_set():
        kind = "big" if int(time.monotonic() * 4) % 2 else "small"
        data = big if kind == "big" else small
        for _ in range(16):
            await nc.publish(subject, data)
        sent[kind] += 16
        if not said:
            await nc.flush()
            print("flooding", flush=True)
            said = True
        await asyncio.sleep(0)  # the client's flusher writes what is pending
    await nc.close()
    return sent


if __name__ == "__main__":
    print(json.dumps(asyncio.run(flood(*sys.argv[1:4]))), flush=True)
