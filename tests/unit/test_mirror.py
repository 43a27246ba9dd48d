"""`broker.mirror`: node.json puts into KV, coalesced within a window, newest per node."""

from __future__ import annotations

import asyncio

from broker.mirror import Mirror
from shared.records import NodeFile


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


async def test_nothing_is_put_before_the_bucket_exists() -> None:
    m, sent, _ = mirror()
    m.changed({"a": b"1"})
    m.flush()
    assert sent == [] and m.puts == 0


async def test_start_puts_every_node_as_compact_json() -> None:
    m, sent, _ = mirror()
    m.start({"a": NodeFile(node_id="a"), "b": NodeFile(node_id="b")})
    assert [s for s, _ in sent] == ["$KV.gavel-nodes.a", "$KV.gavel-nodes.b"]
    assert all(b"\n" not in data and data.startswith(b"{") for _, data in sent)


async def test_the_first_change_after_a_quiet_window_goes_at_once() -> None:
    m, sent, clock = mirror()
    m.start({})
    m.changed({"a": b"1"})
    assert sent == [("$KV.gavel-nodes.a", b"1")]
    clock.t += 1.0  # a window later: at once again, no timer
    m.changed({"a": b"2"})
    assert sent[-1] == ("$KV.gavel-nodes.a", b"2") and m.puts == 2


async def test_changes_within_the_window_are_put_once_each_node_its_newest() -> None:
    m, sent, clock = mirror(window_s=0.05)
    m.start({})
    m.changed({"a": b"a1"})  # goes now, opens the window
    clock.t += 0.01
    m.changed({"a": b"a2", "b": b"b1"})
    m.changed({"a": b"a3"})
    m.changed({"b": b"b2", "c": b"c1"})
    assert sent == [("$KV.gavel-nodes.a", b"a1")], "held until the window ends"
    await asyncio.sleep(0.1)  # the window's timer runs on the real loop
    assert sent[1:] == [("$KV.gavel-nodes.a", b"a3"), ("$KV.gavel-nodes.b", b"b2"),
                        ("$KV.gavel-nodes.c", b"c1")]
    assert (m.puts, m.coalesced) == (4, 2)


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
    # The flush opened a new window: a change now waits for it, not for the old timer.
    m.changed({"a": b"3"})
    assert len(sent) == 2
    clock.t += 10.0
    m.flush()
    assert sent[-1] == ("$KV.gavel-nodes.a", b"3")
