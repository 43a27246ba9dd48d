"""Admission at the broker (`shared.admission`): a submit, deploy or scale beyond the
operator's caps is refused whole with one sentence, and nothing of it is written.

Real nats-server, real broker and git; no worker is needed (queued instances are live),
except for a system job's, which are bound to real workers' nodes.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys

import msgspec
import pygit2
import pytest

from gavel.broker.serviceapi import REPLICAS_SHOWN
from gavel.client import Client, Ended
from gavel.shared.admission import Caps
from gavel.shared.api import (
    CancelReply,
    CancelRequest,
    DeployReply,
    DeployRequest,
    NodesReply,
    NodesRequest,
    ScaleRequest,
    ServiceReply,
    ServiceRequest,
    StatusReply,
    StatusRequest,
    SubmitReply,
    SubmitRequest,
)
from gavel.shared.reasons import Reason
from gavel.shared.records import PeriodicRun
from gavel.shared.spec import Spec
from gavel.transport.client import BrokerRefused
from gavel.transport.client import status as status_of
from tests.integration.harness import Cluster, sleeper_spec, wait_for

pytestmark = pytest.mark.integration


async def test_counts_beyond_the_caps_are_refused_whole(cluster: Cluster) -> None:
    broker = await cluster.start_broker(caps=Caps(per_service=5, instances=8))
    job = sleeper_spec("many")
    made = await cluster.call("submit", SubmitRequest(spec=job, count=6), SubmitReply)
    assert len(made.instance_ids) == 6

    def intent() -> tuple[set[str], dict[str, int]]:
        """What a request could have written: instance ids, and each service's count."""
        state = broker.ledger.state()
        return set(state.instances), {n: s.count for n, s in state.services.items()}

    async def refused(verb: str, req: object, reply: type, reason: Reason) -> None:
        before = intent()
        with pytest.raises(BrokerRefused) as exc:
            await cluster.call(verb, req, reply)  # type: ignore[arg-type]
        assert str(exc.value).startswith(reason), exc.value
        assert intent() == before  # nothing written

    await refused("submit", SubmitRequest(spec=job, count=3), SubmitReply,
                  Reason.OVER_CLUSTER_CAP)
    svc = Spec(name="svc", type="service", command=["true"], cpu=0.1, memory_mb=16, count=6)
    await refused("deploy", DeployRequest(spec=svc), DeployReply, Reason.OVER_SERVICE_CAP)
    await refused("deploy", DeployRequest(spec=_with_count(svc, 3)), DeployReply,
                  Reason.OVER_CLUSTER_CAP)
    await cluster.call("deploy", DeployRequest(spec=_with_count(svc, 2)), DeployReply)
    await wait_for(lambda: len(broker.ledger.state().replicas_of("svc")) == 2, 15,
                   what="its two replicas")
    await refused("scale", ScaleRequest(name="svc", count=6), ServiceReply,
                  Reason.OVER_SERVICE_CAP)
    await refused("scale", ScaleRequest(name="svc", count=3), ServiceReply,
                  Reason.OVER_CLUSTER_CAP)
    # Its own replicas are replaced, not added: down, and back to what it had, are fine.
    await cluster.call("scale", ScaleRequest(name="svc", count=1), ServiceReply)
    await cluster.call("scale", ScaleRequest(name="svc", count=2), ServiceReply)


def _with_count(spec: Spec, count: int) -> Spec:
    return msgspec.structs.replace(spec, count=count)


async def test_status_answers_every_instance_in_pages_within_the_max_payload(
        cluster: Cluster) -> None:
    """More instances than one answer of the server's max payload holds (status failed
    with "maximum payload exceeded" at about 5,000): every page fits, and the client's
    pages add up to every instance, each once, in id order."""
    await cluster.start_broker()
    nc = await cluster.client()
    n = 6000
    made = await cluster.call("submit", SubmitRequest(spec=sleeper_spec("lots"), count=n),
                              SubmitReply)
    first = await cluster.call("status", StatusRequest(), StatusReply)
    assert first.next and first.total == n and len(first.instances) < n
    assert len(msgspec.msgpack.encode(first)) <= nc.max_payload
    everything = await status_of(nc)
    ids = [i.instance_id for i in everything.instances]
    assert ids == sorted(made.ids()) and everything.next == ""
    # The submit's own answer names the first id and the count, not a hundred thousand ids.
    assert made.instance_ids == [] and made.count == n and len(set(made.ids())) == n


async def test_a_large_scale_is_committed_in_chunks_while_the_api_answers(
        cluster: Cluster) -> None:
    """`broker.services` rule 6: a service scaled far up grows a bounded chunk per commit,
    and the API answers between them - shown by answers that arrived while the service held
    some of its replicas but not yet all (by condition, never by a clock)."""
    broker = await cluster.start_broker()
    broker.services.start_chunk = chunk = 40
    n = 10 * chunk
    svc = Spec(name="wide", type="service", command=["true"], cpu=0.1, memory_mb=16, count=0)
    await cluster.call("deploy", DeployRequest(spec=svc), DeployReply)
    await cluster.call("scale", ScaleRequest(name="wide", count=n), ServiceReply)

    def replicas() -> int:
        return len(broker.ledger.state().replicas_of("wide"))

    between: list[int] = []
    while (held := replicas()) < n:
        await cluster.call("nodes", NodesRequest(), NodesReply)
        if held > 0 and replicas() < n:  # answered while the scale was under way
            between.append(held)
    assert between, "no API answer came between two chunks"
    assert replicas() == n
    # No commit started more than one chunk of replicas.
    repo = pygit2.Repository(str(broker.ledger.path))
    head = repo.references[broker.ledger.ref].peel(pygit2.Commit)
    starts = [c.message.count("service wide: start ") for c in repo.walk(head.id)]
    assert max(starts) == chunk and sum(starts) == n
    # Its answer lists a bounded few replicas and counts them all (serviceapi rule 3).
    got = (await cluster.call("service", ServiceRequest(name="wide"), ServiceReply)).service
    assert len(got.replicas) == REPLICAS_SHOWN < n and got.replicas_total == n
    assert sum(v.replicas for v in got.versions) == n


async def test_a_periodic_run_past_the_cluster_cap_is_skipped_not_made(
        cluster: Cluster) -> None:
    """`--max-instances` holds for the runs a periodic job makes, as for a submit: at the cap
    each fire time is skipped with the submit's reason, and runs start again below it."""
    broker = await cluster.start_broker(caps=Caps(per_service=5, instances=2))
    made = await cluster.call("submit", SubmitRequest(spec=sleeper_spec("fill"), count=2),
                              SubmitReply)
    tick = Spec(name="tick", command=["true"], schedule="* * * * * *")
    await cluster.call("submit", SubmitRequest(spec=tick), SubmitReply)

    def history() -> list[PeriodicRun]:
        return broker.ledger.state().periodic["tick"].history
    await wait_for(lambda: len(history()) >= 2, 30, what="two fire times of tick")
    assert all(h.skipped == Reason.OVER_CLUSTER_CAP and not h.instance_id
               for h in history()), history()
    state = broker.ledger.state()
    assert sorted(i for i, r in state.instances.items() if not r.state.terminal) == sorted(
        made.instance_ids)
    await cluster.call("cancel", CancelRequest(instance_id=made.instance_ids[0]), CancelReply)
    await wait_for(lambda: any(h.instance_id for h in history()), 30,
                   what="a run once there is room")


EDGE = Spec(name="edge", type="system", labels={"role": "edge"}, cpu=0.1, memory_mb=16,
            command=[sys.executable, "-c", "import time; time.sleep(600)"])


def _edge_nodes(cluster: Cluster) -> set[str]:
    """The nodes the system job `edge` has a live instance bound to."""
    assert cluster.broker is not None
    return {r.only_node for r in cluster.broker.ledger.state().replicas_of("edge")
            if not r.state.terminal}


async def _capped(cluster: Cluster) -> dict[str, str]:
    got = await cluster.call("service", ServiceRequest(name="edge"), ServiceReply)
    return got.service.capped


async def test_a_system_jobs_instances_wait_at_the_cluster_cap_until_room_appears(
        cluster: Cluster) -> None:
    """`--max-instances` holds for the instances a system job makes on its nodes, at submit
    and when a node joins: a node past the cap gets none, `gavel status` names it with the
    submit's refusal, and it gets its instance once another instance ends or a broker
    started with a higher cap leads."""
    await cluster.start_broker(caps=Caps(per_service=5, instances=3))
    for node in ("node-a", "node-b", "node-c"):
        await cluster.start_agent(node, labels={"role": "edge"})
    await cluster.wait_nodes(3)
    fill = await cluster.call("submit", SubmitRequest(spec=sleeper_spec("fill")), SubmitReply)
    await cluster.call("submit", SubmitRequest(spec=EDGE), SubmitReply)
    await wait_for(lambda: _edge_nodes(cluster) == {"node-a", "node-b"}, 30,
                   what="instances on the first two nodes only")
    await wait_for(lambda: _capped(cluster), 30, what="node-c waiting at the cap")
    capped = await _capped(cluster)
    assert list(capped) == ["node-c"] and capped["node-c"].startswith(
        Reason.OVER_CLUSTER_CAP) and "--max-instances" in capped["node-c"], capped
    shown = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "gavel", "status", "edge", "--nats",
                         cluster.url], capture_output=True, text=True, timeout=60)
    assert f"node-c: waits for room: {Reason.OVER_CLUSTER_CAP}" in shown.stdout, shown.stdout
    async with await Client.connect(cluster.url) as client:  # `submit --wait`'s wait ends
        with pytest.raises(Ended, match=r"1 node\(s\) wait for room at the cluster cap "
                           r"\(node-c\): " + re.escape(Reason.OVER_CLUSTER_CAP)):
            await client.wait_system("edge", timeout=600)
    assert _edge_nodes(cluster) == {"node-a", "node-b"}  # still nothing past the cap

    await cluster.call("cancel", CancelRequest(instance_id=fill.instance_id), CancelReply)
    await wait_for(lambda: _edge_nodes(cluster) == {"node-a", "node-b", "node-c"}, 30,
                   what="node-c's instance once the filler ended")
    assert await _capped(cluster) == {}

    await cluster.start_agent("node-d", labels={"role": "edge"})  # joins a full cluster
    await wait_for(lambda: _capped(cluster), 30, what="the joining node waiting at the cap")
    assert list(await _capped(cluster)) == ["node-d"]
    assert "node-d" not in _edge_nodes(cluster)
    await cluster.stop_broker()
    await cluster.start_broker(caps=Caps(per_service=5, instances=4))  # the cap raised
    await wait_for(lambda: "node-d" in _edge_nodes(cluster), 30,
                   what="the joining node's instance under the raised cap")
    assert len(_edge_nodes(cluster)) == 4
