"""A worker whose nats-server goes silent - the connection stays open, nothing answers (a
server cut off by a partition, or hung) - gives it up for the next server it was given, and
is heard there: long before it would fence itself for lack of contact.

Two real nats-servers; the first is frozen with SIGSTOP, which is what a cut-off server
looks like from the worker's side of the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import nats
import pytest

from gavel.shared import subjects
from gavel.shared.messages import Heartbeat
from gavel.shared.strategies import make_strategy
from gavel.transport import wire
from gavel.transport.natsserver import NatsServer
from gavel.worker.agent import Agent
from tests.integration.harness import TIMING, wait_for

pytestmark = pytest.mark.integration
NODE = "n1"


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[NatsServer]]:
    pair = [NatsServer(store_dir=tmp_path / f"s{k}", log=tmp_path / f"s{k}.log",
                       jetstream=False).start() for k in (1, 2)]
    try:
        yield pair
    finally:
        for s in pair:
            if s.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(s.proc.pid, signal.SIGCONT)
            s.stop()


async def test_a_worker_leaves_a_silent_server_for_the_next_and_is_heard_there(
        servers: list[NatsServer], tmp_path: Path) -> None:
    first, second = servers
    agent = Agent(nats_url=f"{first.url},{second.url}", node_id=NODE,
                  strategy=make_strategy("least-loaded"), labels={},
                  state_dir=tmp_path / NODE, timing=TIMING, cpu=4.0, memory_mb=4096,
                  nats_options={"dont_randomize": True})
    task = asyncio.create_task(agent.run())
    witness = await nats.connect(second.url)
    heard: list[float] = []
    dec = msgspec.msgpack.Decoder(Heartbeat)

    async def on_heartbeat(msg: object) -> None:
        dec.decode(msg.data)  # type: ignore[attr-defined]
        heard.append(time.monotonic())

    try:
        await witness.subscribe(subjects.HEARTBEAT.format(node=NODE), cb=on_heartbeat)
        await wire.subscribed(witness)
        await asyncio.wait_for(agent.ready.wait(), 20)
        assert agent._nc is not None and agent._nc.connected_url is not None
        assert agent._nc.connected_url.port == first.port  # listed first, not shuffled
        assert first.proc is not None
        frozen_at = time.monotonic()
        os.killpg(first.proc.pid, signal.SIGSTOP)  # the socket stays open; nothing answers
        await wait_for(lambda: any(t > frozen_at for t in heard), 60,
                       what="the worker's heartbeat through the second server")
        assert agent._nc.connected_url.port == second.port
        assert not agent.converger.self_fenced
        left = min(t for t in heard if t > frozen_at) - frozen_at
        print(f"\nsilent server left after {left:.2f}s (heartbeat {TIMING.heartbeat_s:g}s, "
              f"offline {TIMING.offline_s:g}s)")
    finally:
        await witness.close()
        with contextlib.suppress(ProcessLookupError):
            assert first.proc is not None
            os.killpg(first.proc.pid, signal.SIGCONT)
        await agent.stop()
        await asyncio.wait_for(task, 30)
