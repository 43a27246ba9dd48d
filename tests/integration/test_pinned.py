"""A pinned deployment end to end: a real `gavel broker` process started with ``--ref <tag>``
or ``--ref <commit sha>`` over a state repository that holds a queued instance, a worker
ready to take it. Submissions (and the other writing verbs) are refused with the pinned
reason, the auctioneer reports the pinned error event for the queued instance, and nothing
is written: every file of the repository - refs, packed refs, objects - is byte for byte
what it was before the broker started, and after it stopped."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

import msgspec
import nats
import pygit2
import pytest

from gavel.broker.ledger.repository import Change
from gavel.shared import subjects
from gavel.shared.api import (
    CancelRequest,
    DrainRequest,
    NodesReply,
    NodesRequest,
    SubmitReply,
    SubmitRequest,
)
from gavel.shared.messages import Event, Message
from gavel.shared.reasons import Reason
from gavel.shared.records import InstanceRecord
from gavel.transport import wire
from gavel.transport.client import BrokerRefused, ClientError, call
from tests.integration.harness import TIMING, Cluster, gavel_process, sleeper_spec, wait_for

pytestmark = pytest.mark.integration


def _files(repo: Path) -> dict[str, bytes]:
    return {str(p.relative_to(repo)): p.read_bytes()
            for p in sorted(repo.rglob("*")) if p.is_file()}


def _refs(repo: Path) -> dict[str, str]:
    r = pygit2.Repository(str(repo))
    return {name: str(r.references[name].target) for name in r.references}


@pytest.mark.parametrize("pin", ["tag", "sha"])
async def test_a_broker_on_a_pinned_ref_refuses_reports_and_writes_nothing(
        cluster: Cluster, tmp_path: Path, pin: str) -> None:
    ledger = cluster.ledger()
    rec = InstanceRecord(instance_id="web-1", spec=sleeper_spec("web"))
    head = ledger.apply(Change(instances={"web-1": rec}), "submit web-1", None)
    ledger.repo.references.create("refs/tags/v1", pygit2.Oid(hex=head))
    ref, shown = ("v1", "refs/tags/v1") if pin == "tag" else (head, head)
    repo = cluster.state / "state.git"
    before, refs = _files(repo), _refs(repo)

    nc = await cluster.client()
    seen: list[Event] = []

    async def collect(m: nats.aio.msg.Msg) -> None:
        seen.append(msgspec.msgpack.decode(m.data, type=Event))

    await nc.subscribe(subjects.EVENTS.format(instance="web-1"), cb=collect)
    await wire.subscribed(nc)
    broker = gavel_process(["broker", "--state", str(cluster.state), "--nats", cluster.url,
                            "--ref", ref], tmp_path / "broker.log")
    try:
        await cluster.start_agent("node-a")

        async def node_heard() -> bool:
            try:
                reply = await call(nc, "nodes", NodesRequest(), NodesReply, timeout=1.0)
            except ClientError:
                return False
            return any(n.node_id == "node-a" and n.health == "healthy" for n in reply.nodes)

        await wait_for(node_heard, 30, what="the pinned broker up, hearing node-a")
        await wait_for(lambda: any(e.type == "error" for e in seen), 15,
                       what="the pinned error event")
        (err,) = [e for e in seen if e.type == "error"]  # reported once
        assert (err.reason, err.detail) == (Reason.PINNED, shown)

        refused = f"{Reason.PINNED} ({shown})"
        verbs: list[tuple[str, Message]] = [
            ("submit", SubmitRequest(spec=sleeper_spec("other"))),
            ("submit", SubmitRequest(spec=sleeper_spec("many"), count=3)),
            ("cancel", CancelRequest(instance_id="web-1")),
            ("drain", DrainRequest(node_id="node-a")),
        ]
        for verb, req in verbs:
            with pytest.raises(BrokerRefused) as exc:
                await call(nc, verb, req, SubmitReply, timeout=10)
            assert str(exc.value) == refused, verb
        await asyncio.sleep(TIMING.tick_s * 5)  # its auctioneer, watchdog, retention run
        assert broker.poll() is None
        assert [e.type for e in seen] == ["error"]  # never placed, never re-reported
        assert _refs(repo) == refs
        assert _files(repo) == before, "the pinned broker wrote into the repository"
    finally:
        broker.send_signal(signal.SIGTERM)
        try:
            broker.wait(20)
        except subprocess.TimeoutExpired:
            broker.kill()
            broker.wait()
    assert broker.returncode == 0, (tmp_path / "broker.log").read_text()[-2000:]
    assert _refs(repo) == refs
    assert _files(repo) == before, "the pinned broker wrote into the repository on its way out"
    assert cluster.holders("web-1") == []
