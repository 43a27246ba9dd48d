"""`gavel exec`'s tasks have owners, in memory: on both ends a session's input, output and
keep-alive end before the session does (nothing is left pending), and a crash in one is
reported at once and ends the session, never lost (`transport.execclient` rule 4,
`worker.execserver` rule 5)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import nats.errors
import pytest

from gavel.shared import subjects
from gavel.shared.execstream import Ended, ExecExit, ExecInput, ExecOutput, ExecStart
from gavel.transport.client import ClientError
from gavel.transport.execclient import run
from gavel.worker.drivers import Target
from gavel.worker.execserver import ExecServer

NODE = "n1"
SESSION = "ab" * 16
START = ExecStart(node_id=NODE, instance_id="i-1", session=SESSION, command=["cat"])
_enc = msgspec.msgpack.Encoder()
#: Bounds a wait that ends at once when the code is right: a wrong one fails, never hangs.
HANG_S = 30.0


def others() -> set[asyncio.Task[Any]]:
    """The tasks still pending besides the test's own."""
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()}


# -- the operator's end ------------------------------------------------------------------


class Sub:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    async def next_msg(self, timeout: float) -> Any:
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except TimeoutError:
            raise nats.errors.TimeoutError from None

    async def unsubscribe(self) -> None:
        return None


class Msg:
    def __init__(self, data: bytes) -> None:
        self.data, self.headers = data, None


class Node:
    """A NATS connection whose node answers the start with `answer` (None: silence)."""

    def __init__(self, answer: ExecExit | None) -> None:
        self.sub = Sub()
        self.answer = answer
        self.sent: list[ExecStart | ExecInput] = []

    def new_inbox(self) -> str:
        return "_INBOX.t"

    async def subscribe(self, subject: str) -> Sub:
        return self.sub

    async def publish(self, subject: str, data: bytes, reply: str = "") -> None:
        msg = msgspec.msgpack.decode(data, type=ExecStart | ExecInput)
        self.sent.append(msg)
        if isinstance(msg, ExecStart) and self.answer is not None:
            self.sub.queue.put_nowait(Msg(_enc.encode(self.answer)))


async def test_a_session_that_ends_leaves_no_task_of_the_operator_s_behind() -> None:
    node = Node(ExecExit(session=SESSION, exit_code=0))
    ended = await run(node, START, lambda out: None, stdin=None)
    assert ended.exit_code == 0
    assert others() == set()  # the input and the keep-alive ended with it


async def test_a_crash_in_the_operator_s_input_ends_the_session_and_hangs_up(
        caplog: pytest.LogCaptureFixture) -> None:
    async def stdin() -> AsyncIterator[bytes]:
        yield b"one line\n"
        raise OSError("the terminal went")

    node = Node(None)  # a node that says nothing: only the crash can end the session
    with pytest.raises(ClientError, match="the session's input failed") as raised:
        async with asyncio.timeout(HANG_S):
            await run(node, START, lambda out: None, stdin=stdin(), first_s=HANG_S)
    assert "the terminal went" in str(raised.value)
    assert any(isinstance(m, ExecInput) and m.hangup for m in node.sent)
    assert f"exec session {SESSION} task input failed" in caplog.text
    assert others() == set()


# -- the node's end ----------------------------------------------------------------------


class Command:
    """An exec command in memory: `head -n 1` (it ends after one line, its input left open),
    whose input may break."""

    def __init__(self, *, breaks: bool) -> None:
        self.breaks = breaks
        self.out: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue()
        self.done = asyncio.Event()
        self.code: int | None = None

    async def read(self) -> tuple[str, bytes] | None:
        return await self.out.get()

    async def write(self, data: bytes) -> None:
        if self.breaks:
            raise RuntimeError("a bug in the input's path")
        self.out.put_nowait(("stdout", data))
        await self.close_input()

    async def close_input(self) -> None:
        self.code = 0
        self.out.put_nowait(None)
        self.done.set()

    async def wait(self) -> int | None:
        await self.done.wait()
        return self.code

    def kill(self) -> None:
        self.done.set()

    def close(self) -> None:
        return None


class Run:
    def __init__(self, command: Command) -> None:
        self.command = command

    async def open(self, *_args: Any, **_kw: Any) -> Command:
        return self.command


class Wire:
    def __init__(self) -> None:
        self.exits: list[ExecExit] = []
        self.left_at_exit: set[asyncio.Task[Any]] = set()
        self.ended = asyncio.Event()
        self.test = asyncio.current_task()

    async def publish(self, subject: str, data: bytes) -> None:
        msg = msgspec.msgpack.decode(data, type=ExecOutput | ExecExit)
        if isinstance(msg, ExecExit):
            self.exits.append(msg)
            self.left_at_exit = {t for t in others() if t is not self.test}  # the session's
            self.ended.set()


class Sink:
    def malformed(self, *_args: Any) -> None:
        raise AssertionError("nothing here is malformed")

    def count(self, *_args: Any) -> None:
        raise AssertionError("nothing here is counted")


async def serve(command: Command) -> tuple[Wire, list[str]]:
    """One session of `command`: opened and given a line."""
    wire, reasons = Wire(), []

    async def report(*event: Any) -> None:
        reasons.append(event[3])

    target = Target(run=Run(command), attempt=1, env={}, cwd=Path("/"))  # type: ignore[arg-type]
    server = ExecServer(node_id=NODE, target=lambda _iid: target, report=report, sink=Sink(),
                        nc=lambda: wire, clock=lambda: 0.0, poll_s=0.01)
    subject, reply = subjects.EXEC.format(node=NODE, operator="alice"), "_GAVEL_OP.alice.1"

    class M:
        def __init__(self, message: ExecStart | ExecInput) -> None:
            self.subject, self.reply, self.data = subject, reply, _enc.encode(message)
            self.headers = None
    await server.on_message(M(START))  # type: ignore[arg-type]
    await server.on_message(M(ExecInput(node_id=NODE, session=SESSION,
                                        data=b"x\n")))  # type: ignore[arg-type]
    async with asyncio.timeout(HANG_S):
        await wire.ended.wait()
    await server.close()
    assert others() == set()
    return wire, reasons


async def test_a_session_s_tasks_end_before_the_node_answers_its_end() -> None:
    wire, reasons = await serve(Command(breaks=False))
    assert [(e.exit_code, e.reason) for e in wire.exits] == [(0, "")]
    assert reasons == [""]
    assert wire.left_at_exit == set()  # its input, still open, among them


async def test_a_crash_in_a_session_s_input_ends_it_and_is_reported(
        caplog: pytest.LogCaptureFixture) -> None:
    wire, reasons = await serve(Command(breaks=True))
    assert [(e.exit_code, e.reason) for e in wire.exits] == [(None, Ended.FAILED)]
    assert reasons == [Ended.FAILED]
    assert f"exec {SESSION} task input failed" in caplog.text
    assert "a bug in the input's path" in caplog.text
    assert wire.left_at_exit == set()
