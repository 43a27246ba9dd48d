"""The broker's outbound messages: queued in order, put on the wire by one sender task.

Rules:
1. Everything the broker publishes (RFBs, awards, cancels, events, KV puts) is queued here and
   goes out in the order it was queued; one task sends, never a task per message.
2. `flush` puts what is queued on the socket there and then when it can go at once
   (`transport.wire.write_now`): an auction's RFBs, whose round is already being timed. Never
   while the sender is mid-batch, whose messages must go first.
3. A message that cannot be published is handed to `failed` (counted), never raised.
4. With a `gate` (a leader of several brokers: its lease's verdict, `broker.ha`), nothing
   goes out while the gate is shut: what is queued then is dropped, never sent late.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import msgspec

from gavel.transport import wire

__all__ = ["Outbox"]

_enc = msgspec.msgpack.Encoder()


class Outbox:
    def __init__(self, failed: Callable[[str, Exception], None], *,
                 gate: Callable[[], bool] | None = None) -> None:
        self._failed = failed
        #: The connection the sender writes to (set once connected).
        self.nc: Any = None
        self._queue: list[tuple[str, bytes]] = []
        self._ready = asyncio.Event()
        #: The sender is handing a batch over the slow way (`flush` waits for it).
        self._sending = False
        #: Rule 4 (None: always open).
        self.gate = gate
        self.dropped = 0

    def _shut(self) -> bool:
        """Rule 4: the gate is shut; what is queued is dropped."""
        if self.gate is None or self.gate():
            return False
        self.dropped += len(self._queue)
        self._queue = []
        return True

    @staticmethod
    def encode(msg: msgspec.Struct) -> bytes:
        return _enc.encode(msg)

    def publish(self, subject: str, msg: msgspec.Struct) -> None:
        self.publish_raw(subject, _enc.encode(msg))

    def publish_raw(self, subject: str, payload: bytes) -> None:
        """Queue a message (rule 1)."""
        self._queue.append((subject, payload))
        self._ready.set()

    @property
    def queued(self) -> list[tuple[str, bytes]]:
        """What waits for the sender, oldest first."""
        return self._queue

    def flush(self) -> None:
        """Rule 2."""
        if self.gate is not None and self._shut():
            return
        if self._queue and not self._sending and wire.write_now(self.nc, self._queue):
            self._queue = []

    async def run(self) -> None:
        """The sender: until cancelled."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            if self.gate is not None and self._shut():
                continue
            batch, self._queue = self._queue, []
            if wire.write_now(self.nc, batch):
                continue
            self._sending = True
            try:
                await wire.send(self.nc, batch, self._failed)
            finally:
                self._sending = False

    async def drain(self) -> None:
        """Publish what the sender had not sent yet (on close, after it was cancelled)."""
        if self.gate is not None and self._shut():
            return
        with contextlib.suppress(Exception):
            for subject, payload in self._queue:
                await self.nc.publish(subject, payload)
            self._queue = []
