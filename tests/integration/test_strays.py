"""A stray delivery never crashes a handler: every subject the broker and a worker
subscribe to counts and drops what it cannot serve.

A push consumer delivers wherever its creator said, with the subject its stream stored the
message under, a ``$JS.ACK`` reply, and - with flow control or idle heartbeats - status
messages with headers. No gavel node may create one any more (`broker.watches`), but any
identity with JetStream rights may. Real nats-server with `gavel auth init`'s config, a
real broker and agents on their own credentials: the witness creates consumers of node b's
key delivering to every subject the broker and node a subscribe to, with and without
flow control and heartbeats; the witness (`tests/integration/authed.py`) puts on each of
them what no gavel credential may: a message with headers, a flow-control request, an idle
heartbeat, a request without a reply subject, an empty payload (a ``$JS.ACK`` reply only
JetStream itself can give: nats-server refuses it from any client).

What must hold: nothing raises (no ERROR line, no traceback, anywhere); each is counted,
under its fixed kind; the broker and node a change nothing for them; and the broker places
the next valid submission.

Heartbeats reach the broker through the heartbeat stream (`broker.heartbeat_stream`), which
keeps each subject's newest message: what strays there is stored and read like a heartbeat
(the stream keeps its headers, not its reply, and keeps nothing with a status line), so
the witness puts those strays one at a time, each read before the next, on the subject of
a node that does not run.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec
import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy

from gavel.broker.service import Broker, Config
from gavel.shared import subjects
from gavel.shared.api import (
    CancelRequest,
    DrainReply,
    DrainRequest,
    EventsRequest,
    NodesRequest,
    StatsRequest,
    StatusReply,
    StatusRequest,
    SubmitReply,
    SubmitRequest,
    WhyRequest,
)
from gavel.shared.messages import (
    RFB,
    AssignmentRequest,
    Award,
    BidReply,
    Cancel,
    Event,
    Heartbeat,
    Message,
    Shape,
    WatchRequest,
)
from gavel.shared.strategies import make_strategy
from gavel.transport import identity as auth
from gavel.transport.client import call
from gavel.transport.inbound import CONTROL, HEADERS, JETSTREAM
from gavel.worker.agent import Agent
from tests.integration.authed import WITNESS, Authed, Witness
from tests.integration.harness import TIMING, sleeper_spec, wait_for

pytestmark = pytest.mark.integration

_enc = msgspec.msgpack.Encoder()
FC = "$JS.FC.KV_gavel-nodes.stranger.1"
FLOW = b"NATS/1.0 100 FlowControl Request\r\n\r\n"
BEAT = b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 0\r\nNats-Last-Stream: 0\r\n\r\n"

#: Every subject the broker subscribes to (`Broker.start`, `Api.start`) with a message it
#: would serve there, and the inbox a request on it is answered under ("" for no request).
VERBS: dict[str, Message] = {
    "submit": SubmitRequest(spec=sleeper_spec("stray")), "status": StatusRequest(),
    "nodes": NodesRequest(), "why": WhyRequest(instance_id="x"), "events": EventsRequest(),
    "stats": StatsRequest(), "cancel": CancelRequest(instance_id="x"),
    "drain": DrainRequest(node_id="a")}
BROKER_SUBJECTS: dict[str, tuple[Message, str]] = {
    subjects.BIDS.format(node="b"): (BidReply(auction_id="x", node_id="b", answers=[]), ""),
    subjects.REPORT.format(node="b"): (Event(instance_id="x", type="running", node_id="b"),
                                       ""),
    subjects.ASSIGN.format(node="b"): (AssignmentRequest(instance_id="x", node_id="b"),
                                       "_INBOX_b.stray"),
    subjects.WATCH.format(node="b"): (WatchRequest(node_id="b", deliver="_INBOX_b.w"),
                                      "_INBOX_b.stray"),
    **{subjects.API.format(verb=v): (m, "_INBOX.stray") for v, m in VERBS.items()},
}
#: Every subject node a subscribes to (`Agent._subscribe`), with a message it would act on.
WORKER_SUBJECTS: dict[str, Message] = {
    subjects.RFB: RFB(auction_id="x", shapes=[Shape(cpu=0.1, memory_mb=8)], deadline_s=1),
    subjects.RFB_NODE.format(node="a"): RFB(auction_id="y", shapes=[Shape(cpu=0.1, memory_mb=8)],
                                            deadline_s=1),
    subjects.AWARD.format(node="a"): Award(auction_id="x", instance_id="evil", node_id="a",
                                           spec=sleeper_spec("evil")),
    subjects.CANCEL.format(node="a"): Cancel(instance_id="x", node_id="a"),
}


async def hpub(nc: Any, subject: str, reply: str, headers: bytes, payload: bytes = b"") -> None:
    """A message with a hand-made header block (a status line nats-py will not write)."""
    head = f"HPUB {subject} {reply} " if reply else f"HPUB {subject} "
    frame = head.encode() + b"%d %d\r\n" % (len(headers), len(headers) + len(payload))
    await nc._send_command(frame + headers + payload + b"\r\n")
    await nc._flush_pending()


async def strays(nc: Any, subject: str, message: Message, inbox: str) -> None:
    """Every kind of stray the witness can put on `subject`; a request's reply (where it
    has one) is its requester's own inbox, so only the stray itself is wrong."""
    data = _enc.encode(message)
    await nc.publish(subject, data, reply=inbox, headers={"Nats-Msg-Id": "stray"})
    await hpub(nc, subject, FC, FLOW)  # a flow-control request
    await hpub(nc, subject, "", BEAT)  # an idle heartbeat
    if inbox:
        await nc.publish(subject, data)  # a request without a reply subject
    await nc.publish(subject, b"", reply=inbox)  # an empty payload


def failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records
            if r.levelno >= logging.ERROR or r.exc_info]


async def test_every_stray_on_every_subject_is_counted_and_nothing_raises(
        authed: Authed, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    broker = Broker(Config(nats_url=authed.url, state_dir=authed.root / "state", timing=TIMING,
                           nats_options={"nkeys_seed": authed.seed(auth.BROKER)}))
    await broker.start()
    agents: dict[str, Agent] = {}
    tasks: list[asyncio.Task[None]] = []
    try:
        for node in ("a", "b"):
            agents[node] = Agent(
                nats_url=authed.url, node_id=node, strategy=make_strategy("least-loaded"),
                labels={}, state_dir=authed.root / node, timing=TIMING, cpu=2.0,
                memory_mb=2048, nats_options={"nkeys_seed": authed.seed(node)})
            tasks.append(asyncio.create_task(agents[node].run()))
        await wait_for(lambda: len(broker.liveness.eligible(broker.now())) == 2, 15,
                       what="both workers")
        op = await authed.connect(auth.OPERATOR)
        await call(op, "drain", DrainRequest(node_id="b"), DrainReply)  # b's key in KV
        await wait_for(lambda: agents["b"].draining, 15, what="b's watch sees its key")

        # Consumers of b's key, delivering to every subject the broker and node a hear,
        # plain and with flow control and idle heartbeats.
        js = (await authed.connect(WITNESS)).jetstream()
        targets = [*BROKER_SUBJECTS, *WORKER_SUBJECTS]
        for n, target in enumerate(targets):
            for k, extra in enumerate(({}, {"flow_control": True, "idle_heartbeat": 0.2})):
                await js.add_consumer(subjects.NODES_STREAM, config=ConsumerConfig(
                    name=f"stray{n}x{k}", filter_subject=subjects.NODE_KEY.format(node="b"),
                    deliver_subject=target, deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                    ack_policy="none", **extra))
        # Each delivers b's node.json, and the second its heartbeats, to the subjects the
        # broker subscribes to by name (nats-server pushes to a deliver subject only once
        # it sees interest, which it did not for the broker's wildcard subscriptions).
        rejected = broker.rejects.counts
        await wait_for(lambda: rejected.get(JETSTREAM, 0) >= 2 * len(VERBS)
                       and rejected.get(CONTROL, 0) >= len(VERBS), 15,
                       what=f"b's deliveries and heartbeats refused, have {rejected}")
        ignored = agents["a"].ignored
        await wait_for(lambda: ignored[JETSTREAM] >= 2 * len(WORKER_SUBJECTS)
                       and ignored[CONTROL] >= len(WORKER_SUBJECTS), 15,
                       what=f"b's deliveries and heartbeats ignored by a, have {ignored}")

        # The witness's hand-made strays on every one of those subjects.
        control, a_control = rejected.get(CONTROL, 0), ignored[CONTROL]
        witness = await Witness().start(authed)
        for subject, (message, inbox) in BROKER_SUBJECTS.items():
            await strays(witness.nc, subject, message, inbox)
        for subject, message in WORKER_SUBJECTS.items():
            await strays(witness.nc, subject, message, "")
        # A verb the broker does not know never reaches it: it subscribes verb by verb.
        await op.publish(subjects.API.format(verb="nosuch"), b"", reply="_INBOX.stray")

        n = len(BROKER_SUBJECTS)
        requests = {s for s, (_, inbox) in BROKER_SUBJECTS.items() if inbox}
        await wait_for(lambda: rejected.get(HEADERS) == n
                       and rejected.get(CONTROL, 0) >= control + 2 * n, 15,
                       what="every stray counted")
        for what in ("bid reply", "event", "assignment request", "watch request",
                     *(f"{v} request" for v in VERBS)):
            assert rejected.get(f"malformed {what}") == 1, (what, rejected)
        for what in ("assignment request", "watch request",
                     *(f"{v} request" for v in VERBS)):
            assert rejected.get(f"{what} without a reply subject") == 1, (what, rejected)
        assert len(requests) == 2 + len(VERBS)
        k = len(WORKER_SUBJECTS)
        await wait_for(lambda: ignored[HEADERS] == k and ignored[CONTROL] >= a_control + 2 * k,
                       15,
                       what=f"every stray counted by a, have {ignored}")
        malformed = agents["a"].malformed
        await wait_for(lambda: dict(malformed) == {"rfb": 2, "award": 1, "cancel": 1}, 15,
                       what=f"a's empty payloads counted, have {malformed}")

        # Through the heartbeat stream: a stray it stores is read as what it is now (its
        # headers kept, its reply not); one with a status line it does not store at all.
        silent = subjects.HEARTBEAT.format(node="c")
        headers = rejected.get(HEADERS, 0)
        await witness.nc.publish(silent, _enc.encode(Heartbeat(node_id="c")),
                                 headers={"Nats-Msg-Id": "x"})
        await wait_for(lambda: rejected.get(HEADERS) == headers + 1, 15,
                       what=f"a stored heartbeat with headers refused, have {rejected}")
        await hpub(witness.nc, silent, FC, FLOW)
        await hpub(witness.nc, silent, "", BEAT)
        await witness.nc.publish(silent, b"")
        await wait_for(lambda: rejected.get("malformed heartbeat") == 1, 15,
                       what=f"a stored empty heartbeat refused, have {rejected}")
        assert rejected.get(HEADERS) == headers + 1

        # Nothing was served: no heartbeat from the witness as b, no submission, no
        # instance on a; nothing raised anywhere; and the cluster places the next one.
        assert broker.liveness.heartbeats["b"].capacity.cpu == 2.0
        assert "c" not in broker.liveness.known()
        assert rejected.get("malformed heartbeat") == 1
        assert broker.ledger.state().instances == {}
        assert agents["a"].instances() == []
        assert failures(caplog) == []
        reply = await call(op, "submit", SubmitRequest(spec=sleeper_spec("after")),
                           SubmitReply)
        await wait_for(lambda: broker.ledger.state().placement_of(reply.instance_id) == "a",
                       15, what="placed on a (b is draining)")

        async def running() -> bool:
            st = await call(op, "status", StatusRequest(instance_id=reply.instance_id),
                            StatusReply)
            return st.instances[0].state == "running"
        await wait_for(running, 15, what="running on a")
        assert failures(caplog) == []
        assert [v for v in authed.violations()] == []
    finally:
        for agent in agents.values():
            await agent.stop()
        await asyncio.gather(*tasks)
        await broker.close()
