"""A node's watch of its own node.json (`worker.watch`), and how little of JetStream a node's
credential may touch for it (`transport.identity` rule 4).

Real nats-server (with `gavel auth init`'s config where credentials matter), real broker
and agents.

What must hold: a node may call nothing of JetStream - no consumer of its own key or any
other, wherever it delivers, no stream or consumer info, no gets (direct or not), no
deletes, no purge, no KV write - whatever reply subject it names; the broker makes its watch
on its request, delivering only into its own inbox (one token under ``_INBOX_<node>``),
refuses any other deliver subject with a sentence, and holds one consumer per node however
often the node asks; what that consumer delivers is that node's own node.json, and the
server drops it once the node has gone. A watch whose consumer is deleted under it makes a
new one and still sees the next change; a delivery on its inbox by another consumer, or of
another key, is counted and changes nothing.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import msgspec
import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy

from gavel.broker.service import Broker, Config
from gavel.shared import subjects
from gavel.shared.api import DrainReply, DrainRequest
from gavel.shared.messages import ApiError, WatchGrant, WatchRequest
from gavel.shared.reasons import Reason
from gavel.shared.records import NodeFile
from gavel.transport import identity as auth
from gavel.worker.watch import OTHER_CONSUMER, OTHER_KEY, NodeWatch
from tests.integration.authed import Authed, Witness
from tests.integration.harness import TIMING, Cluster, wait_for

pytestmark = pytest.mark.integration

STREAM = subjects.NODES_STREAM


def create(name: str, filter_subject: str | None, deliver: str, **extra: Any) -> bytes:
    config: dict[str, Any] = {"name": name, "deliver_subject": deliver, "ack_policy": "none",
                              "deliver_policy": "last_per_subject", **extra}
    if filter_subject is not None:
        config["filter_subject"] = filter_subject
    return json.dumps({"stream_name": STREAM, "config": config}).encode()


#: Where a node once had the server deliver its KV watch: another node's awards, every
#: node's RFBs, the broker's API, an operator's inbox, another node's inbox.
ATTACKS = ("gavel.award.b", "gavel.rfb", "gavel.api.submit", "_INBOX.x", "_INBOX_b.x")


async def consumers_of(js: Any, node: str) -> list[str]:
    key = subjects.NODE_KEY.format(node=node)
    return [c.name for c in await js.consumers_info(STREAM)
            if c.config.filter_subject == key]


async def test_a_node_calls_nothing_of_jetstream_and_its_watch_delivers_only_to_it(
        authed: Authed) -> None:
    broker = Broker(Config(nats_url=authed.url, state_dir=authed.root / "state", timing=TIMING,
                           nats_options={"nkeys_seed": authed.seed(auth.BROKER)}))
    await broker.start()
    try:
        await _attacks_refused(authed, broker)
    finally:
        await broker.close()


async def _attacks_refused(authed: Authed, broker: Broker) -> None:
    mirror = await authed.connect(auth.BROKER)
    for node in ("a", "b"):
        await mirror.publish(subjects.NODE_KEY.format(node=node),
                             msgspec.json.encode(NodeFile(node_id=node)))
    await mirror.flush()
    witness = await Witness().start(authed, ("$JS.API.>", "$KV.>", "$JS.FC.>", *ATTACKS))
    wjs = witness.nc.jetstream()
    a = await authed.connect("a")
    own, other = subjects.NODE_KEY.format(node="a"), subjects.NODE_KEY.format(node="b")

    # No JetStream call at all, each with a payload that would do harm, and each with a reply
    # subject the server would answer on: consumers of its own key delivering elsewhere, a
    # direct get answered onto another node's awards, and the rest.
    refused = {
        f"$JS.API.CONSUMER.CREATE.{STREAM}": create("x1", own, "_INBOX_a.x"),
        f"$JS.API.CONSUMER.CREATE.{STREAM}.x3.{other}": create("x3", other, "_INBOX_a.x"),
        f"$JS.API.CONSUMER.DURABLE.CREATE.{STREAM}.x5": create("x5", own, "_INBOX_a.x"),
        **{subjects.NODE_WATCH.format(name=f"d{n}", node="a"): create(f"d{n}", own, target)
           for n, target in enumerate(ATTACKS)},
        f"$JS.API.CONSUMER.INFO.{STREAM}.x6": b"",
        f"$JS.API.CONSUMER.DELETE.{STREAM}.x6": b"",
        f"$JS.API.CONSUMER.LIST.{STREAM}": b"{}",
        f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.x6": b"{}",
        f"$JS.API.STREAM.INFO.{STREAM}": b"",
        f"$JS.API.STREAM.MSG.GET.{STREAM}": json.dumps({"last_by_subj": own}).encode(),
        f"$JS.API.DIRECT.GET.{STREAM}.{own}": b"",
        f"$JS.API.STREAM.PURGE.{STREAM}": b"{}",
        f"$JS.API.STREAM.DELETE.{STREAM}": b"",
        "$JS.API.INFO": b"",
        f"$JS.FC.{STREAM}.x.1": b"",
        own: b"{}",
        other: b"{}",
    }
    for subject, payload in refused.items():
        await a.publish(subject, payload, reply="gavel.award.b")

    # The broker makes the watch, and only into a's own inbox: every other deliver subject
    # is refused with a sentence, and so is one that is more than one token under it.
    for target in (*ATTACKS, "_INBOX_a.x.y", "_INBOX_a.*", "_INBOX_a.>", "_INBOX_a"):
        answer = await ask(a, target)
        assert isinstance(answer, ApiError) and answer.error == Reason.WATCH_DELIVER, target
    for name in ("b_0123456789abcdef", "a_x", "a_0123456789abcdeff", "a_0123456789ABCDEF", ""):
        answer = await ask(a, "_INBOX_a.x", consumer=name or "a")
        assert isinstance(answer, ApiError) and answer.error == Reason.WATCH_NAME, name
    got: list[str] = []

    async def on_delivery(msg: Any) -> None:
        if msg.data:
            got.append(msg.subject)

    inbox = a.new_inbox()
    await a.subscribe(inbox, cb=on_delivery)
    first = await ask(a, inbox)
    assert isinstance(first, WatchGrant), first
    await wait_for(lambda: got == [own], 10, what="its own node.json, delivered")
    await wait_for(lambda: all(authed.refused("a", "publish", s) for s in refused), 10,
                   what="every JetStream call refused by the server")

    # Bound: one consumer per node. Asking again at once is too soon; asking until granted
    # gives a new one and deletes the old, however often the node asks.
    assert await ask(a, inbox) == ApiError(error=Reason.WATCH_TOO_SOON)
    assert await consumers_of(wjs, "a") == [first.consumer]
    grants: list[str] = []
    later: list[tuple[str, str]] = []

    async def on_latest(msg: Any) -> None:
        if msg.data:
            later.append((msg.metadata.consumer, msg.subject))

    async def granted_again() -> bool:
        inbox = a.new_inbox()
        await a.subscribe(inbox, cb=on_latest)
        answer = await ask(a, inbox)
        if isinstance(answer, WatchGrant):
            grants.append(answer.consumer)
        return len(grants) >= 3

    await wait_for(granted_again, 30, every=0.01, what="three more grants")
    assert await consumers_of(wjs, "a") == [grants[-1]]
    assert broker.watches.made == 4

    # Nothing reached any target, and the bucket holds both keys still.
    await mirror.publish(own, msgspec.json.encode(NodeFile(node_id="a", draining=True)))
    await mirror.flush()
    await wait_for(lambda: [k for c, k in later if c == grants[-1]] == [own, own], 10,
                   what="its own next revision")
    assert got == [own]  # the first consumer is gone
    heard = {s for s, _ in witness.seen}
    assert not heard & set(ATTACKS), heard & set(ATTACKS)
    sent = set(refused.items())  # the witness's own calls and the mirror's puts aside
    assert not sent & set(witness.seen), sent & set(witness.seen)
    info = await wjs.stream_info(STREAM)
    assert info.state.messages == 2  # one per key: neither purged nor deleted

    # A node gone leaves nothing behind: the server drops its consumer once nobody listens.
    await a.close()
    await wait_for(lambda: _none(consumers_of(wjs, "a")), 60,
                   what="a's consumer dropped after a left")


async def _none(names: Any) -> bool:
    return not await names


async def ask(nc: Any, deliver: str, consumer: str = "") -> WatchGrant | ApiError:
    request = WatchRequest(node_id="a", deliver=deliver,
                           consumer=consumer or f"a_{secrets.token_hex(8)}")
    msg = await nc.request(subjects.WATCH.format(node="a"), msgspec.msgpack.encode(request),
                           timeout=5)
    answer: WatchGrant | ApiError = msgspec.msgpack.decode(msg.data, type=WatchGrant | ApiError)
    return answer


async def test_a_watch_whose_consumer_vanished_is_made_anew(cluster: Cluster) -> None:
    await cluster.start_broker()
    agent = await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    await wait_for(lambda: agent.converger.watch is not None
                   and agent.converger.watch.created == 1, 15, what="the first watch")
    watch = agent.converger.watch
    assert watch is not None
    js = (await cluster.client()).jetstream()
    await js.delete_consumer(STREAM, watch.consumer)  # as a server restart would lose it
    await wait_for(lambda: watch.created == 2, 15, what="a new consumer after the silence")
    await cluster.call("drain", DrainRequest(node_id="node-a"), DrainReply)
    await wait_for(lambda: agent.draining, 15, what="the new watch sees the next change")


async def test_a_watch_drops_what_another_consumer_delivers_to_it(cluster: Cluster) -> None:
    await cluster.start_broker()
    agent = await cluster.start_agent("node-a")
    await cluster.start_agent("node-b")
    await cluster.wait_nodes(2)
    await cluster.call("drain", DrainRequest(node_id="node-b"), DrainReply)  # b's key
    await wait_for(lambda: cluster.agents["node-b"].draining, 15, what="b drained")
    watch = agent.converger.watch
    assert isinstance(watch, NodeWatch) and watch._sub is not None
    inbox = watch._sub.subject
    js = (await cluster.client()).jetstream()
    await js.add_consumer(STREAM, config=ConsumerConfig(
        name="intruder", filter_subject=subjects.NODE_KEY.format(node="node-b"),
        deliver_subject=inbox, deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        ack_policy="none"))
    await wait_for(lambda: agent.ignored[OTHER_CONSUMER] >= 1, 15,
                   what="the intruder's delivery counted")
    assert not agent.draining  # b's node.json said draining: a did not take it for its own
    assert agent.ignored[OTHER_KEY] == 0
