"""`bench.natslite` against a real nats-server and nats-py: what one sends the other reads,
the server's pings are answered, and a client that cannot connect says why."""

from __future__ import annotations

import asyncio

import msgspec
import nats
import pytest

from gavel.bench import natslite
from gavel.bench.agents import CLIENTS, BenchAgent
from gavel.shared import subjects
from gavel.shared.messages import RFB, Award, BidReply, Capacity, Shape, Spec
from gavel.shared.strategies import make_strategy
from gavel.transport import wire
from gavel.transport.natsserver import free_port


async def test_lite_and_nats_py_hear_each_other(nats_url: str) -> None:
    lite = await natslite.connect(nats_url, "lite")
    nc = await nats.connect(nats_url)
    try:
        heard: list[bytes] = []
        lite.subscribe("to.lite", heard.append)
        await lite.flush()
        for k in range(200):
            await nc.publish("to.lite", b"m%d" % k)
        await nc.publish("to.lite", b"x" * 200_000)  # spans many reads
        await nc.flush()
        sub = await nc.subscribe("to.py")
        await wire.subscribed(nc)  # not flush(): see broker.wire rule 6
        lite.publish("to.py", b"hello")
        await lite.flush()
        msg = await sub.next_msg(timeout=5)
        assert msg.data == b"hello"
        for _ in range(100):
            if len(heard) == 201:
                break
            await asyncio.sleep(0.05)
        assert heard[:200] == [b"m%d" % k for k in range(200)] and heard[200] == b"x" * 200_000
        assert lite.handler_errors == 0 and not lite.closed.done()
    finally:
        lite.close()
        await nc.close()


async def test_no_server_and_credentials_are_refused_with_a_sentence() -> None:
    with pytest.raises(OSError):
        await natslite.connect(f"nats://127.0.0.1:{free_port()}", "x", timeout=5)
    with pytest.raises(ValueError, match="plain nats://host:port only"):
        await natslite.connect("nats://user:pw@127.0.0.1:4222", "x")


@pytest.mark.parametrize("client", sorted(CLIENTS))
async def test_a_bench_agent_answers_the_same_on_either_client(nats_url: str,
                                                               client: str) -> None:
    """The bench agent bids through `shared.strategies.answer` and confirms an award with a
    running report (and, its lifetime later, the end), whichever client carries it."""
    agent = BenchAgent("n00001", make_strategy("least-loaded"), Capacity(cpu=4, memory_mb=4096),
                       lifetime_s=0.2)
    link = CLIENTS[client](agent)
    await link.start(nats_url)
    nc = await nats.connect(nats_url)
    try:
        bids = await nc.subscribe(subjects.BIDS.format(node="n00001"))
        reports = await nc.subscribe(subjects.REPORT.format(node="n00001"))
        await wire.subscribed(nc)
        enc = msgspec.msgpack.Encoder()
        await nc.publish(subjects.RFB_NODE.format(node="n00001"), enc.encode(
            RFB(auction_id="a1", shapes=[Shape(cpu=1, memory_mb=64)], deadline_s=1.0)))
        reply = msgspec.msgpack.decode((await bids.next_msg(timeout=5)).data, type=BidReply)
        assert reply.auction_id == "a1" and reply.node_id == "n00001"
        assert len(reply.answers) == 1
        await nc.publish(subjects.AWARD.format(node="n00001"), enc.encode(Award(
            auction_id="a1", instance_id="i-1", node_id="n00001",
            spec=Spec(name="noop", command=["true"], cpu=1, memory_mb=64))))
        report = await reports.next_msg(timeout=5)
        assert b"i-1" in report.data and agent.held.keys() == {"i-1"}
        assert agent.view.committed.cpu == 1
        exited = await reports.next_msg(timeout=5)  # its lifetime later: it ends, status 0
        assert b"exited" in exited.data and agent.held == {} and agent.exited == 1
        assert agent.view.committed.cpu == 0
    finally:
        await link.close()
        await nc.close()
