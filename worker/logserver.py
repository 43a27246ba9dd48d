"""Serving an instance's output to operators, straight from this node over NATS.

Rules:
1. Requests come on ``gavel.logs.<node>`` (only this node may subscribe to it) and go through
   a `Guard`: one naming another node, or that does not decode, is counted and answered
   with `ApiError`; so is one for an instance with no output here. Each request is served
   on a task of its own, at most `MAX_READERS` at once (past that: `ApiError`).
2. Every reply goes to the request's reply subject, and only when that lies under its
   operator's own inbox (``gavel.logs.<node>.<name>``: operator name's; `transport.inbound`
   rule 5: the server's response permission would let a node answer wherever a request
   asked, an award subject included); a request without one is counted and never
   answered. One request gets at most `replies_max` replies within `window_s`
   (`shared.logstream` rule 1), the last a `LogsDone`; the node stops a
   little before the window closes (`WINDOW_USE`), so the server's response permission is
   never overrun and the asker can ask again in time.
3. History first: from the cursor, or from where ``tail`` and ``since`` start (the later of
   the two); several streams are merged by their time marks (`worker.logfiles` rule 3), so
   stdout and stderr come back in the order they were written, to the tick; each chunk
   says by when it was written (`LogChunk.at`, the mark it lies under). A follow then
   looks at the files every `poll_s`; once the instance no longer runs here it sends what
   the instance wrote last, and `LogsDone` says how it ended.
4. A worker that stops ends each answer under way with ``more``: the asker asks again at
   once and learns that nobody answers, instead of waiting out the window.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec
from nats.aio.msg import Msg

from gavel.shared import subjects
from gavel.shared.logstream import (
    CHUNK_MAX,
    REPLIES_MAX,
    WINDOW_S,
    LogChunk,
    LogsDone,
    LogsRequest,
    Stream,
)
from gavel.shared.messages import ApiError, Message
from gavel.shared.timing import Timing
from gavel.transport.inbound import Door, Guard, Sink
from gavel.transport.tasks import Tasks
from gavel.worker.logfiles import Output, Outputs
from gavel.worker.logwatch import Watch

__all__ = ["MAX_READERS", "WINDOW_USE", "LogServer", "tick"]

log = logging.getLogger("gavel.worker.logs")

#: Log requests served at once by one node.
MAX_READERS = 16
#: The share of the window a node answers in before it says ``more`` (rule 2).
WINDOW_USE = 0.8
#: The ended instances' directories are swept every this many ticks.
SWEEP_TICKS = 60
_enc = msgspec.msgpack.Encoder()
_TIMING = Timing()


class LogServer:
    def __init__(self, *, node_id: str, outputs: Outputs, holds: Callable[[str], bool],
                 sink: Sink, nc: Callable[[], Any], poll_s: float,
                 window_s: float = WINDOW_S, replies_max: int = REPLIES_MAX,
                 clock: Callable[[], float] = time.monotonic,
                 close_s: float = _TIMING.close_s) -> None:
        self.node_id = node_id
        #: How long `close` waits for the answers under way, and each for its last word.
        self.close_s = close_s
        self.outputs = outputs
        self._holds = holds
        self._nc = nc
        self.poll_s = poll_s
        self.window_s = window_s
        self.replies_max = replies_max
        self._clock = clock
        self._guard = Guard("logs request", LogsRequest, sink, node=lambda _s: node_id,
                            door=Door(sink, (subjects.LOGS.format(node=node_id),
                                             subjects.LOGS_AS.format(node=node_id,
                                                                     operator="*")),
                                      what="logs request",
                                      inbox=lambda s: subjects.inbox_of(subjects.asker(s, 3)),
                                      owner=lambda s: subjects.asker(s, 3)))
        self._serving = Tasks("logserver", log)  # the answers under way

    async def on_request(self, msg: Msg) -> None:
        """Rule 1: the subscription's callback."""
        guard = self._guard
        req = guard(msg)
        reply = guard.reply  # rule 2: only under the operators' inbox, or nowhere
        if not reply:
            return
        if req is None:
            await self._send(reply, ApiError(error=f"{guard.refused} dropped"))
            return
        if len(self._serving) >= MAX_READERS:
            await self._send(reply, ApiError(
                error=f"node {self.node_id} is serving {MAX_READERS} log readers already; "
                "try again shortly"))
            return
        self._serving.spawn(self._serve(req, reply), name=f"logs {req.instance_id}")

    async def close(self) -> None:
        """Stop every answer under way (its asker times out, or asks again)."""
        await self._serving.aclose(self.close_s)

    async def _send(self, reply: str, message: Message) -> None:
        nc = self._nc()
        if nc is not None:
            await nc.publish(reply, _enc.encode(message))

    async def _serve(self, req: LogsRequest, reply: str) -> None:
        answer = _Answer(self, req, reply)
        try:
            await answer.run()
        except asyncio.CancelledError:  # the worker stops: the asker should ask again (and
            if answer.out is not None:   # learn at once that nobody answers any more)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(answer.done(more=True), self.close_s)
            raise
        except Exception as exc:  # a file that vanished, a connection that went
            log.warning("log request for %s ended early: %s", req.instance_id, exc)


class _Answer:
    """One request's answer (rules 2 and 3)."""

    def __init__(self, server: LogServer, req: LogsRequest, reply: str) -> None:
        self.s = server
        self.req = req
        self.reply = reply
        self.iid = req.instance_id
        self.streams: list[Stream] = list(dict.fromkeys(req.streams)) or ["stdout"]
        self.budget = server.replies_max - 1  # the last one is the LogsDone
        self.deadline = server._clock() + server.window_s * WINDOW_USE
        self.skipped = 0
        self.out: Output | None = None
        self.pos: dict[str, int] = {}

    def _spent(self) -> bool:
        return self.budget <= 0 or self.s._clock() >= self.deadline

    async def _chunk(self, stream: Stream, data: bytes, end: int, at: float = 0.0) -> None:
        self.budget -= 1
        await self.s._send(self.reply, LogChunk(instance_id=self.iid, stream=stream, data=data,
                                                end=end, at=at))

    async def done(self, more: bool) -> None:
        """The last reply: where each stream stopped, and whether to ask again."""
        assert self.out is not None
        running = self.s._holds(self.iid)
        await self.s._send(self.reply, LogsDone(
            instance_id=self.iid, cursor=dict(self.pos), more=more, running=running,
            ended="" if running else self.out.meta.ended, skipped=self.skipped))

    def _start(self, out: Output, stream: str) -> int:
        req = self.req
        if stream in req.cursor:
            return req.cursor[stream]
        pos = out.first(stream)
        if req.since > 0:
            pos = max(pos, out.since_start(stream, req.since))
        if req.tail >= 0:
            pos = max(pos, out.tail_start(stream, req.tail))
        return pos

    async def run(self) -> None:
        out = self.s.outputs.get(self.iid)
        if out is None:
            await self.s._send(self.reply, ApiError(
                error=f"node {self.s.node_id} has no output of instance {self.iid} (it never "
                "ran there, or its logs were removed after it ended)"))
            return
        self.out = out
        pos: dict[str, int] = {s: self._start(out, s) for s in self.streams}
        self.pos = pos
        ends: dict[str, int] = {s: out.end(s) for s in self.streams}
        if not await self._history(out, pos, ends):
            await self.done(more=True)
            return
        if not self.req.follow:
            await self.done(more=False)
            return
        await self._follow(out, pos)

    async def _history(self, out: Output, pos: dict[str, int], ends: dict[str, int]) -> bool:
        """Rule 3: every stream up to `ends`, in the order written; False if the budget or
        the window ran out first."""
        while True:
            waiting = [s for s in self.streams if pos[s] < ends[s]]
            if not waiting:
                return True
            if self._spent():
                return False

            def written(s: Stream) -> tuple[float, int]:
                mark = out.next_mark(s, pos[s])
                return (mark[0] if mark else float("inf"), self.streams.index(s))
            stream = min(waiting, key=written)
            mark = out.next_mark(stream, pos[stream])
            upto = min(ends[stream], mark[1] if mark else ends[stream])
            data, nxt, skipped = out.read(stream, pos[stream],
                                          max(1, min(CHUNK_MAX, upto - pos[stream])))
            self.skipped += skipped
            if not data:  # rotated away under us: go on from where the stream is now
                pos[stream] = nxt if nxt > pos[stream] else ends[stream]
                continue
            pos[stream] = nxt
            await self._chunk(stream, data, nxt, mark[0] if mark else 0.0)

    async def _follow(self, out: Output, pos: dict[str, int]) -> None:
        """Rule 3: new output until the instance ends here, or the window closes."""
        last_look = 3  # looks for how it ended, once it no longer runs
        while True:
            running = self.s._holds(self.iid)  # before the read: then the read has it all
            ends: dict[str, int] = {s: out.end(s) for s in self.streams}
            if not await self._history(out, pos, ends):
                await self.done(more=True)
                return
            if not running and (out.meta.ended or last_look == 0):
                await self.done(more=False)
                return
            if not running:
                last_look -= 1
            if self._spent():
                await self.done(more=True)
                return
            await asyncio.sleep(self.s.poll_s)


async def tick(outputs: Outputs, tick_s: float) -> None:
    """The worker's logs loop: marks and rotation every tick, the sweep every `SWEEP_TICKS`
    (`worker.logfiles` rules 1-4), and between ticks a rotation as soon as a file is heard
    past its cap (`worker.logwatch`). Runs for as long as the worker, connected or not."""
    watch = Watch.open(outputs.root)
    loop = asyncio.get_running_loop()
    if watch is not None:
        def heard() -> None:
            try:
                for iid, name in watch.events():
                    outputs.written(iid, name)
            except Exception:  # a full disk must not end the worker
                log.exception("a rotation on write failed; the tick tries again")
        loop.add_reader(watch.fd, heard)
    n = 0
    try:
        while True:
            try:
                outputs.tick()
                if watch is not None:
                    watch.sync(outputs.held())
                if n % SWEEP_TICKS == 0:
                    outputs.sweep()
            except Exception:  # a full disk must not end the worker
                log.exception("the logs tick failed; trying again next tick")
            n += 1
            await asyncio.sleep(tick_s)
    finally:
        if watch is not None:
            loop.remove_reader(watch.fd)
            watch.close()
