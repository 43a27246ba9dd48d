"""The core loop end to end: RFB over a real nats-server, bids from each worker's own
strategy, lowest-load award, a real git commit, a real child process."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import msgspec
import nats
import pygit2
import pytest

from gavel.broker.ledger.repository import Change
from gavel.shared import subjects
from gavel.shared.api import SubmitReply, SubmitRequest, WhyReply, WhyRequest
from gavel.shared.messages import RFB, Bid, BidReply, Capacity, Event, Heartbeat, Spec
from gavel.shared.reasons import Reason
from gavel.shared.records import InstanceRecord, parse_trailers
from gavel.transport import wire
from gavel.transport.client import call
from tests.integration.harness import TIMING, Cluster, sleeper_spec, wait_for, writer_spec

pytestmark = pytest.mark.integration


async def test_submit_places_once_runs_the_process_and_why_shows_every_bid(
        cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a", "least-loaded")
    await cluster.start_agent("node-b", "binpack")
    await cluster.start_agent("node-c", "spread")
    await cluster.start_agent("node-d", "headroom", labels={"zone": "x"})
    await cluster.wait_nodes(4)
    out = tmp_path / "ran"
    iid = await cluster.submit(writer_spec("hello", out, ports=["http"]))

    await wait_for(lambda: (out / iid).exists(), 15, what="the child process to run")
    env = json.loads((out / iid).read_text())
    why = await cluster.call("why", WhyRequest(instance_id=iid), WhyReply)
    rec = why.auctions[0]
    assert env["GAVEL_INSTANCE_ID"] == iid
    assert env["GAVEL_NODE_ID"] == rec.winner
    assert int(env["PORT"]) == int(env["GAVEL_PORT_HTTP"]) > 0
    assert {b.node_id for b in rec.bids} | {d.node_id for d in rec.declines} \
        | set(rec.silent) == {"node-a", "node-b", "node-c", "node-d"}
    assert {b.strategy for b in rec.bids} >= {"least-loaded", "binpack", "spread"}
    best = min(rec.bids, key=lambda b: (b.load, b.node_id))
    assert best.node_id == rec.winner

    # The commit that placed it names the instance, the node and every bid.
    ledger = cluster.ledger()
    placing = [c for c in ledger.history() if any(r.instance_id == iid and r.winner
                                                   for r in parse_trailers(c.message))]
    assert len(placing) == 1
    msg = placing[0].message
    assert f"place {iid} on {rec.winner}" in msg
    assert len(parse_trailers(msg)[0].bids) == len(rec.bids)
    # At the placing commit exactly one node.json holds the instance.
    tree = placing[0].tree
    holders = [e.name for e in ledger.repo[tree["nodes"].id]
               if iid in ledger.repo[ledger.repo[e.id]["node.json"].id].data.decode()]
    assert holders == [rec.winner]

    # The process exits 0: the instance succeeds and leaves node.json.
    await wait_for(lambda: cluster.ledger().state().instances[iid].state == "succeeded", 15,
                   what="succeeded in git")
    assert cluster.holders(iid) == []


async def test_label_constraint_and_unschedulable_reason(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a", labels={"zone": "a"})
    await cluster.start_agent("node-b", labels={"zone": "b"})
    await cluster.wait_nodes(2)
    iid = await cluster.submit(sleeper_spec("eu", labels={"zone": "b"}))
    await wait_for(lambda: cluster.holders(iid) == ["node-b"], 10, what="placed on node-b")
    bad = await cluster.submit(sleeper_spec("gpu", labels={"gpu": "true"}))

    async def unschedulable() -> bool:
        return (await cluster.status(bad)).state == "unschedulable"

    await wait_for(unschedulable, 10, what="unschedulable")
    st = await cluster.status(bad)
    assert st.reason == Reason.MISSING_LABEL
    assert st.detail == "0/2 nodes bid: 2 missing label gpu=true"


async def test_tag_guard_writes_nothing_and_says_pinned(cluster: Cluster) -> None:
    ledger = cluster.ledger()
    rec = InstanceRecord(instance_id="web-1", spec=sleeper_spec("web"))
    head = ledger.apply(Change(instances={"web-1": rec}), "submit web-1", None)
    ledger.repo.references.create("refs/tags/v1", pygit2.Oid(hex=head))
    refs_before = {r: str(ledger.repo.references[r].target) for r in ledger.repo.references}

    nc = await cluster.client()
    seen: list[Event] = []

    async def collect(m: nats.aio.msg.Msg) -> None:
        seen.append(msgspec.msgpack.decode(m.data, type=Event))

    await nc.subscribe(subjects.EVENTS.format(instance="web-1"), cb=collect)
    await wire.subscribed(nc)
    await cluster.start_broker(ref="v1")
    await cluster.start_agent("node-a")
    await wait_for(lambda: any(e.type == "error" for e in seen), 10, what="an error event")
    err = next(e for e in seen if e.type == "error")
    assert err.reason == Reason.PINNED
    assert "pinned" in err.reason and "tag" in err.reason
    with pytest.raises(Exception, match="pinned"):
        await cluster.submit(sleeper_spec("other"))
    await asyncio.sleep(TIMING.tick_s * 3)
    fresh = pygit2.Repository(str(cluster.state / "state.git"))
    after = {r: str(fresh.references[r].target) for r in fresh.references}
    assert after == refs_before
    assert cluster.holders("web-1") == []


async def test_broker_restart_replaces_nothing(cluster: Cluster) -> None:
    await cluster.start_broker()
    for n in ("node-a", "node-b", "node-c"):
        await cluster.start_agent(n)
    await cluster.wait_nodes(3)
    ids = [await cluster.submit(sleeper_spec(f"svc{i}")) for i in range(5)]
    await wait_for(lambda: all(len(cluster.holders(i)) == 1 for i in ids), 15,
                   what="all placed")
    placed = {i: cluster.holders(i) for i in ids}
    head = cluster.ledger().head()
    await cluster.stop_broker()
    await cluster.start_broker()
    await cluster.wait_nodes(3)
    await asyncio.sleep(TIMING.tick_s * 5)
    assert cluster.ledger().head() == head
    assert {i: cluster.holders(i) for i in ids} == placed


async def test_quiet_node_stops_winning(cluster: Cluster) -> None:
    """A node that stops heartbeating is no longer asked, even if it keeps bidding low."""
    broker = await cluster.start_broker()
    await cluster.start_agent("node-a")
    nc = await nats.connect(cluster.url)
    enc = msgspec.msgpack.Encoder()
    heartbeating = True

    async def on_rfb(msg: nats.aio.msg.Msg) -> None:
        rfb = msgspec.msgpack.decode(msg.data, type=RFB)
        answers = [Bid(shape=i, load=0.0, strategy="eager") for i in range(len(rfb.shapes))]
        await nc.publish(subjects.BIDS.format(node="node-z"),
                         enc.encode(BidReply(auction_id=rfb.auction_id, node_id="node-z",
                                             answers=answers)))

    async def beat() -> None:
        while heartbeating:
            hb = Heartbeat(node_id="node-z", capacity=Capacity(cpu=64, memory_mb=65536,
                                                                ports=100),
                           port_range=[30000, 30099])
            await nc.publish(subjects.HEARTBEAT.format(node="node-z"), enc.encode(hb))
            await asyncio.sleep(TIMING.heartbeat_s)

    await nc.subscribe(subjects.RFB, cb=on_rfb)
    beater = asyncio.create_task(beat())
    await cluster.wait_nodes(2)
    first = await cluster.submit(sleeper_spec("one"))
    await wait_for(lambda: cluster.holders(first) == ["node-z"], 10, what="node-z wins")

    heartbeating = False
    await beater
    await wait_for(lambda: broker.liveness.eligible(broker.now()) == ["node-a"],
                   TIMING.unreachable_s * 2, what="node-z unreachable")
    later = [await cluster.submit(sleeper_spec(f"later{i}")) for i in range(3)]
    await wait_for(lambda: all(cluster.holders(i) for i in later), 10, what="later placed")
    assert all(cluster.holders(i) == ["node-a"] for i in later)
    await nc.close()


async def test_bad_spec_is_refused_by_the_broker_api(cluster: Cluster) -> None:
    await cluster.start_broker()
    nc = await cluster.client()
    resp = await nc.request(subjects.API.format(verb="submit"), b"\xc1garbage", timeout=5)
    assert b"malformed submit request" in resp.data
    ok = time.monotonic()
    assert ok > 0


def test_spec_roundtrip_sanity() -> None:
    spec = Spec(name="x", command=["true"])
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(spec), type=Spec) == spec


async def test_submits_from_many_clients_share_group_commits(cluster: Cluster) -> None:
    """A submit waits for its commit; served one after another (as a subscription delivers
    them), twelve clients' submits took twelve commits. Served side by side, the ones that
    arrive while a commit is written all go into the next."""
    await cluster.start_broker()
    spec = sleeper_spec("many")
    clients = [await nats.connect(cluster.url) for _ in range(12)]
    try:
        replies = await asyncio.gather(*(
            call(nc, "submit", SubmitRequest(spec=spec, instance_id=f"many-{k}"), SubmitReply)
            for k, nc in enumerate(clients)))
    finally:
        for nc in clients:
            await nc.close()
    assert sorted(r.instance_id for r in replies) == sorted(f"many-{k}" for k in range(12))
    submits = [c for c in cluster.ledger().history()
               if any(line.startswith("submit ") for line in c.message.splitlines())]
    assert 1 <= len(submits) <= 4, [c.message.splitlines()[0] for c in submits]
