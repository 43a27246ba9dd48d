"""The asking side of `shared.logstream`: an instance's output from the node that holds it,
over NATS and never through git. `gavel logs` uses it; so can anything that shows an
instance's recent lines (a dashboard: `read` with ``tail``).

Rules:
1. A request goes to the node's own subject with a fresh inbox as its reply subject. A node
   nobody answers for (its worker is down, or never was) is `NodeUnreachable`, one sentence
   naming the node: the server says there are no responders, or no reply comes within
   `first_s` (`Timing.node_answer_s`).
2. The node's answer to one request ends with `LogsDone`; while it says ``more``, the same
   request is made again from its cursor, so a caller sees one stream of chunks however
   many windows a follow spans. Between two replies the asker waits at most the window the
   node answers in, plus an answer's time (`Timing.answer_s`), before it calls the node
   unreachable.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import nats.errors

from gavel.shared import subjects
from gavel.shared.logstream import WINDOW_S, LogChunk, LogsDone, LogsRequest
from gavel.shared.messages import ApiError
from gavel.shared.timing import Timing
from gavel.transport.client import BrokerRefused, ClientError
from gavel.transport.inbound import Decode, Malformed

__all__ = ["NodeUnreachable", "read"]

_enc = msgspec.msgpack.Encoder()
_dec: Decode[LogChunk | LogsDone | ApiError] = Decode(LogChunk | LogsDone | ApiError)
#: The operator's waits: machine waits of `Timing` (`shared.timing` rule 3).
_TIMING = Timing()


class NodeUnreachable(ClientError):
    """Rule 1: no worker answers for the node."""


OnChunk = Callable[[LogChunk], Awaitable[None] | None]


async def read(nc: Any, request: LogsRequest, on_chunk: OnChunk, *,
               first_s: float = _TIMING.node_answer_s,
               window_s: float = WINDOW_S) -> LogsDone:
    """Every chunk of the answer to `request` (rule 2), each handed to `on_chunk`; the last
    `LogsDone`, its ``skipped`` the sum over every window. `ClientError` if the node refuses
    the request, `NodeUnreachable` if it does not answer."""
    skipped = 0
    while True:
        done = await _once(nc, request, on_chunk, first_s, window_s + _TIMING.answer_s)
        skipped += done.skipped
        if not done.more:
            return msgspec.structs.replace(done, skipped=skipped)
        request = msgspec.structs.replace(request, cursor=done.cursor)


async def _once(nc: Any, request: LogsRequest, on_chunk: OnChunk, first_s: float,
                idle_s: float) -> LogsDone:
    node = request.node_id
    sub = await nc.subscribe(nc.new_inbox())
    try:
        who = subjects.operator_of_inbox(sub.subject) or subjects.OPERATOR
        subject = subjects.LOGS.format(node=node) if who == subjects.OPERATOR else \
            subjects.LOGS_AS.format(node=node, operator=who)
        await nc.publish(subject, _enc.encode(request), reply=sub.subject)
        wait = first_s
        while True:
            try:
                msg = await sub.next_msg(timeout=wait)
            except nats.errors.TimeoutError:
                raise NodeUnreachable(f"node {node} did not answer for the logs of "
                                      f"{request.instance_id}: is its worker running?") from None
            if msg.headers and msg.headers.get("Status") == "503":
                raise NodeUnreachable(f"node {node} is not answering for the logs of "
                                      f"{request.instance_id}: its worker is not connected "
                                      "to NATS.")
            wait = idle_s if request.follow else first_s
            reply = _dec(msg.data)
            if isinstance(reply, Malformed):
                raise ClientError(f"node {node} answered with something that is not a gavel "
                                  f"reply: {reply.why}")
            if isinstance(reply, ApiError):
                raise BrokerRefused(reply.error)
            if isinstance(reply, LogsDone):
                return reply
            got = on_chunk(reply)
            if inspect.isawaitable(got):
                await got
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
