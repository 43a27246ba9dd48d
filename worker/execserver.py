"""Serving `gavel exec` sessions to operators, on the node that runs the instance.

Rules:
1. Messages come on ``gavel.exec.<node>.<operator>`` (only this node may subscribe to it)
   through a `Guard`: one naming another node, or that does not decode, is counted; one with
   a reply subject outside its operator's own inbox is counted and never answered
   (`transport.inbound` rule 5). A session belongs to the operator that opened it: input
   naming it from anyone else is counted and dropped.
2. At most `MAX_SESSIONS` at once; a start past that, for an instance this node does not
   run, or that cannot be started, is answered with one `ExecExit` saying why.
3. Output goes in order, where and as far as `shared.execstream` rule 2 lets it; the
   session's limits (its rule 3) and a hang-up kill the command. Every session that ran a
   command ends with `ExecExit`, is logged here and is reported as an ``exec`` event (its
   rule 5).
4. A worker that stops kills every command under way and says so (`Ended.WORKER_STOPPED`).
5. A session's input, output and exit are tasks of its own owner (`transport.tasks`), all
   ended and awaited before the session answers its end: one that crashes is logged at once
   and ends the session, its command killed (`Ended.FAILED`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from nats.aio.msg import Msg

from gavel.shared import execstream, subjects
from gavel.shared.execstream import (
    OUTPUT_MAX,
    WINDOW,
    Ended,
    ExecExit,
    ExecInput,
    ExecOutput,
    ExecStart,
)
from gavel.shared.messages import EventType, Message
from gavel.shared.timing import Timing
from gavel.transport.inbound import Door, Guard, Sink
from gavel.transport.tasks import Crashed, Tasks
from gavel.worker.drivers import Target
from gavel.worker.execsession import Session

__all__ = ["MAX_SESSIONS", "ExecServer"]

log = logging.getLogger("gavel.worker.exec")

#: Exec sessions one node runs at once.
MAX_SESSIONS = 16
_TIMING = Timing()
_enc = msgspec.msgpack.Encoder()

#: (instance, attempt, type, reason, detail, exit code): the worker's report of an event.
Report = Callable[[str, int, str, str, str, "int | None"], Awaitable[None]]


def _inbox(subject: str) -> str:
    name = subjects.operator_of(subject)
    return subjects.operator_inbox(name) if name else "\0"  # no name: answerable nowhere


@dataclass(eq=False)
class _Session:
    start: ExecStart
    operator: str
    reply: str
    heard: float
    input: asyncio.Queue[ExecInput] = field(default_factory=asyncio.Queue)
    acked: int = 0
    more: asyncio.Event = field(default_factory=asyncio.Event)
    hung_up: bool = False
    stopping: bool = False


class ExecServer:
    def __init__(self, *, node_id: str, target: Callable[[str], Target | Ended],
                 report: Report, sink: Sink, nc: Callable[[], Any],
                 max_sessions: int = MAX_SESSIONS, idle_s: float = execstream.IDLE_S,
                 output_max: int = OUTPUT_MAX, clock: Callable[[], float] = time.monotonic,
                 poll_s: float = _TIMING.tick_s, close_s: float = _TIMING.close_s) -> None:
        self.node_id = node_id
        #: How often a session looks at its limits; how long `close` waits for sessions.
        self._poll_s, self._close_s = poll_s, close_s
        self._target = target
        self._report = report
        self._nc = nc
        self.max_sessions = max_sessions
        self.idle_s = idle_s
        self.output_max = output_max
        self._clock = clock
        door = Door(sink, subjects.EXEC_NODE.format(node=node_id), what="exec message",
                    inbox=_inbox, owner=subjects.operator_of)
        self._guard: Guard[ExecStart | ExecInput] = Guard(
            "exec message", ExecStart | ExecInput, sink,  # type: ignore[arg-type]
            node=lambda _s: node_id, door=door)
        self._sink = sink
        self._sessions: dict[str, _Session] = {}
        self._tasks = Tasks("exec server", log)  # the sessions being served

    async def on_message(self, msg: Msg) -> None:
        """Rule 1: the subscription's callback."""
        guard = self._guard
        got = guard(msg)
        reply = guard.reply
        if not reply or got is None:
            return
        operator = subjects.operator_of(msg.subject)
        if isinstance(got, ExecInput):
            sess = self._sessions.get(got.session)
            if sess is None or sess.operator != operator:
                self._sink.count("exec input for no session of its operator's", msg.subject)
                return
            sess.heard = self._clock()
            sess.reply = reply  # a fresh grant to answer on (`shared.execstream` rule 2)
            if got.acked > sess.acked:
                sess.acked = got.acked
                sess.more.set()
            sess.hung_up = sess.hung_up or got.hangup
            if got.data or got.eof:
                sess.input.put_nowait(got)
            return
        wrong = execstream.check(got)
        if wrong or got.session in self._sessions:
            await self._send(reply, ExecExit(session=got.session, reason=Ended.START_FAILED,
                                             detail=wrong or "that session is open already"))
            return
        if len(self._sessions) >= self.max_sessions:
            await self._send(reply, ExecExit(session=got.session, reason=Ended.BUSY))
            return
        sess = self._sessions[got.session] = _Session(got, operator, reply, self._clock())
        self._tasks.spawn(self._serve(sess), name=f"exec {got.session}")

    async def close(self) -> None:
        """Rule 4."""
        for sess in self._sessions.values():
            sess.stopping = True
        running = self._tasks.running
        if running:  # each session ends itself, told it is stopping; then the rest go
            await asyncio.wait(running, timeout=self._close_s)
        await self._tasks.aclose(self._close_s)

    async def _send(self, reply: str, message: Message) -> None:
        nc = self._nc()
        if nc is not None:
            with contextlib.suppress(Exception):  # a connection that went: the asker times out
                await nc.publish(reply, _enc.encode(message))

    async def _serve(self, sess: _Session) -> None:
        start = sess.start
        try:
            target = self._target(start.instance_id)
            if isinstance(target, Ended):
                await self._send(sess.reply, ExecExit(session=start.session, reason=target))
                return
            what = f"{sess.operator} ran {execstream.describe(start.command)}"
            try:
                proc = await target.run.open(start.command, target.env, target.cwd,
                                             tty=start.tty, rows=start.rows, cols=start.cols)
            except Exception as exc:  # a missing binary, a confinement step, the engine
                detail = str(exc) or type(exc).__name__
                await self._send(sess.reply, ExecExit(session=start.session,
                                                      reason=Ended.START_FAILED, detail=detail))
                await self._ended(start, target.attempt, what, None, Ended.START_FAILED)
                return
            log.info("exec in %s by %s: %s", start.instance_id, sess.operator,
                     execstream.describe(start.command))
            try:
                code, why = await self._run(sess, proc)
            finally:
                proc.kill()
                proc.close()
            await self._send(sess.reply, ExecExit(session=start.session, exit_code=code,
                                                  reason=why))
            await self._ended(start, target.attempt, what, code, why)
        finally:
            self._sessions.pop(start.session, None)

    async def _ended(self, start: ExecStart, attempt: int, what: str, code: int | None,
                     why: str) -> None:
        log.info("exec in %s ended (exit %s%s): %s", start.instance_id, code,
                 f", {why}" if why else "", what)
        await self._report(start.instance_id, attempt, EventType.EXEC, why, what, code)

    def _over(self, sess: _Session, deadline: float) -> str:
        """Rule 3's limits other than the output's ("" none is reached)."""
        now = self._clock()
        if sess.stopping:
            return Ended.WORKER_STOPPED
        if sess.hung_up:
            return Ended.HUNG_UP
        if now >= deadline:
            return Ended.TIMEOUT
        if now - sess.heard >= self.idle_s:
            return Ended.IDLE
        if not isinstance(self._target(sess.start.instance_id), Target):
            return Ended.INSTANCE_ENDED
        return ""

    async def _run(self, sess: _Session, proc: Session) -> tuple[int | None, str]:
        """The command's life: input in, output out, the limits watched (rule 3); its tasks
        are the session's own (rule 5)."""
        deadline = self._clock() + execstream.limit(sess.start)
        failed: list[Crashed] = []
        tasks = Tasks(f"exec {sess.start.session}", log, crashed=failed.append)
        tasks.spawn(self._feed(sess, proc), name="input")
        pump = tasks.spawn(self._pump(sess, proc), name="output")
        exited: asyncio.Task[int | None] | None = None
        try:
            while True:
                waiting: asyncio.Task[Any] = pump if exited is None else exited
                await asyncio.wait({waiting}, timeout=self._poll_s)
                if failed:  # rule 5
                    why: str = Ended.FAILED
                    break
                if exited is not None and exited.done():
                    return exited.result(), ""
                if exited is None and pump.done():
                    why = pump.result()
                    if why:
                        break
                    exited = tasks.spawn(proc.wait(), name="exit")  # the output ended
                    continue
                why = self._over(sess, deadline)
                if why:
                    break
            proc.kill()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), self._close_s)
            return None, why
        finally:
            await tasks.aclose(self._close_s)

    async def _feed(self, sess: _Session, proc: Session) -> None:
        while True:
            got = await sess.input.get()
            if got.data:
                await proc.write(got.data)
            if got.eof:
                await proc.close_input()
                return

    async def _pump(self, sess: _Session, proc: Session) -> str:
        """Output to the operator within the window; `Ended.OUTPUT` past the limit."""
        seq, sent = 0, 0
        while (chunk := await proc.read()) is not None:
            stream, data = chunk
            sent += len(data)
            if sent > self.output_max:
                return Ended.OUTPUT
            while seq - sess.acked >= WINDOW:
                sess.more.clear()
                await sess.more.wait()
            seq += 1
            await self._send(sess.reply, ExecOutput(session=sess.start.session, stream=stream,
                                                    data=data, seq=seq))
        return ""
