"""The converger's periodic re-read of node.json never stalls its reconcile loop: a KV read
whose reply was lost to a reconnect is given up after a heartbeat, not after nats-py's own
5 s (found by `bench.chaos --overlap`: a node that self-fenced could not re-fetch before the
broker's provisioning deadline)."""

from __future__ import annotations

import asyncio
from typing import Any

from gavel.shared.timing import Timing
from gavel.worker.converge import Converger


class LostReply:
    async def get(self, key: str) -> Any:
        await asyncio.Event().wait()  # the reply never comes


async def test_a_lost_kv_reply_does_not_hold_up_the_loop() -> None:
    c = Converger(node_id="n", timing=Timing().scaled(10), supervisor=None,  # type: ignore[arg-type]
                  set_draining=lambda _d: None)
    c._kv = LostReply()
    await asyncio.wait_for(c._read(), 3.0)
    assert c.node is None
