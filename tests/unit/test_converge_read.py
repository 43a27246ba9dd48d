"""The node's KV watch never waits for ever on a lost answer (`worker.watch` rule 5): a
consumer create whose reply was lost to a reconnect is given up after a heartbeat, not after
nats-py's own timeout (found by `bench.chaos --overlap`: a node that self-fenced could not
re-fetch before the broker's provisioning deadline), and tried again; and the converger's
reconcile loop does not wait on the watch at all (it runs on its own task)."""

from __future__ import annotations

import asyncio
from typing import Any

from gavel.worker.watch import NodeWatch


class Sub:
    def __init__(self, subject: str) -> None:
        self.subject = subject

    async def unsubscribe(self) -> None:
        pass


class LostReply:
    """A connection whose JetStream answers never come back."""

    def __init__(self) -> None:
        self.asked = 0

    def new_inbox(self) -> str:
        return "_INBOX_n.x"

    async def subscribe(self, subject: str, cb: Any = None) -> Sub:
        return Sub(subject)

    async def request(self, subject: str, payload: bytes, timeout: float = 0) -> Any:
        self.asked += 1
        await asyncio.Event().wait()  # the reply never comes, whatever `timeout` says


class Counted:
    def malformed(self, what: str, subject: str, exc: Exception, peer: str = "") -> None:
        pass

    def count(self, kind: str, subject: str, peer: str = "") -> None:
        pass


async def test_a_lost_create_reply_is_given_up_and_asked_again() -> None:
    nc = LostReply()
    watch = NodeWatch(nc, "n", lambda _entry: None, heartbeat_s=0.1, answer_s=1.0,
                      sink=Counted())
    task = asyncio.create_task(watch.run())
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while nc.asked < 2:
            assert asyncio.get_running_loop().time() < deadline, "never asked again"
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert watch.created == 0
