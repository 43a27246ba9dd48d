"""`bench.natslite` reads the NATS protocol however the bytes are cut: frames split at any
point, several in one read, pings answered, headers skipped, errors surfaced as sentences."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gavel.bench.natslite import LiteClient, ProtocolError


class FakeTransport:
    def __init__(self) -> None:
        self.sent = bytearray()
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.sent += data

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.aborted = True


def _client() -> tuple[LiteClient, FakeTransport, list[tuple[str, bytes]]]:
    c = LiteClient("t")
    t = FakeTransport()
    c.connection_made(t)  # type: ignore[arg-type]
    got: list[tuple[str, bytes]] = []
    c.subscribe("a.b", lambda p: got.append(("a", p)))
    c.subscribe("c", lambda p: got.append(("c", p)))
    return c, t, got


STREAM = (b"INFO {\"server_id\":\"x\",\"max_payload\":1048576}\r\n"
          b"MSG a.b 1 5\r\nhello\r\n"
          b"PING\r\n"
          b"MSG c 2 _INBOX.x 0\r\n\r\n"
          b"+OK\r\n"
          b"HMSG a.b 1 20 25\r\nNATS/1.0\r\nX-A: 1\r\n\r\nworld\r\n"
          b"MSG a.b 1 4\r\n\r\n\r\n\r\n"  # a payload that looks like line ends
          b"MSG c 9 3\r\nnot\r\n")  # a sid nobody subscribed: dropped
WANT = [("a", b"hello"), ("c", b""), ("a", b"world"), ("a", b"\r\n\r\n")]


async def test_a_stream_in_one_read() -> None:
    c, t, got = _client()
    c.data_received(STREAM)
    assert got == WANT
    assert b"PONG\r\n" in t.sent and not t.aborted
    assert t.sent.startswith(b"SUB a.b 1\r\nSUB c 2\r\n")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=12))
def test_any_cut_of_the_stream_reads_the_same(cuts: list[int]) -> None:
    async def go() -> None:
        c, t, got = _client()
        edges = [0, *sorted(set(cuts)), len(STREAM)]
        for a, b in itertools.pairwise(edges):
            c.data_received(STREAM[a:b])
        assert got == WANT and not t.aborted
        assert t.sent.count(b"PONG\r\n") == 1

    asyncio.run(go())


async def test_publish_and_flush_frames() -> None:
    c, t, _ = _client()
    c.publish("x.y", b"12345")
    assert t.sent.endswith(b"PUB x.y 5\r\n12345\r\n")
    flushing = asyncio.ensure_future(c.flush(timeout=5))
    await asyncio.sleep(0)
    assert t.sent.endswith(b"PING\r\n")
    c.data_received(b"PONG\r\n")
    await flushing


@pytest.mark.parametrize(("data", "says"), [
    (b"-ERR 'Authorization Violation'\r\n", "server error: 'Authorization Violation'"),
    (b"MSG a.b 1 five\r\nhello\r\n", "unreadable frame"),
    (b"WHAT\r\n", "unexpected line b'WHAT'"),
    (b"x" * (70 * 1024), "a control line longer than"),
])
async def test_what_it_cannot_read_closes_the_connection_with_a_sentence(
        data: bytes, says: str) -> None:
    c, t, got = _client()
    c.data_received(data)
    assert t.aborted and got == []
    why: Any = await c.closed
    assert isinstance(why, ProtocolError) and says in str(why)


async def test_a_failing_handler_is_counted_and_the_connection_kept() -> None:
    c, t, got = _client()
    c.subscribe("boom", lambda p: 1 / 0)  # type: ignore[func-returns-value]
    c.data_received(b"MSG boom 3 1\r\nx\r\nMSG a.b 1 2\r\nok\r\n")
    assert c.handler_errors == 1 and got == [("a", b"ok")] and not t.aborted


async def test_a_lost_connection_is_reported_and_a_closed_one_is_not() -> None:
    c, _, _ = _client()
    c.connection_lost(None)
    assert "closed the connection" in str(await c.closed)
    c2, _, _ = _client()
    c2.close()
    c2.connection_lost(None)
    assert await c2.closed is None
    with pytest.raises(ConnectionError):
        c2.publish("a", b"")
