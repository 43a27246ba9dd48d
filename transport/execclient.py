"""The operator's side of `shared.execstream`: one `gavel exec` session with the node that runs
the instance.

Rules:
1. Every message goes to ``gavel.exec.<node>.<operator>`` with a reply subject of its own under
   the session's inbox (``<inbox>.<n>``), so each gives the node a fresh grant to answer
   (`shared.execstream` rule 2): input as it comes, an acknowledgement every half `WINDOW`
   chunks, a keepalive every `KEEPALIVE_S` otherwise.
2. Nobody answering the start (no responders, or nothing within `first_s`, by default
   `Timing.node_answer_s`) is
   `NodeUnreachable`, one sentence naming the node (or, when the server refused to take it,
   a sentence saying the operator's role does not allow exec); a node that falls silent for
   longer than its own idle limit is too. Output is handed over in the node's order
   (`ExecOutput.seq`).
3. Cancelling `run` (Ctrl-C) hangs up: the node kills the command and says so.
4. The session's input and keep-alive are tasks of its own owner (`transport.tasks`), ended
   and awaited before `run` returns: one that crashes is logged at once, hangs up, and `run`
   raises a `ClientError` naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
import nats.errors

from gavel.shared import subjects
from gavel.shared.execstream import (
    IDLE_S,
    KEEPALIVE_S,
    WINDOW,
    ExecExit,
    ExecInput,
    ExecOutput,
    ExecStart,
)
from gavel.shared.timing import Timing
from gavel.transport.client import ClientError
from gavel.transport.inbound import Decode, Malformed
from gavel.transport.logclient import NodeUnreachable
from gavel.transport.tasks import Crashed, Tasks

__all__ = ["NodeUnreachable", "new_session", "run"]

log = logging.getLogger("gavel.exec")
_enc = msgspec.msgpack.Encoder()
_dec: Decode[ExecOutput | ExecExit] = Decode(ExecOutput | ExecExit)
#: The operator's waits: machine waits of `Timing` (`shared.timing` rule 3).
_TIMING = Timing()

OnOutput = Callable[[ExecOutput], Awaitable[None] | None]


def _silence(nc: Any, subject: str, operator: str, start: ExecStart) -> Exception:
    """Why the node said nothing: the server refused the operator's request, or no worker."""
    err = str(getattr(nc, "last_error", "") or "").lower()
    if f'permissions violation for publish to "{subject.lower()}"' in err:
        return ClientError(f"NATS refused operator {operator}'s exec: its role does not "
                           "allow it (`gavel auth operator add` gives a role)")
    return NodeUnreachable(f"node {start.node_id} did not answer for exec in "
                           f"{start.instance_id}: is its worker running?")


def new_session() -> str:
    return secrets.token_hex(16)


class _Session:
    """One session's sending, hearing, input and keep-alive (rules 1-4)."""

    def __init__(self, nc: Any, start: ExecStart, operator: str, inbox: str, sub: Any) -> None:
        self.nc, self.start, self.operator, self.sub = nc, start, operator, sub
        self.subject = subjects.EXEC.format(node=start.node_id, operator=operator)
        self.inbox = inbox
        self._lock = asyncio.Lock()
        self._sent = 0
        self.acked = 0

    async def send(self, msg: ExecStart | ExecInput) -> None:
        async with self._lock:
            self._sent += 1
            await self.nc.publish(self.subject, _enc.encode(msg),
                                  reply=f"{self.inbox}.{self._sent}")

    def inp(self, **kw: Any) -> ExecInput:
        return ExecInput(node_id=self.start.node_id, session=self.start.session,
                         acked=self.acked, **kw)

    async def hang_up(self) -> None:
        """Rule 3."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.send(self.inp(hangup=True)), _TIMING.goodbye_s)

    async def feed(self, stdin: AsyncIterator[bytes] | None) -> None:
        if stdin is not None:
            async for data in stdin:
                await self.send(self.inp(data=data))
        await self.send(self.inp(eof=True))

    async def keepalive(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            await self.send(self.inp())

    async def hear(self, on_output: OnOutput, first_s: float, keepalive_s: float) -> ExecExit:
        """Rule 2: output handed over, acknowledged, until the node's `ExecExit`."""
        start, wait = self.start, first_s
        while True:
            try:
                msg = await self.sub.next_msg(timeout=wait)
            except nats.errors.TimeoutError:
                raise _silence(self.nc, self.subject, self.operator, start) from None
            if msg.headers and msg.headers.get("Status") == "503":
                raise NodeUnreachable(f"node {start.node_id} is not answering for exec in "
                                      f"{start.instance_id}: its worker is not connected to "
                                      "NATS.")
            wait = IDLE_S + keepalive_s
            reply = _dec(msg.data)
            if isinstance(reply, Malformed) or reply.session != start.session:
                continue
            if isinstance(reply, ExecExit):
                return reply
            self.acked = reply.seq
            got = on_output(reply)
            if inspect.isawaitable(got):
                await got
            if reply.seq % (WINDOW // 2) == 0:
                await self.send(self.inp())


async def run(nc: Any, start: ExecStart, on_output: OnOutput, *,
              stdin: AsyncIterator[bytes] | None = None, operator: str = subjects.OPERATOR,
              first_s: float = _TIMING.node_answer_s,
              keepalive_s: float = KEEPALIVE_S) -> ExecExit:
    """The session `start` opens, to its end (rules 1-4): each output chunk handed to
    `on_output`, `stdin`'s bytes sent as the command's input (its end closes the input;
    None: no input at all). The node's `ExecExit`."""
    inbox = nc.new_inbox()
    sess = _Session(nc, start, operator, inbox, await nc.subscribe(f"{inbox}.*"))
    failed: asyncio.Future[Crashed] = asyncio.get_running_loop().create_future()

    def crashed(crash: Crashed) -> None:
        if not failed.done():
            failed.set_result(crash)
    tasks = Tasks(f"exec session {start.session}", log, crashed=crashed)
    hearing: asyncio.Future[ExecExit] | None = None
    try:
        await sess.send(start)
        tasks.spawn(sess.feed(stdin), name="input")
        tasks.spawn(sess.keepalive(keepalive_s), name="keepalive")
        hearing = asyncio.ensure_future(sess.hear(on_output, first_s, keepalive_s))
        either: set[asyncio.Future[Any]] = {hearing, failed}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if hearing.done():
            return hearing.result()
        await sess.hang_up()  # rule 4
        crash = failed.result()
        raise ClientError(f"exec in {start.instance_id} ended: the session's {crash.name} "
                          f"failed ({crash.error!r})")
    except asyncio.CancelledError:  # rule 3
        await sess.hang_up()
        raise
    finally:
        if hearing is not None and not hearing.done():  # a hang-up, or a crash
            hearing.cancel()
            await asyncio.wait({hearing})
            if not hearing.cancelled():
                hearing.exception()  # what it raised as it was stopped changes nothing
        await tasks.aclose(_TIMING.goodbye_s)
        with contextlib.suppress(nats.errors.Error):
            await sess.sub.unsubscribe()
