"""Re-auction with a real broker, real workers and real processes (`broker.reauction`): a
service's replicas crowded onto one node spread out once other nodes join, each move
health-gated (the new copy healthy by its check before the old one stops), and a replica
its spec pins never moves."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter

import msgspec
import pygit2
import pytest

from gavel.shared.api import (
    DeployReply,
    DeployRequest,
    ServiceReply,
    ServiceRequest,
    WhyReply,
    WhyRequest,
)
from gavel.shared.messages import InstanceState, Spec
from gavel.shared.reasons import Reason
from gavel.shared.reauction import Outcome, Settings
from gavel.shared.spec import Check, Restart, Update
from tests.integration.harness import Cluster, wait_for

pytestmark = pytest.mark.integration

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
#: Rounds as often as the test likes, nothing cooling down, room for every move.
FAST = Settings(every_s=0.5, cooldown_s=0.0, budget=1000, sample=16)


def service(name: str, count: int, move: bool | None = None) -> Spec:
    """Replicas healthy by an exec check once their process runs."""
    ok = Check(type="exec", interval_s=0.2, failures=100, command=["true"])
    return Spec(name=name, type="service", count=count, command=SLEEP, cpu=0.1, memory_mb=16,
                checks=[ok], restart=Restart(attempts=0), move=move,
                update=Update(min_healthy_s=0.5))


async def deploy(cluster: Cluster, spec: Spec) -> None:
    await cluster.call("deploy", DeployRequest(spec=spec), DeployReply)


async def healthy(cluster: Cluster, name: str) -> int:
    reply = await cluster.call("service", ServiceRequest(name=name), ServiceReply)
    return sum(1 for r in reply.service.replicas
               if r.health == "healthy" and r.state != "cancelling")


def where(cluster: Cluster, name: str) -> dict[str, str]:
    """The service's live replicas -> the node git places each on."""
    st = cluster.ledger().state()
    return {r.instance_id: node for r in st.replicas_of(name)
            if not r.state.terminal and (node := st.placement_of(r.instance_id)) is not None}


async def crowd(cluster: Cluster, *specs: Spec, settings: Settings = FAST) -> None:
    """Every replica of `specs` healthy on n1, the only node."""
    await cluster.start_broker(rebalance=settings)
    await cluster.start_agent("n1")
    await cluster.wait_nodes(1)
    for spec in specs:
        await deploy(cluster, spec)
    async def ready() -> bool:
        for spec in specs:
            if len(where(cluster, spec.name)) != spec.count \
                    or await healthy(cluster, spec.name) < spec.count:
                return False
        return True
    await wait_for(ready, 30, what="every replica placed on n1 and healthy")


async def test_crowded_replicas_spread_onto_joining_nodes_health_gated(
        cluster: Cluster) -> None:
    await crowd(cluster, service("web", 4))
    first = where(cluster, "web")
    assert set(first.values()) == {"n1"}
    await cluster.start_agent("n2")
    await cluster.start_agent("n3")
    least = [4]

    async def spread() -> bool:
        least[0] = min(least[0], await healthy(cluster, "web"))
        nodes = Counter(where(cluster, "web").values())
        return len(nodes) == 3 and max(nodes.values()) <= 2 and sum(nodes.values()) == 4 \
            and await healthy(cluster, "web") == 4
    await wait_for(spread, 60, every=0.1, what="web spread over n1, n2 and n3")
    assert least[0] == 4  # never fewer healthy replicas than the count while it moved
    st = cluster.ledger().state()
    moved = [iid for iid in first if st.instances[iid].state.terminal
             or st.instances[iid].cancelling]
    assert moved and all(st.instances[iid].reason == Reason.REBALANCED for iid in moved)
    new = next(iid for iid, node in where(cluster, "web").items() if node != "n1")
    why = await cluster.call("why", WhyRequest(instance_id=new), WhyReply)
    assert any(str(Outcome.SPREAD) in a.summary and "from n1" in a.summary
               for a in why.auctions), why.auctions
    assert any(b.node_id == "n1" for a in why.auctions for b in a.bids)  # the keep-bid
    said = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "gavel", "why", new, "--nats", cluster.url],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "GAVEL_LOG_LEVEL": "WARNING"})
    assert said.returncode == 0 and f"moved {first_moved(moved, why)} from n1" in said.stdout \
        and str(Outcome.SPREAD) in said.stdout, said
    broker = cluster.broker
    assert broker is not None and broker.rebalancer.moved_total == len(moved)
    log = messages(cluster)
    assert any("re-auction moves" in m for m in log)
    assert any("re-auction stops" in m and str(Reason.REBALANCED) in m for m in log)


async def test_a_joining_node_starts_a_round_before_the_period_is_up(
        cluster: Cluster) -> None:
    hourly = msgspec.structs.replace(FAST, every_s=3600.0)
    await crowd(cluster, service("web", 2), settings=hourly)

    def deployed() -> bool:  # a deploying service's replicas are the deployment's to move
        dep = cluster.ledger().state().services["web"].deployment
        return dep is not None and dep.state == "succeeded"
    await wait_for(deployed, 30, what="web's first deployment done")
    await cluster.start_agent("n2")
    await wait_for(lambda: sorted(where(cluster, "web").values()) == ["n1", "n2"], 60,
                   what="one replica moved to n2 by the round the join started")


async def test_a_pinned_replica_never_moves(cluster: Cluster) -> None:
    await crowd(cluster, service("pinned", 3, move=False), service("free", 3))
    before = where(cluster, "pinned")
    await cluster.start_agent("n2")
    await cluster.start_agent("n3")
    # the free service spreading shows the rounds ran over both services' nodes
    await wait_for(lambda: len(set(where(cluster, "free").values())) == 3, 60,
                   what="the free service spread")
    assert where(cluster, "pinned") == before
    st = cluster.ledger().state()
    assert all(st.instances[iid].state is not InstanceState.CANCELLED for iid in before)


def messages(cluster: Cluster) -> list[str]:
    """Every commit message on the state repository's branch, newest first."""
    repo = pygit2.Repository(str(cluster.state / "state.git"))
    return [c.message for c in repo.walk(repo.references["refs/heads/main"].target)]


def first_moved(moved: list[str], why: WhyReply) -> str:
    """The old replica `why`'s re-auction record names as the one it replaced."""
    return next(iid for iid in moved if any(f"moved {iid} " in a.summary
                                            for a in why.auctions))
