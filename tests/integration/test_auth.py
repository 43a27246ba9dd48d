"""Identity as a property of the transport: a real nats-server run with the config
`gavel auth init` writes, and real connections with the seeds it writes.

What must hold: no credential, no connection; a node's credential publishes only as that
node (the server refuses the rest, so the broker never hears it and its state does not move);
it cannot award, request bids, cancel, write KV or call the API, and cannot read another
node's inbox, where the broker's answers to that node's assignment requests carry its
secrets; operators call the API and read events but cannot bid or award; and a cluster with
every part on its own credential places end to end, `gavel up` included, without one
permissions violation in the server's log; a broker the server turns away says why and
still stops on SIGTERM.

Every refusal is proven twice: nats-py's error callback names the subject, and a subscriber
that may hear every subject (the tests' witness, `tests/integration/authed.py`) never sees
the message — checked after the same connection's next, permitted message arrived there, so
"not yet" cannot pass for "never".
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest

from gavel.broker.connect import NatsUnreachable
from gavel.broker.service import Broker, Config
from gavel.shared import subjects
from gavel.shared.api import (
    NodesReply,
    NodesRequest,
    StatusReply,
    StatusRequest,
    SubmitReply,
    SubmitRequest,
)
from gavel.shared.messages import (
    RFB,
    AssignmentRequest,
    Award,
    Bid,
    BidReply,
    Cancel,
    Capacity,
    Event,
    Heartbeat,
    Message,
    Spec,
)
from gavel.shared.strategies import make_strategy
from gavel.transport import identity as auth
from gavel.transport import wire
from gavel.transport.client import ClientError, call, connect
from gavel.worker.agent import Agent
from tests.integration.authed import WITNESS, Authed
from tests.integration.harness import TIMING, UpDemo, gavel_process, sleeper_spec, wait_for

pytestmark = pytest.mark.integration

_enc = msgspec.msgpack.Encoder()
#: Every subject a node's or an operator's credential must never publish on, with a payload
#: that would be accepted if it got through.
FORGED_AS_B: dict[str, Message] = {
    subjects.BIDS.format(node="b"): BidReply(auction_id="x", node_id="b",
                                             answers=[Bid(shape=0, load=0.0, strategy="s")]),
    subjects.HEARTBEAT.format(node="b"): Heartbeat(node_id="b", strategy="s",
                                                   capacity=Capacity(cpu=64, memory_mb=65536)),
    subjects.REPORT.format(node="b"): Event(instance_id="i-1", type="running", node_id="b"),
    subjects.ASSIGN.format(node="b"): AssignmentRequest(instance_id="i-1", node_id="b"),
}
BROKER_ONLY: dict[str, Message] = {
    subjects.RFB: RFB(auction_id="x", shapes=[], deadline_s=1.0),
    subjects.AWARD.format(node="b"): Award(auction_id="x", instance_id="i-1", node_id="b",
                                           spec=Spec(name="evil", command=["true"])),
    subjects.CANCEL.format(node="b"): Cancel(instance_id="i-1", node_id="b"),
    f"$KV.{subjects.NODES_BUCKET}.b": Heartbeat(node_id="b"),
}


class Spy:
    """A subscriber that may hear every subject (`authed.WITNESS`) on every subject a test
    forges."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bytes]] = []

    async def start(self, authed: Authed, patterns: list[str]) -> Spy:
        nc = await authed.connect(WITNESS)

        async def cb(msg: Any) -> None:
            self.seen.append((msg.subject, msg.data))

        for p in patterns:
            await nc.subscribe(p, cb=cb)
        await wire.subscribed(nc)
        return self

    def subjects(self) -> set[str]:
        return {s for s, _ in self.seen}


async def forge_then_prove(authed: Authed, who: str, forged: dict[str, Message],
                           marker: tuple[str, Message], spy: Spy) -> None:
    """Publish every forged message as `who`, then one permitted `marker` on the same
    connection; once the spy has the marker, it would have had the forgeries (NATS keeps a
    connection's order). Each forgery must be refused by name and never seen."""
    nc = await authed.connect(who)
    for subject, message in forged.items():
        await nc.publish(subject, _enc.encode(message))
    await nc.publish(marker[0], _enc.encode(marker[1]))
    await nc.flush()
    await wait_for(lambda: marker[0] in spy.subjects(), 10, what=f"{who}'s permitted message")
    await wait_for(lambda: all(authed.refused(who, "publish", s) for s in forged), 10,
                   what=f"the server to refuse every forgery by {who}")
    assert not spy.subjects() & set(forged), "a forged message reached a broker subscriber"


async def test_no_credential_no_connection(authed: Authed, tmp_path: Path) -> None:
    with pytest.raises(nats.errors.Error, match=r"(?i)authorization"):
        await nats.connect(authed.url, allow_reconnect=False, connect_timeout=2)
    with pytest.raises(ClientError, match="refused a client without credentials"):
        await connect(authed.url)
    # A well-formed seed the server was never told about is no better.
    stranger = auth.init(tmp_path / "elsewhere", ["a"])
    with pytest.raises(ClientError, match="refused the credentials in"):
        await connect(authed.url, str(stranger.nodes["a"]))
    # The gavel CLI says the same in one sentence (exit 1: the server was unreachable to it).
    proc = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "gavel", "status", "--nats", authed.url],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "refused a client without credentials" in proc.stderr
    assert "Traceback" not in proc.stderr


async def test_a_node_cannot_speak_as_another(authed: Authed) -> None:
    broker = Broker(Config(nats_url=authed.url, state_dir=authed.root / "state", timing=TIMING,
                           nats_options={"nkeys_seed": authed.seed(auth.BROKER)}))
    await broker.start()
    try:
        spy = await Spy().start(authed, ["gavel.>"])
        rejects_before = dict(broker.rejects.counts)
        own = Heartbeat(node_id="a", strategy="s", capacity=Capacity(cpu=2, memory_mb=1024))
        await forge_then_prove(authed, "a", FORGED_AS_B,
                               (subjects.HEARTBEAT.format(node="a"), own), spy)
        # The broker heard a as a, and nothing as b: its state did not move for b.
        await wait_for(lambda: "a" in broker.liveness.known(), 10, what="a's own heartbeat")
        assert "b" not in broker.liveness.known()
        assert broker.rejects.counts == rejects_before
    finally:
        await broker.close()


async def test_a_worker_cannot_act_as_broker_or_operator(authed: Authed) -> None:
    spy = await Spy().start(authed, ["gavel.>", "$KV.>"])
    submit = subjects.API.format(verb="submit")
    forged: dict[str, Message] = {**BROKER_ONLY, submit: SubmitRequest(spec=sleeper_spec("x"))}
    await forge_then_prove(authed, "a", forged,
                           (subjects.HEARTBEAT.format(node="a"), Heartbeat(node_id="a")), spy)
    # The API says so in a sentence instead of timing out in silence.
    nc = await authed.connect("a")
    with pytest.raises(ClientError, match=r"permissions violation.*operator credential"):
        await call(nc, "submit", SubmitRequest(spec=sleeper_spec("x")), SubmitReply, timeout=30)


async def test_a_worker_cannot_read_another_nodes_inbox_or_traffic(authed: Authed) -> None:
    a = await authed.connect("a")
    b = await authed.connect("b")
    got_a: list[str] = []
    got_b: list[str] = []

    async def on_a(msg: Any) -> None:
        got_a.append(msg.subject)

    async def on_b(msg: Any) -> None:
        got_b.append(msg.subject)

    stolen = ["_INBOX_b.>", "_INBOX.>", ">", "gavel.>", "gavel.award.b", "gavel.cancel.b",
              "gavel.bids.*", "gavel.events.>", f"$KV.{subjects.NODES_BUCKET}.>"]
    for pattern in stolen:
        await a.subscribe(pattern, cb=on_a)
    await b.subscribe("_INBOX_b.>", cb=on_b)
    await a.flush()
    await b.publish("_INBOX_b.ready", b"")  # heard back: the server has b's subscription
    await wait_for(lambda: got_b == ["_INBOX_b.ready"], 10, what="b's own message")
    got_b.clear()
    await wait_for(lambda: all(authed.refused("a", "subscription", p) for p in stolen), 10,
                   what="the server to refuse a's subscriptions")
    # The broker answers b's assignment request on b's inbox: b reads it, a never does.
    broker = await authed.connect(auth.BROKER)
    for subject in ("_INBOX_b.reply.1", "gavel.award.b", "gavel.events.x"):
        await broker.publish(subject, b"secret")
    await broker.flush()
    await wait_for(lambda: got_b == ["_INBOX_b.reply.1"], 10, what="b's reply")
    await a.flush()
    assert got_a == []


async def test_operators_use_the_api_but_cannot_bid_or_award(authed: Authed) -> None:
    broker = Broker(Config(nats_url=authed.url, state_dir=authed.root / "state", timing=TIMING,
                           nats_options={"nkeys_seed": authed.seed(auth.BROKER)}))
    await broker.start()
    try:
        op = await connect(authed.url, authed.seed(auth.OPERATOR))
        authed.conns.append(op)
        events: list[str] = []

        async def on_event(msg: Any) -> None:
            events.append(msg.subject)

        await op.subscribe(subjects.EVENTS_ALL, cb=on_event)
        reply = await call(op, "submit", SubmitRequest(spec=sleeper_spec("s", cpu=0.5)),
                           SubmitReply)
        st = await call(op, "status", StatusRequest(instance_id=reply.instance_id), StatusReply)
        assert st.instances[0].instance_id == reply.instance_id
        await call(op, "nodes", NodesRequest(), NodesReply)
        await wait_for(lambda: bool(events), 10, what="an event on the operator's subscription")
        # ... and nothing else.
        spy = await Spy().start(authed, ["gavel.>", "$KV.>"])
        forged = {**FORGED_AS_B, **BROKER_ONLY}
        await forge_then_prove(authed, auth.OPERATOR, forged,
                               (subjects.API.format(verb="nodes"), NodesRequest()), spy)
        assert "b" not in broker.liveness.known()
    finally:
        await broker.close()


async def test_a_cluster_places_with_every_part_on_its_own_credential(authed: Authed) -> None:
    secret = "s3cret-for-b-only"
    broker = Broker(Config(nats_url=authed.url, state_dir=authed.root / "state", timing=TIMING,
                           secrets={"SECRET_TOKEN": secret},
                           nats_options={"nkeys_seed": authed.seed(auth.BROKER)}))
    agents: dict[str, Agent] = {}
    tasks: list[asyncio.Task[None]] = []
    await broker.start()
    try:
        for node, cpu in (("a", 1.0), ("b", 4.0)):
            agents[node] = Agent(
                nats_url=authed.url, node_id=node, strategy=make_strategy("least-loaded"),
                labels={}, state_dir=authed.root / node, timing=TIMING, cpu=cpu,
                memory_mb=2048, nats_options={"nkeys_seed": authed.seed(node)})
            tasks.append(asyncio.create_task(agents[node].run()))
        await wait_for(lambda: len(broker.liveness.eligible(broker.now())) == 2, 15,
                       what="both workers to heartbeat through their permissions")
        op = await connect(authed.url, authed.seed(auth.OPERATOR))
        authed.conns.append(op)
        out = authed.root / "seen.json"  # what the instance saw; it stays up (in node.json)
        code = (f"import os, json, pathlib, time; pathlib.Path({str(out)!r}).write_text("
                "json.dumps({k: os.environ[k] for k in ('GAVEL_NODE_ID', 'SECRET_TOKEN')})); "
                "time.sleep(60)")
        spec = Spec(name="app", command=[sys.executable, "-c", code], cpu=2.0,
                    secrets=["SECRET_TOKEN"])
        reply = await call(op, "submit", SubmitRequest(spec=spec), SubmitReply)
        iid = reply.instance_id
        def seen() -> dict[str, str] | None:
            """What the instance wrote, once the file is written, not only created."""
            try:
                got: dict[str, str] = json.loads(out.read_text())
            except (OSError, ValueError):
                return None
            return got
        await wait_for(lambda: seen() is not None, 15, what="the instance to run on b")
        assert seen() == {"GAVEL_NODE_ID": "b", "SECRET_TOKEN": secret}
        # b's KV watch read its node.json through the read-only JetStream permissions.
        def in_kv() -> bool:
            nf = agents["b"].converger.node
            return nf is not None and iid in nf.instances
        await wait_for(in_kv, 15, what="b to see its node.json in KV")
        # b asks for its assignment on its own inbox and gets the secret; a cannot listen.
        spy_a = await authed.connect("a")
        overheard: list[bytes] = []

        async def on_overheard(msg: Any) -> None:
            overheard.append(msg.data)

        await spy_a.subscribe("_INBOX_b.>", cb=on_overheard)
        b = await authed.connect("b")
        msg = await b.request(subjects.ASSIGN.format(node="b"), _enc.encode(
            AssignmentRequest(instance_id=iid, node_id="b")), timeout=5)
        award = msgspec.msgpack.decode(msg.data, type=Award)
        assert award.secret_env == {"SECRET_TOKEN": secret}
        await spy_a.flush()
        assert overheard == []
        # The permission lists are complete: the only violations are the spy's own.
        assert [v for v in authed.violations() if "_INBOX_b.>" not in v] == []
    finally:
        for agent in agents.values():
            await agent.stop()
        await asyncio.gather(*tasks)
        await broker.close()


def test_gavel_up_runs_with_auth_and_reuses_its_keys(up_demo: UpDemo) -> None:
    """`gavel up --demo` (auth is on by default), the run shared with test_gateway's."""
    assert up_demo.proc.returncode == 0, up_demo.proc.stdout + up_demo.proc.stderr
    out = up_demo.proc.stdout
    assert "NATS auth: one nkey per worker" in out
    assert "-> node-" in out  # placed
    assert "exited   on node-" in out  # and run, reported by a worker
    auth_dir = up_demo.state / "auth"
    seeds = {p.name: p.read_text() for p in auth_dir.glob("*.nk")}
    assert set(seeds) == {"broker.nk", "operator.nk", "node-1.nk", "node-2.nk"}
    nats_log = (up_demo.state / "logs" / "nats.log").read_text()
    assert "Violation" not in nats_log
    # Idempotent: a second init keeps every key and writes the same config.
    conf = (auth_dir / "nats.conf").read_text()
    auth.init(up_demo.state, ["node-1", "node-2"])
    assert {p.name: p.read_text() for p in auth_dir.glob("*.nk")} == seeds
    assert (auth_dir / "nats.conf").read_text() == conf


async def test_a_refused_broker_says_why_and_still_stops(authed: Authed) -> None:
    log = authed.root / "broker.log"
    proc = gavel_process(["broker", "--state", str(authed.root / "state"), "--nats",
                          authed.url], log)
    try:
        await wait_for(lambda: "refused a broker without credentials" in log.read_text(), 15,
                       what="the broker to name the refusal")
        proc.send_signal(signal.SIGTERM)  # it never connected; it must not hang
        # 0: stopped by the signal; 1: it gave up on the refusal first (`daemons.Refusals`)
        assert await asyncio.to_thread(proc.wait, 15) in (0, 1)
        assert "Traceback" not in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_an_embedded_broker_gives_up_on_a_refusal_with_a_sentence(authed: Authed) -> None:
    """The library's first connect has a deadline (nats-py's own would retry a refused
    credential for ever in silence), and giving up lets the git writer go."""
    broker = Broker(Config(nats_url=authed.url, state_dir=authed.root / "state", timing=TIMING,
                           connect_wait_s=1.0))
    with pytest.raises(NatsUnreachable, match=r"could not connect to NATS at .* within 1s: "
                                              r".*(?i:authorization)"):
        await asyncio.wait_for(broker.start(), 30)
    assert broker.nc is None
    assert broker.committer.closed
