"""The broker's NATS connections: made with a deadline, then reconnecting on their own.

Rules:
1. A first connection is asked again every 0.5 s until its wait has passed (None: for
   ever); then `NatsUnreachable` names the server and the last error, one sentence.
2. Once connected, a connection reconnects by itself when it drops: nats-py reads
   `allow_reconnect` at that moment, so it is set only after the first connect succeeded
   (a first connect that fails must fail, not retry inside nats-py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from gavel.transport.urls import servers

__all__ = ["NatsUnreachable", "connect_within"]


class NatsUnreachable(Exception):
    """`Broker.start` gave up on its first connection; the message says to where and why."""


async def connect_within(make: Callable[[], Any], url: str, options: dict[str, Any],
                         wait_s: float | None, retry_s: float) -> Any:
    """A connection made by `make()` to `url`, asked again every `retry_s` until `wait_s` has
    passed (None: for ever), then `NatsUnreachable` naming the server and the last error.
    Connected, it reconnects on its own (nats-py reads `allow_reconnect` when it drops)."""
    deadline = None if wait_s is None else time.monotonic() + wait_s
    while True:
        nc = make()
        try:
            await nc.connect(servers(url), **options)
        except Exception as exc:
            with contextlib.suppress(Exception):
                await nc.close()
            if deadline is not None and time.monotonic() >= deadline:
                raise NatsUnreachable(
                    f"the broker could not connect to NATS at {url} within {wait_s:g}s: "
                    f"{str(exc) or type(exc).__name__}") from exc
            await asyncio.sleep(retry_s)
            continue
        nc.options["allow_reconnect"] = True
        return nc
