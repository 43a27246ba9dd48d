"""A node's watch of its own node.json (`worker.watch`), and how little of JetStream a node's
credential may touch for it (`transport.identity` rule 4).

Real nats-server (with `gavel auth init`'s config where credentials matter), real broker
and agents.

What must hold: a node may create a consumer of its own key, on the create subject that
names it, and nothing else of JetStream - no consumer of another key or of the whole
bucket, no filter in the payload alone, no stream or consumer info, no gets, no deletes, no
purge, no KV write; what such a consumer delivers is that node's own node.json and nothing
else, and not into the bucket or the JetStream API. A watch whose consumer is deleted under
it makes a new one and still sees the next change; a delivery on its inbox by another
consumer, or of another key, is counted and changes nothing.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy

from gavel.shared import subjects
from gavel.shared.api import DrainReply, DrainRequest
from gavel.shared.records import NodeFile
from gavel.transport import identity as auth
from gavel.worker.watch import OTHER_CONSUMER, OTHER_KEY, NodeWatch
from tests.integration.authed import Authed, Witness
from tests.integration.harness import Cluster, wait_for

pytestmark = pytest.mark.integration

STREAM = subjects.NODES_STREAM


def create(name: str, filter_subject: str | None, deliver: str, **extra: Any) -> bytes:
    config: dict[str, Any] = {"name": name, "deliver_subject": deliver, "ack_policy": "none",
                              "deliver_policy": "last_per_subject", **extra}
    if filter_subject is not None:
        config["filter_subject"] = filter_subject
    return json.dumps({"stream_name": STREAM, "config": config}).encode()


async def test_a_node_may_watch_its_own_key_and_touch_nothing_else_of_jetstream(
        authed: Authed) -> None:
    broker_js = (await authed.connect(auth.BROKER)).jetstream()
    await broker_js.create_key_value(bucket=subjects.NODES_BUCKET, history=1)
    broker = await authed.connect(auth.BROKER)
    for node in ("a", "b"):
        await broker.publish(subjects.NODE_KEY.format(node=node),
                             msgspec.json.encode(NodeFile(node_id=node)))
    await broker.flush()
    witness = await Witness().start(authed, ("$JS.API.>", "$KV.>", "$JS.FC.>"))
    a = await authed.connect("a")
    own, other = subjects.NODE_KEY.format(node="a"), subjects.NODE_KEY.format(node="b")

    # What a node's credential may not ask of JetStream, each with a payload that would do it.
    refused = {
        f"$JS.API.CONSUMER.CREATE.{STREAM}": create("x1", own, "_INBOX_a.x"),
        f"$JS.API.CONSUMER.CREATE.{STREAM}.x2": create("x2", own, "_INBOX_a.x"),
        f"$JS.API.CONSUMER.CREATE.{STREAM}.x3.{other}": create("x3", other, "_INBOX_a.x"),
        f"$JS.API.CONSUMER.CREATE.{STREAM}.x4.$KV.gavel-nodes.>": create(
            "x4", "$KV.gavel-nodes.>", "_INBOX_a.x"),
        f"$JS.API.CONSUMER.DURABLE.CREATE.{STREAM}.x5": create("x5", own, "_INBOX_a.x"),
        f"$JS.API.CONSUMER.INFO.{STREAM}.x6": b"",
        f"$JS.API.CONSUMER.DELETE.{STREAM}.x6": b"",
        f"$JS.API.CONSUMER.NAMES.{STREAM}": b"{}",
        f"$JS.API.CONSUMER.LIST.{STREAM}": b"{}",
        f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.x6": b"{}",
        f"$JS.API.STREAM.INFO.{STREAM}": b"",
        f"$JS.API.STREAM.MSG.GET.{STREAM}": json.dumps({"last_by_subj": other}).encode(),
        f"$JS.API.DIRECT.GET.{STREAM}.{own}": b"",
        f"$JS.API.DIRECT.GET.{STREAM}.{other}": b"",
        f"$JS.API.STREAM.PURGE.{STREAM}": b"{}",
        f"$JS.API.STREAM.DELETE.{STREAM}": b"",
        f"$JS.API.STREAM.UPDATE.{STREAM}": b"{}",
        f"$JS.API.STREAM.CREATE.{STREAM}": b"{}",
        "$JS.API.INFO": b"",
        f"$JS.FC.{STREAM}.x.1": b"",
        own: b"{}",
        other: b"{}",
    }
    for subject, payload in refused.items():
        await a.publish(subject, payload, reply="_INBOX_a.r")

    # What it may: a consumer of its own key, the filter in the subject. It delivers only
    # that key, and the server holds the payload's filter to the subject's.
    got: list[str] = []

    async def on_delivery(msg: Any) -> None:
        if msg.data:
            got.append(msg.subject)

    await a.subscribe("_INBOX_a.watch", cb=on_delivery)
    ok = await a.request(subjects.NODE_WATCH.format(name="mine", node="a"),
                         create("mine", own, "_INBOX_a.watch"), timeout=5)
    assert "error" not in json.loads(ok.data), ok.data
    mismatch = await a.request(subjects.NODE_WATCH.format(name="wide", node="a"),
                               create("wide", "$KV.gavel-nodes.>", "_INBOX_a.watch"), timeout=5)
    assert json.loads(mismatch.data)["error"]["err_code"] == 10131  # filter != subject's
    unfiltered = await a.request(subjects.NODE_WATCH.format(name="none", node="a"),
                                 create("none", None, "_INBOX_a.watch"), timeout=5)
    assert json.loads(unfiltered.data)["error"]["err_code"] == 10131

    # Its consumer may name any deliver subject: not one inside the bucket (the server
    # refuses the cycle), and one on the JetStream API purges nothing (the server pushes
    # only to a subject subscribed by name: `tests/integration/test_strays.py` has those).
    cycle = await a.request(subjects.NODE_WATCH.format(name="cycle", node="a"),
                            create("cycle", own, other), timeout=5)
    assert json.loads(cycle.data)["error"]["err_code"] == 10081
    apis = (f"$JS.API.STREAM.PURGE.{STREAM}", f"$JS.API.STREAM.DELETE.{STREAM}")
    for n, api in enumerate(apis):
        made = await a.request(subjects.NODE_WATCH.format(name=f"api{n}", node="a"),
                               create(f"api{n}", own, api), timeout=5)
        assert "error" not in json.loads(made.data), made.data
    await a.subscribe("_INBOX_a.late", cb=on_delivery)
    await a.request(subjects.NODE_WATCH.format(name="late", node="a"),
                    create("late", own, "_INBOX_a.late"), timeout=5)
    await wait_for(lambda: got == [own, own], 10, what="its own node.json, delivered twice")
    await wait_for(lambda: all(authed.refused("a", "publish", s) for s in refused), 10,
                   what="every other JetStream call refused by the server")
    assert not witness.subjects() & set(refused), witness.subjects() & set(refused)
    await broker.publish(other, msgspec.json.encode(NodeFile(node_id="b", draining=True)))
    await broker.publish(own, msgspec.json.encode(NodeFile(node_id="a", draining=True)))
    await wait_for(lambda: got == [own, own, own, own], 10, what="its own next revision")
    assert other not in got
    info = await witness.nc.jetstream().stream_info(STREAM)
    assert info.state.messages == 2  # one per key: neither purged nor deleted


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
