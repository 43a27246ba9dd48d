"""`broker.wire` against a real nats-server: a batch arrives whole and in order, framed as
nats-py frames it; what the batch path cannot vouch for goes through `publish` and fails
there, without taking the rest of the batch with it."""

from __future__ import annotations

import asyncio
import contextlib

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from gavel.transport import wire


def test_the_installed_nats_py_takes_the_batch_path() -> None:
    """If an upgrade drops the internals the batch hand-over uses, the broker still works
    (one `publish` a message) but is slower: this says so."""
    assert wire.fast(Client())
    assert not wire.fast(object())


async def _listen(nc: Client, subject: str, want: int) -> asyncio.Future[list[tuple[str, bytes]]]:
    """Subscribed (the server has it) when this returns; the future holds the first `want`
    messages."""
    got: list[tuple[str, bytes]] = []
    done: asyncio.Future[list[tuple[str, bytes]]] = asyncio.get_running_loop().create_future()

    async def cb(msg: Msg) -> None:
        got.append((msg.subject, msg.data))
        if len(got) >= want and not done.done():
            done.set_result(got)

    await nc.subscribe(subject, cb=cb)
    await wire.subscribed(nc)
    return done


async def test_a_batch_arrives_in_order_byte_for_byte(nats_url: str) -> None:
    pub = await nats.connect(nats_url)
    sub = await nats.connect(nats_url)
    try:
        batch = [(f"w.t.{k % 7}", bytes([k % 256]) * (k * 37 % 5000)) for k in range(3000)]
        batch.append(("w.t.big", b"\r\nPUB x 1\r\n" * 10_000))  # payload bytes are opaque
        listening = await _listen(sub, "w.t.*", len(batch))
        failures: list[tuple[str, Exception]] = []
        sent = pub.stats["out_msgs"]
        handed: list[int] = []
        hand_over = pub._send_command

        async def counting(cmd: bytes, priority: bool = False) -> None:
            handed.append(len(cmd))
            await hand_over(cmd, priority)

        pub._send_command = counting  # type: ignore[method-assign]
        await wire.send(pub, batch, lambda s, e: failures.append((s, e)))
        await pub.flush()
        assert await asyncio.wait_for(listening, 15) == batch
        assert not failures and pub.stats["out_msgs"] - sent == len(batch)
        assert len(handed) == 1  # the whole batch in one hand-over, not one a message
    finally:
        await pub.close()
        await sub.close()


async def test_bad_subjects_and_oversized_payloads_fail_alone(nats_url: str) -> None:
    """A subject with whitespace would end the frame early and inject a command of its own;
    an empty one, or a payload over the server's limit, is refused too. Each is handed to
    `failed` with nats-py's error; the good messages around them still go, in order."""
    pub = await nats.connect(nats_url)
    sub = await nats.connect(nats_url)
    try:
        too_big = b"x" * (pub.max_payload + 1)
        batch = [("w.ok", b"1"), ("w.bad\r\nPUB w.ok 1", b"2"), ("w.ok", b"3"), ("", b"4"),
                 ("w.ok", too_big), ("w bad", b"5"), ("w.ok", b"6")]
        listening = await _listen(sub, "w.ok", 3)
        failures: list[tuple[str, Exception]] = []
        await wire.send(pub, batch, lambda s, e: failures.append((s, e)))
        await pub.flush()
        got = await asyncio.wait_for(listening, 10)
        await asyncio.sleep(0.2)  # nothing else arrives: no injected frame went out
        assert got == [("w.ok", b"1"), ("w.ok", b"3"), ("w.ok", b"6")]
        assert [s for s, _ in failures] == ["w.bad\r\nPUB w.ok 1", "", "w.ok", "w bad"]
        assert pub.is_connected
    finally:
        await pub.close()
        await sub.close()


async def test_a_closed_connection_fails_each_message_with_nats_pys_error(
        nats_url: str) -> None:
    """Not connected (closed here; reconnecting alike): every message goes through
    `publish`, so nats-py's own buffering and limits apply, and what it refuses is counted
    message by message, not raised out of the broker's sender."""
    pub = await nats.connect(nats_url)
    await pub.close()
    failures: list[tuple[str, Exception]] = []
    await wire.send(pub, [("w.a", b"1"), ("w.b", b"2")], lambda s, e: failures.append((s, e)))
    assert [s for s, _ in failures] == ["w.a", "w.b"]
    assert all(isinstance(e, nats.errors.ConnectionClosedError) for _, e in failures)


async def test_direct_subscriptions_hand_over_each_message_in_order(
        nats_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A direct handler sees every message, in order, with its subject and payload, as the
    parser reads it; one that raises is logged and the next message is still handled; the
    client's ordinary subscriptions are untouched."""
    assert wire.DIRECT  # the installed nats-py hands messages over as this expects
    nc = wire.Client()
    await nc.connect(nats_url)
    pub = await nats.connect(nats_url)
    try:
        got: list[tuple[str, bytes]] = []

        def handler(msg: wire.Received) -> None:
            if msg.data == b"boom":
                raise RuntimeError("a handler bug")
            got.append((msg.subject, msg.data))

        await nc.subscribe_direct("d.*", handler)
        assert list(nc._direct.values()) == [handler]  # handled inline, not by a task
        ordinary = await nc.subscribe("o.x")
        await wire.subscribed(nc)
        sent = [(f"d.{k % 3}", b"%d" % k) for k in range(500)]
        for subject, data in sent[:250]:
            await pub.publish(subject, data)
        await pub.publish("d.0", b"boom")
        for subject, data in sent[250:]:
            await pub.publish(subject, data)
        await pub.publish("o.x", b"plain")
        await pub.flush()
        assert (await ordinary.next_msg(timeout=5)).data == b"plain"
        for _ in range(100):
            if len(got) == len(sent):
                break
            await asyncio.sleep(0.05)
        assert got == sent
        assert "handling a message on d.0 failed" in caplog.text
        assert nc.is_connected and nc.stats["in_msgs"] >= len(sent) + 2
    finally:
        await nc.close()
        await pub.close()


async def test_write_now_puts_a_batch_on_the_socket_behind_what_the_client_holds(
        nats_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 5: written there and then - nats-py's flusher is not asked - and after whatever
    the client already had pending (order kept); a batch that needs `publish` (a bad
    subject, an oversized payload) or a backed-up socket is left alone: False, nothing
    written, nothing dropped from the client's pending buffer."""
    pub = await nats.connect(nats_url)
    sub = await nats.connect(nats_url)
    try:
        listening = await _listen(sub, "w.n.*", 4)
        await pub._send_command(b"PUB w.n.0 5\r\nfirst\r\n")  # pending, not yet flushed
        sent = pub.stats["out_msgs"]

        flushes: list[bool] = []
        flush_pending = pub._flush_pending

        async def counting(force_flush: bool = False) -> object:
            flushes.append(force_flush)
            return await flush_pending(force_flush)

        pub._flush_pending = counting  # type: ignore[method-assign]
        assert wire.write_now(pub, [("w.n.1", b"a"), ("w.n.2", b"bb"), ("w.n.3", b"")])
        assert flushes == []  # the flusher was not asked: the bytes are with the socket
        assert pub._pending == [] and pub._pending_data_size == 0
        assert pub.stats["out_msgs"] - sent == 3
        assert await asyncio.wait_for(listening, 10) == [
            ("w.n.0", b"first"), ("w.n.1", b"a"), ("w.n.2", b"bb"), ("w.n.3", b"")]

        await pub._send_command(b"PUB w.n.0 4\r\nheld\r\n")
        held = list(pub._pending)
        too_big = b"x" * (pub.max_payload + 1)
        for batch in ([("w.n.1", b"ok"), ("w n", b"bad")], [("w.n.1", too_big)], [("", b"1")]):
            assert not wire.write_now(pub, batch)
            assert pub._pending == held  # untouched: the caller sends it the usual way
        monkeypatch.setattr(wire, "WRITE_NOW_MAX_BUFFERED", -1)  # "the socket is backed up"
        assert not wire.write_now(pub, [("w.n.1", b"ok")])
        assert pub._pending == held
        assert wire.write_now(pub, [])  # nothing to write: done
    finally:
        await pub.close()
        await sub.close()


async def test_write_now_declines_a_closed_or_foreign_client(nats_url: str) -> None:
    pub = await nats.connect(nats_url)
    await pub.close()
    assert not wire.write_now(pub, [("w.a", b"1")])
    assert not wire.write_now(object(), [("w.a", b"1")])


async def test_write_now_declines_a_socket_closed_before_the_client_noticed(
        nats_url: str) -> None:
    """The server dropped the connection (a slow consumer under load): the socket is closed
    while the client still reads as connected. Written there, the batch was lost (asyncio)
    or the write raised and ended the broker's outbox (uvloop); declined, it goes the usual
    way, kept for the reconnect."""
    pub = await nats.connect(nats_url, allow_reconnect=False)
    try:
        await pub._send_command(b"PUB w.c 4\r\nheld\r\n")
        held = list(pub._pending)
        pub._transport._io_writer.transport.abort()
        assert pub.is_connected  # the client has not noticed yet
        assert not wire.write_now(pub, [("w.c", b"1")])
        assert pub._pending == held
    finally:
        with contextlib.suppress(ConnectionError):  # the socket is gone under it
            await pub.close()


async def test_flush_can_overtake_a_subscription_and_subscribed_cannot(
        nats_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 6. nats-py's `flush()` writes its PING ahead of a SUB still pending for the
    flusher task (the order on the socket, recorded here), so its PONG does not prove the
    server has the subscription: a message another connection publishes then can reach no
    one (one CI run lost two that way). `subscribed` puts its probe behind the SUB and
    returns once the probe is back; after it, another connection's message arrives. A probe
    that never comes back raises, and its own subscription is not left behind."""
    nc = await nats.connect(nats_url)
    pub = await nats.connect(nats_url)
    try:
        written: list[bytes] = []
        transport = nc._transport
        write, writelines = transport.write, transport.writelines

        def record(data: bytes) -> None:
            written.append(bytes(data))
            write(data)

        def record_lines(lines: list[bytes]) -> None:
            written.extend(bytes(x) for x in lines)
            writelines(lines)

        monkeypatch.setattr(transport, "write", record)
        monkeypatch.setattr(transport, "writelines", record_lines)
        first = await nc.subscribe("b.first")
        await nc.flush()
        frames = b"".join(written).split(b"\r\n")
        assert frames.index(b"PING") < frames.index(b"SUB b.first  %d" % first._id), \
            "nats-py now writes flush()'s PING behind pending SUBs: rule 6 can be revisited"

        written.clear()
        second = await nc.subscribe("b.second")
        await wire.subscribed(nc)
        frames = b"".join(written).split(b"\r\n")
        sub_at = frames.index(b"SUB b.second  %d" % second._id)
        probe_at = next(i for i, f in enumerate(frames) if f.startswith(b"PUB _INBOX."))
        assert sub_at < probe_at
        await pub.publish("b.second", b"heard")
        await pub.flush()
        assert (await second.next_msg(timeout=5)).data == b"heard"
        assert len(nc._subs) == 2  # the probe's subscription is gone again

        async def lost(subject: str, payload: bytes = b"") -> None:
            return None

        monkeypatch.setattr(nc, "publish", lost)
        with pytest.raises(nats.errors.TimeoutError):
            await wire.subscribed(nc, timeout=0.2)
        assert len(nc._subs) == 2
    finally:
        await nc.close()
        await pub.close()


async def test_replied_messages_are_framed_as_nats_py_frames_them_and_arrive_with_headers(
        nats_url: str) -> None:
    """Rule 8: the HPUB frames `send_replied` hands over in one are byte for byte the ones
    nats-py's `publish` builds for the same subject, reply (or none), headers and payload; a
    header nats-py would change or refuse, a bad subject or reply, or a payload over the
    limit is not framed: nothing is sent and the caller publishes."""
    pub = await nats.connect(nats_url)
    sub = await nats.connect(nats_url)
    try:
        stores = [(f"w.h.{k}", f"_INBOX.w.{k}" if k % 2 else "",
                   {"Nats-Msg-Id": f"p.{k}", "Gavel-X": "1"}, bytes([k]) * k) for k in range(5)]
        got: list[Msg] = []
        done = asyncio.get_running_loop().create_future()

        async def cb(msg: Msg) -> None:
            got.append(msg)
            if len(got) == 2 * len(stores):  # published, then sent again in one hand-over
                done.set_result(None)

        await sub.subscribe("w.h.*", cb=cb)
        await wire.subscribed(sub)
        handed: list[bytes] = []
        hand_over = pub._send_command

        async def capturing(cmd: bytes, priority: bool = False) -> None:
            handed.append(cmd)
            await hand_over(cmd, priority)

        pub._send_command = capturing  # type: ignore[method-assign]
        for subject, reply, headers, data in stores:
            await pub.publish(subject, data, reply=reply, headers=headers)
        by_publish = b"".join(handed)
        handed.clear()
        blocks = [wire.header_block(h) for _s, _r, h, _d in stores]
        assert await wire.send_replied(pub, [
            (s, r, b, d) for (s, r, _h, d), b in zip(stores, blocks, strict=True)
            if b is not None])
        assert len(handed) == 1 and handed[0] == by_publish  # one hand-over, the same bytes
        await asyncio.wait_for(done, 10)
        assert [(m.subject, m.reply, m.headers, m.data) for m in got] == [
            (s, r, h, d) for s, r, h, d in stores] * 2

        for bad in ({"Nats-Msg-Id": " p.1"}, {"Nats-Msg-Id": "a\r\nb"}, {"bad key": "1"},
                    {"": "1"}):
            assert wire.header_block(bad) is None
        head = wire.header_block({"Nats-Msg-Id": "p.1"})
        assert head == b"NATS/1.0\r\nNats-Msg-Id: p.1\r\n\r\n"
        handed.clear()
        too_big = b"x" * (pub.max_payload + 1)
        for batch in ([("w.h.1", "r.1", head, b"ok"), ("w h", "r.2", head, b"")],
                      [("w.h.1", "r 1", head, b"")], [("w.h.1", "r.1", head, too_big)]):
            assert not await wire.send_replied(pub, batch)
        assert handed == []  # nothing of a refused batch was handed over
        await pub.close()
        assert not await wire.send_replied(pub, [("w.h.1", "r.1", head, b"")])
    finally:
        await pub.close()
        await sub.close()
