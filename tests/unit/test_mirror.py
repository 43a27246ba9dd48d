"""`broker.mirror`: node.json puts into KV, at most one a node per window, the newest."""

from __future__ import annotations

import asyncio

from gavel.broker.mirror import Mirror
from gavel.shared.records import NodeFile


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def mirror(window_s: float = 0.05) -> tuple[Mirror, list[tuple[str, bytes]], Clock]:
    sent: list[tuple[str, bytes]] = []
    clock = Clock()
    m = Mirror(lambda subject, data: sent.append((subject, data)), window_s, clock)
    return m, sent, clock


def key(node: str) -> str:
    return f"$KV.gavel-nodes.{node}"


async def test_nothing_is_put_before_the_bucket_exists() -> None:
    m, sent, _ = mirror()
    m.changed({"a": b"1"})
    m.flush()
    assert sent == [] and m.puts == 0


async def test_start_puts_every_node_as_compact_json() -> None:
    m, sent, _ = mirror()
    m.start({"a": NodeFile(node_id="a"), "b": NodeFile(node_id="b")})
    assert [s for s, _ in sent] == [key("a"), key("b")]
    assert all(b"\n" not in data and data.startswith(b"{") for _, data in sent)


async def test_a_node_not_put_within_the_window_goes_at_once() -> None:
    m, sent, clock = mirror()
    m.start({})
    m.changed({"a": b"1"})
    assert sent == [(key("a"), b"1")]
    m.changed({"b": b"1"})  # another node's window is its own
    assert sent[-1] == (key("b"), b"1")
    clock.t += 1.0  # a window later: at once again
    m.changed({"a": b"2"})
    assert sent[-1] == (key("a"), b"2") and m.puts == 3


def real_time_mirror(window_s: float) -> tuple[Mirror, list[tuple[str, bytes]]]:
    sent: list[tuple[str, bytes]] = []
    m = Mirror(lambda subject, data: sent.append((subject, data)), window_s,
               asyncio.get_running_loop().time)
    m.start({})
    return m, sent


async def test_changes_within_a_nodes_window_are_put_once_the_newest() -> None:
    m, sent = real_time_mirror(0.05)
    m.changed({"a": b"a1"})  # goes now, opens a's window
    m.changed({"a": b"a2", "b": b"b1"})  # b has no window open: at once
    m.changed({"a": b"a3"})
    m.changed({"b": b"b2"})
    assert sent == [(key("a"), b"a1"), (key("b"), b"b1")], "the rest waits for its window"
    await asyncio.sleep(0.15)
    assert sent[2:] == [(key("a"), b"a3"), (key("b"), b"b2")]  # each node's newest, once
    assert (m.puts, m.coalesced) == (4, 1)


async def test_each_node_has_its_own_window_so_puts_stay_spread() -> None:
    m, sent = real_time_mirror(1.0)
    m.changed({"a": b"a1"})
    await asyncio.sleep(0.5)
    m.changed({"b": b"b1"})  # b's window opens half a second after a's
    m.changed({"a": b"a2", "b": b"b2"})
    await asyncio.sleep(0.7)  # a's window has ended (0.2 s ago), b's has not (in 0.3 s)
    assert sent[2:] == [(key("a"), b"a2")]
    await asyncio.sleep(0.6)
    assert sent[2:] == [(key("a"), b"a2"), (key("b"), b"b2")]


async def test_flush_sends_what_is_pending_and_nothing_twice() -> None:
    m, sent, clock = mirror(window_s=10.0)
    m.start({})
    m.changed({"a": b"1"})
    m.changed({"a": b"2"})
    m.flush()  # on close: the window's end is not waited for
    assert [d for _, d in sent] == [b"1", b"2"]
    await asyncio.sleep(0.02)
    m.flush()
    assert len(sent) == 2
    m.changed({"a": b"3"})  # the flush put a: its window starts over
    assert len(sent) == 2
    clock.t += 10.0
    m.flush()
    assert sent[-1] == (key("a"), b"3")
