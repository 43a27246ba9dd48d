"""The broker is nobody's deputy: it answers a request only under its requester's own inbox,
and its own credential may publish only what the broker publishes.

Real nats-server with the config `gavel auth init` writes, real seeds, a real broker and
agents on their own credentials; a witness that may hear every subject
(`tests/integration/authed.py`) watches ``>``.

What must hold: for every API verb (as the operator) and for the assignment request (as a
node), a request whose reply subject lies outside the caller's inbox - another node's KV
key or its own, the JetStream API, an event subject, the RFB subject, another node's inbox,
the inbox prefix without its dot or with an empty or wildcard token - is refused, counted
under its fixed kind, never acted on and never answered; afterwards the KV bucket and every
node's key are as git says; no secret reaches any subject but the owning node's inbox; and
the broker's credential itself is refused by the server for a publish outside its list
(the JetStream API's purge above all) or a subscription to what it does not serve.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import nats.js.errors
import pytest

from gavel.broker.service import Broker, Config
from gavel.shared import subjects
from gavel.shared.api import (
    CancelRequest,
    DeployRequest,
    DrainReply,
    DrainRequest,
    EndpointsRequest,
    EventsRequest,
    NodesRequest,
    PeriodicJobsRequest,
    RollbackRequest,
    ScaleRequest,
    ServiceRequest,
    ServicesRequest,
    StatsRequest,
    StatusReply,
    StatusRequest,
    StopServiceRequest,
    SubmitReply,
    SubmitRequest,
    TuneRequest,
    WhyRequest,
)
from gavel.shared.messages import (
    RFB,
    ApiError,
    AssignmentRequest,
    Award,
    Cancel,
    Event,
    Message,
    Spec,
)
from gavel.shared.planning import PlanRequest
from gavel.shared.records import NodeFile
from gavel.shared.strategies import make_strategy
from gavel.transport import identity as auth
from gavel.transport.client import call
from gavel.transport.inbound import OUTSIDE_INBOX
from gavel.worker.agent import Agent
from tests.integration.authed import Authed, Witness
from tests.integration.harness import TIMING, sleeper_spec, wait_for

pytestmark = pytest.mark.integration

_enc = msgspec.msgpack.Encoder()
SECRET = "s3cret-of-a-only"

#: Reply subjects outside every requester's inbox, and the ones outside one kind's only.
OUTSIDE_ALL = [
    "$KV.gavel-nodes.b", "$KV.gavel-nodes.a", "$JS.API.STREAM.PURGE.KV_gavel-nodes",
    "$JS.API.STREAM.DELETE.KV_gavel-nodes", "$JS.API.CONSUMER.CREATE.KV_gavel-nodes",
    "gavel.events.x", "gavel.rfb", "gavel.award.b", "gavel.cancel.a", "_INBOX_b.x",
    "_INBOX_broker.x", "_INBOX_a", "_INBOX_ab.x", "_INBOX_a.", "_INBOX_a..x", "_INBOX_a.*",
    "_INBOX_a.>", "_INBOX_a.x.", "_INBOX", "_INBOXx.y", "_INBOX.", "_INBOX.*", "_INBOX.>",
]
NODE_A_OUTSIDE = [*OUTSIDE_ALL, "_INBOX.x"]  # a node is answered on its own inbox only
OPERATOR_OUTSIDE = [*OUTSIDE_ALL, "_INBOX_a.x"]  # operators on theirs only
#: What a deputy's answer on these subjects would be mistaken for, if anything may be there.
LEGIT: dict[str, Any] = {"$KV.gavel-nodes.": NodeFile, "gavel.rfb": RFB,
                         "gavel.award.": Award, "gavel.cancel.": Cancel,
                         "gavel.events.": Event}


def legit(subject: str, data: bytes) -> bool:
    """Whether `data` on `subject` is what the broker really sends there."""
    for prefix, type_ in LEGIT.items():
        if subject.startswith(prefix):
            try:
                if type_ is NodeFile:
                    msgspec.json.decode(data, type=NodeFile)
                else:
                    msgspec.msgpack.decode(data, type=type_)
            except (msgspec.DecodeError, RecursionError):
                return False
            return True
    return False


async def kv_state(witness: Witness) -> dict[str, tuple[int, bytes]]:
    kv = await witness.nc.jetstream().key_value(subjects.NODES_BUCKET)
    out = {}
    for key in ("a", "b"):
        entry = await kv.get(key)
        out[key] = (entry.revision or 0, entry.value or b"")
    return out


async def test_no_request_is_answered_outside_its_requesters_inbox(authed: Authed) -> None:
    broker = Broker(Config(nats_url=authed.url, state_dir=authed.root / "state", timing=TIMING,
                           secrets={"SECRET_TOKEN": SECRET},
                           nats_options={"nkeys_seed": authed.seed(auth.BROKER)}))
    await broker.start()
    agents: dict[str, Agent] = {}
    tasks: list[asyncio.Task[None]] = []
    try:
        for node, cpu in (("a", 4.0), ("b", 1.0)):
            agents[node] = Agent(
                nats_url=authed.url, node_id=node, strategy=make_strategy("least-loaded"),
                labels={}, state_dir=authed.root / node, timing=TIMING, cpu=cpu,
                memory_mb=2048, nats_options={"nkeys_seed": authed.seed(node)})
            tasks.append(asyncio.create_task(agents[node].run()))
        await wait_for(lambda: len(broker.liveness.eligible(broker.now())) == 2, 15,
                       what="both workers")
        op = await authed.connect(auth.OPERATOR)
        spec = Spec(name="app", command=sleeper_spec("app").command, cpu=2.0,
                    secrets=["SECRET_TOKEN"])
        iid = (await call(op, "submit", SubmitRequest(spec=spec), SubmitReply)).instance_id
        await wait_for(lambda: broker.ledger.state().placement_of(iid) == "a", 15,
                       what="placed on a (b has too little cpu)")
        await call(op, "drain", DrainRequest(node_id="b"), DrainReply)  # b gets a key too
        witness = await Witness().start(authed)
        await wait_for(lambda: _kv_has(witness), 15, what="both keys in KV")
        await wait_for(lambda: (agents["a"].converger.node is not None
                                and iid in agents["a"].converger.node.instances), 15,
                       what="a's watch sees its node.json")
        await wait_for(_running(op, iid), 15, what="running on a")
        before = await kv_state(witness)
        seen_before = len(witness.seen)
        instances_before = len(broker.ledger.state().instances)

        # Every verb as the operator, and the assignment request as node a, each with
        # every reply subject outside the caller's inbox, and once with none at all.
        requests: dict[str, Message] = {
            "submit": SubmitRequest(spec=spec), "status": StatusRequest(),
            "nodes": NodesRequest(), "why": WhyRequest(instance_id=iid),
            "events": EventsRequest(), "stats": StatsRequest(),
            "cancel": CancelRequest(instance_id=iid), "drain": DrainRequest(node_id="a"),
            "endpoints": EndpointsRequest(),
            "deploy": DeployRequest(spec=Spec(name="web", type="service", command=["true"])),
            "service": ServiceRequest(name="web"), "services": ServicesRequest(),
            "scale": ScaleRequest(name="web", count=2), "stop": StopServiceRequest(name="web"),
            "rollback": RollbackRequest(name="web"), "periodic": PeriodicJobsRequest(),
            "plan": PlanRequest(spec=spec), "tune": TuneRequest(batch_max=8)}
        assert set(requests) == set(broker.api.verbs), "a verb this test does not try"
        for verb, request in requests.items():
            subject = subjects.API.format(verb=verb)
            for reply in OPERATOR_OUTSIDE:
                await op.publish(subject, _enc.encode(request), reply=reply)
            await op.publish(subject, _enc.encode(request))
        node_a = await authed.connect("a")
        ask = _enc.encode(AssignmentRequest(instance_id=iid, node_id="a"))
        for reply in NODE_A_OUTSIDE:
            await node_a.publish(subjects.ASSIGN.format(node="a"), ask, reply=reply)
        await node_a.publish(subjects.ASSIGN.format(node="a"), ask)

        # ... then one request on each caller's own inbox, answered: the broker has heard
        # everything sent before it on that connection.
        st = await call(op, "status", StatusRequest(instance_id=iid), StatusReply)
        assert st.instances[0].state == "running"
        answer = msgspec.msgpack.decode(
            (await node_a.request(subjects.ASSIGN.format(node="a"), ask, timeout=5)).data,
            type=Award | ApiError)
        assert isinstance(answer, Award) and answer.secret_env == {"SECRET_TOKEN": SECRET}
        outside = len(requests) * len(OPERATOR_OUTSIDE) + len(NODE_A_OUTSIDE)
        await wait_for(lambda: broker.rejects.counts.get(OUTSIDE_INBOX) == outside, 15,
                       what=f"{outside} refusals, have {broker.rejects.counts}")
        for what in (*(f"{verb} request" for verb in requests), "assignment request"):
            assert broker.rejects.counts[f"{what} without a reply subject"] == 1, what

        # Nothing was acted on: no submission, cancel or drain ...
        await op.flush()
        assert len(broker.ledger.state().instances) == instances_before
        assert broker.ledger.state().services == {}
        assert broker.ledger.state().placement_of(iid) == "a"
        assert not agents["a"].draining and "a" not in broker.ledger.state().draining
        assert broker.auctioneer.tuner.pinned_batch_max is None  # nor a tune
        # ... nothing answered where it asked (what is on those subjects is the broker's
        # own traffic there), the bucket and every key as git says ...
        hostile = set(OPERATOR_OUTSIDE) | set(NODE_A_OUTSIDE)
        deputy = [(s, d) for s, d in witness.seen[seen_before:]
                  if s in hostile and not legit(s, d)]
        assert deputy == [], deputy
        after = await kv_state(witness)
        assert after == before
        for node in ("a", "b"):
            assert msgspec.json.decode(after[node][1], type=NodeFile) == \
                broker.ledger.state().nodes[node]
        # ... and a's secret went nowhere but a's inbox.
        leaked = {s for s, d in witness.seen if SECRET.encode() in d}
        assert leaked and all(s.startswith("_INBOX_a.") for s in leaked), leaked
    finally:
        for agent in agents.values():
            await agent.stop()
        await asyncio.gather(*tasks)
        await broker.close()


async def _kv_has(witness: Witness) -> bool:
    try:
        await kv_state(witness)
    except nats.js.errors.Error:
        return False
    return True


def _running(op: Any, iid: str) -> Any:
    async def check() -> bool:
        st = await call(op, "status", StatusRequest(instance_id=iid), StatusReply)
        return st.instances[0].state == "running"
    return check


#: What the broker's credential may not publish (the permission list is what it does).
BROKER_MAY_NOT = [
    "$JS.API.STREAM.PURGE.KV_gavel-nodes", "$JS.API.STREAM.DELETE.KV_gavel-nodes",
    "$JS.API.STREAM.UPDATE.KV_gavel-nodes", "$JS.API.STREAM.CREATE.other",
    "$JS.API.CONSUMER.CREATE.KV_gavel-nodes", "$JS.API.STREAM.MSG.DELETE.KV_gavel-nodes",
    "$JS.API.INFO", "$KV.other.a", "gavel.hb.a", "gavel.bids.a", "gavel.report.a",
    "gavel.assign.a", "gavel.api.status", "_INBOX_stranger.x", "_INBOX_a", "elsewhere",
]
BROKER_MAY_NOT_HEAR = [">", "gavel.>", "gavel.award.a", "gavel.rfb", "gavel.events.>",
                       "_INBOX.>", "_INBOX_a.>", "$KV.>", "$JS.>"]


async def test_the_brokers_own_credential_may_publish_only_what_it_publishes(
        authed: Authed) -> None:
    """Defence in depth: were the broker's code to answer where a request asks, the server
    would still refuse most of it (not the KV keys, the events, the RFBs and the inboxes it
    must publish on: for those the code's rule is the guard)."""
    js = (await authed.connect(auth.BROKER)).jetstream()
    await js.create_key_value(bucket=subjects.NODES_BUCKET, history=1)  # it may do this
    witness = await Witness().start(authed)
    nc = await authed.connect(auth.BROKER)
    for subject in BROKER_MAY_NOT:
        await nc.publish(subject, b"{}")
    for pattern in BROKER_MAY_NOT_HEAR:
        await nc.subscribe(pattern)
    await nc.publish("gavel.events.marker", b"")
    await wait_for(lambda: "gavel.events.marker" in witness.subjects(), 10, what="marker")
    await wait_for(lambda: all(authed.refused(auth.BROKER, "publish", s)
                               for s in BROKER_MAY_NOT), 10, what="every publish refused")
    await wait_for(lambda: all(authed.refused(auth.BROKER, "subscription", p)
                               for p in BROKER_MAY_NOT_HEAR), 10,
                   what="every subscription refused")
    assert not witness.subjects() & set(BROKER_MAY_NOT)
    info = await witness.nc.jetstream().stream_info(subjects.NODES_STREAM)
    assert info.config.name == subjects.NODES_STREAM  # not purged, not deleted


async def test_operators_call_one_verb_token_and_nothing_else(authed: Authed) -> None:
    witness = await Witness().start(authed)
    op = await authed.connect(auth.OPERATOR)
    refused = ["gavel.api.status.x", "gavel.apix", "$JS.API.STREAM.PURGE.KV_gavel-nodes",
               "$KV.gavel-nodes.a", "_INBOX.x"]
    for subject in refused:
        await op.publish(subject, b"")
    await op.publish("gavel.api.marker", b"")
    await wait_for(lambda: "gavel.api.marker" in witness.subjects(), 10, what="marker")
    await wait_for(lambda: all(authed.refused(auth.OPERATOR, "publish", s) for s in refused),
                   10, what="every publish refused")
    assert not witness.subjects() & set(refused)
