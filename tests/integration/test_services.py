"""Services kept at their count, against a real nats-server, real git and real processes: a
killed replica is replaced, a dead node's replica moves once the node is offline, scale up
and down, stop. Health is the workers' own (a replica without checks is healthy once its
node reports it running)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gavel.broker.service import Broker, Config
from gavel.shared import subjects
from gavel.shared.api import (
    DeployReply,
    DeployRequest,
    EventsReply,
    EventsRequest,
    ScaleRequest,
    ServiceReply,
    ServiceRequest,
    ServicesReply,
    ServicesRequest,
    ServiceStatus,
    StopServiceRequest,
)
from gavel.shared.messages import Event, Spec
from gavel.shared.messages import InstanceState as S
from gavel.shared.reasons import Reason
from gavel.shared.spec import Restart, Update
from gavel.shared.strategies import make_strategy
from gavel.transport import identity as auth
from gavel.transport.client import call, connect
from gavel.worker.agent import Agent
from tests.integration.authed import Authed
from tests.integration.harness import TIMING, Cluster, wait_for

pytestmark = pytest.mark.integration

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
GAVEL = [sys.executable, "-m", "gavel"]


def service(count: int, version: str = "1", command: list[str] | None = None,
            **update: Any) -> Spec:
    """A service of `count` sleepers. No restarts in place: every end of a replica's process
    is the broker's to answer (`restart.attempts = 0`)."""
    update.setdefault("min_healthy_s", 0.5)
    return Spec(name="web", type="service", count=count, command=command or SLEEP, cpu=0.1,
                memory_mb=16, env={"WEB_VERSION": version}, restart=Restart(attempts=0),
                update=Update(**update))


async def status(cluster: Cluster, name: str = "web") -> ServiceStatus:
    reply = await cluster.call("service", ServiceRequest(name=name), ServiceReply)
    return reply.service


def whole(st: ServiceStatus, version: int | None = None) -> bool:
    """Every live replica is healthy, of `version` (default: the service's), and as many as
    the count."""
    want = version or st.version
    live = [r for r in st.replicas if r.state != "cancelling"]
    return len(live) == st.count and all(r.health == "healthy" and r.version == want
                                         for r in live)


def processes(cluster: Cluster) -> dict[str, tuple[str, int]]:
    """Every running process of the service on every node: instance -> (node, pid)."""
    return {r.instance_id: (node, r.pid) for node, agent in cluster.agents.items()
            for r in agent.instances() if r.state == "running"
            and r.instance_id.startswith("web-")}


def log(cluster: Cluster) -> str:
    return "\n".join(c.message for c in cluster.ledger().history())


async def gavel(*args: str) -> tuple[int, str, str]:
    """A `gavel` command line run to its end: exit status, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(*GAVEL, *args, stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def deploy(cluster: Cluster, spec: Spec) -> int:
    reply = await cluster.call("deploy", DeployRequest(spec=spec), DeployReply)
    return reply.version


async def test_a_service_of_three_is_placed_and_a_killed_replica_is_replaced(
        cluster: Cluster) -> None:
    await cluster.start_broker()
    for n in ("node-a", "node-b"):
        await cluster.start_agent(n)
    await cluster.wait_nodes(2)
    assert await deploy(cluster, service(3)) == 1

    async def kept() -> bool:
        st = await status(cluster)
        return whole(st) and len(processes(cluster)) == 3
    await wait_for(kept, 30, what="3 healthy replicas running")
    victim, (_node, pid) = sorted(processes(cluster).items())[0]
    os.kill(pid, signal.SIGKILL)

    async def replaced() -> bool:
        st = await status(cluster)
        return whole(st) and victim not in {r.instance_id for r in st.replicas} \
            and len(processes(cluster)) == 3
    await wait_for(replaced, 30, what="the killed replica replaced")
    rec = cluster.ledger().state().instances[victim]
    assert (rec.state, rec.reason) == (S.FAILED, Reason.EXITED_NONZERO)
    assert f"service web: replace {victim} (failed: {Reason.EXITED_NONZERO}) with web-" \
        in log(cluster)
    events = (await cluster.call("events", EventsRequest(instance_id="web"),
                                 EventsReply)).events
    replaced_ev = [e for e in events if e.type == "replaced"]
    assert len(replaced_ev) == 1 and replaced_ev[0].detail.startswith(f"{victim} (failed) by ")
    assert replaced_ev[0].reason == Reason.EXITED_NONZERO
    live = [r for r in cluster.ledger().state().replicas_of("web") if not r.state.terminal]
    assert len(live) == 3, "exactly one replacement"


async def test_a_node_killed_under_a_service_has_its_replica_moved_once_offline(
        cluster: Cluster) -> None:
    broker = await cluster.start_broker()
    for n in ("node-a", "node-b", "node-c"):
        await cluster.start_agent(n)
    await cluster.wait_nodes(3)
    await deploy(cluster, service(2))

    async def kept() -> bool:
        return whole(await status(cluster)) and len(processes(cluster)) == 2
    await wait_for(kept, 30, what="2 healthy replicas")
    moved, (dead, _) = sorted(processes(cluster).items())[0]
    orphans = [pid for _iid, (node, pid) in processes(cluster).items() if node == dead]
    try:
        await cluster.stop_agent(dead, kill_children=False)  # the node goes silent
        await wait_for(lambda: broker.liveness.health(dead, broker.now()) == "unreachable",
                       TIMING.unreachable_s * 3, what=f"{dead} unreachable")
        assert cluster.holders(moved) == [dead], "an unreachable node keeps its replicas"

        async def elsewhere() -> bool:
            st = await status(cluster)
            return whole(st) and all(r.node_id != dead for r in st.replicas) \
                and len(processes(cluster)) == 2
        await wait_for(elsewhere, TIMING.offline_s * 3, what="replica moved off the dead node")
        assert broker.liveness.health(dead, broker.now()) == "offline"
        assert f"requeue {moved} off {dead}: {Reason.NO_LEASE}" in log(cluster)
        st = await status(cluster)
        assert moved in {r.instance_id for r in st.replicas}, "the replica itself moved"
        assert len([r for r in cluster.ledger().state().replicas_of("web")
                    if not r.state.terminal]) == 2
    finally:
        for pid in orphans:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_scale_up_and_down(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    await deploy(cluster, service(2))

    async def at(n: int) -> bool:
        st = await status(cluster)
        return st.count == n and whole(st) and len(processes(cluster)) == n
    await wait_for(lambda: at(2), 30, what="2 replicas")
    reply = await cluster.call("scale", ScaleRequest(name="web", count=4), ServiceReply)
    assert reply.service.count == 4
    await wait_for(lambda: at(4), 30, what="4 replicas")
    before = set(processes(cluster))
    await cluster.call("scale", ScaleRequest(name="web", count=1), ServiceReply)
    await wait_for(lambda: at(1), 30, what="1 replica")
    (kept,) = processes(cluster)
    gone = before - {kept}
    await wait_for(lambda: all(cluster.ledger().state().instances[i].state.terminal
                               for i in gone), 30, what="the stops confirmed")
    state = cluster.ledger().state()
    for iid in gone:
        rec = state.instances[iid]
        assert (rec.state, rec.reason) == (S.CANCELLED, Reason.SCALED_DOWN), iid
    assert "service web: scale from 4 to 1 replicas" in log(cluster)
    assert "replace" not in log(cluster), "a scale-down is not replaced"


async def test_stop_cancels_every_replica_and_keeps_the_record(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    await deploy(cluster, service(2))
    await wait_for(lambda: len(processes(cluster)) == 2, 30, what="2 replicas running")
    ran = set(processes(cluster))
    reply = await cluster.call("stop", StopServiceRequest(name="web"), ServiceReply)
    assert reply.service.stopped

    def stopped() -> bool:
        state = cluster.ledger().state()
        return not processes(cluster) and all(
            state.instances[i].state is S.CANCELLED for i in ran)
    await wait_for(stopped, TIMING.cancel_grace_s * 3, what="every replica stopped")
    state = cluster.ledger().state()
    assert {state.instances[i].reason for i in ran} == {Reason.SERVICE_STOPPED}
    svc = state.services["web"]
    assert svc.stopped and svc.count == 2, "the record stays"

    async def told() -> bool:  # the broker adopts the commit a loop turn after git has it
        st = await status(cluster)
        return st.stopped and st.replicas == []
    await wait_for(told, 10, what="status to say the service stopped with no replica")
    assert await deploy(cluster, service(2)) == 1  # the same spec starts it again
    await wait_for(lambda: len(processes(cluster)) == 2, 30, what="started again")
    assert not set(processes(cluster)) & ran


WEB_TOML = """
name = "web"
type = "service"
count = 2
command = ["{python}", "-c", "import time; time.sleep(600)"]
cpu = 0.1
memory_mb = 16
env = {{ WEB_VERSION = "{version}" }}

[update]
max_parallel = 1
min_healthy_s = 0.5
"""


async def test_the_service_verbs_on_the_command_line(cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    url = ["--nats", cluster.url]
    job = tmp_path / "job.toml"
    job.write_text('name = "batch"\ncommand = ["true"]\n')
    code, _, err = await gavel("deploy", str(job), *url)
    assert code == 2 and Reason.NOT_A_SERVICE in err
    web = tmp_path / "web.toml"
    web.write_text(WEB_TOML.format(python=sys.executable, version="1"))
    assert (await gavel("deploy", str(web), *url))[:2] == (0, "web: version 1\n")
    assert (await gavel("deploy", str(web), *url))[:2] == (0, "web: version 1 (unchanged)\n")
    await wait_for(lambda: len(processes(cluster)) == 2, 30, what="2 replicas")

    async def healthy(n: int, version: int) -> bool:
        st = await status(cluster)
        return whole(st, version) and st.count == n
    await wait_for(lambda: healthy(2, 1), 30, what="healthy")
    code, out, _ = await gavel("status", "web", *url)
    assert code == 0 and out.startswith("service web: version 1, 2 replicas")
    assert out.count("running  node-a  healthy") == 2
    code, out, _ = await gavel("services", "--json", *url)
    assert code == 0 and [s["name"] for s in msgspec.json.decode(out)] == ["web"]
    code, out, _ = await gavel("scale", "web", "3", "--json", *url)
    assert code == 0 and msgspec.json.decode(out)["count"] == 3
    await wait_for(lambda: healthy(3, 1), 30, what="3 healthy")
    web.write_text(WEB_TOML.format(python=sys.executable, version="2"))
    code, out, err = await gavel("deploy", str(web), "--wait", *url)
    assert code == 0, err
    assert out == "web version 2 deployed: 2 replicas healthy\n"  # the file's count
    code, out, _ = await gavel("rollback", "web", "--to", "1", *url)
    assert (code, out) == (0, "web: rolling back to version 1\n")
    code, out, _ = await gavel("deploy", "status", "web", *url)
    assert code == 0 and "deployment: version 2 -> 1 " in out and "VERSION" in out
    code, out, _ = await gavel("stop", "web", *url)
    assert (code, out) == (0, "web: stopping every replica\n")
    gone = next(r for r in cluster.ledger().state().replicas_of("web")
                if r.state is S.CANCELLED and r.reason == Reason.SUPERSEDED)
    code, out, _ = await gavel("why", gone.instance_id, *url)
    assert code == 0 and out.startswith(
        f"{gone.instance_id}: cancelled on node-a, replica of service web version "
        f"{gone.version} — "
        f"{Reason.SUPERSEDED}\n"), out
    code, _, err = await gavel("scale", "nosuch", "1", *url)
    assert code == 4 and f"{Reason.UNKNOWN_SERVICE}: nosuch" in err  # unknown: the README table


async def test_a_service_runs_with_every_part_on_its_own_credential(authed: Authed) -> None:
    """Least privilege holds for services: an operator deploys and follows the service's
    events, each node runs its replicas and reports them, and nobody is refused anything."""
    broker = Broker(Config(nats_url=authed.url, state_dir=authed.root / "state", timing=TIMING,
                           nats_options={"nkeys_seed": authed.seed(auth.BROKER)}))
    agents: list[Agent] = []
    tasks: list[asyncio.Task[None]] = []
    await broker.start()
    try:
        for node in ("a", "b"):
            agents.append(Agent(
                nats_url=authed.url, node_id=node, strategy=make_strategy("least-loaded"),
                labels={}, state_dir=authed.root / node, timing=TIMING, cpu=2.0,
                memory_mb=2048, nats_options={"nkeys_seed": authed.seed(node)}))
            tasks.append(asyncio.create_task(agents[-1].run()))
        await wait_for(lambda: len(broker.liveness.eligible(broker.now())) == 2, 15,
                       what="both workers heard")
        op = await connect(authed.url, authed.seed(auth.OPERATOR))
        authed.conns.append(op)
        heard: list[str] = []

        async def on_event(msg: Any) -> None:
            heard.append(msgspec.msgpack.decode(msg.data, type=Event).type)

        await op.subscribe(subjects.EVENTS.format(instance="web"), cb=on_event)
        # An operator may not publish to its own inbox (`wire.subscribed`); the deploy is
        # the message behind the SUB instead: once it is answered, the SUB is in place.
        await call(op, "deploy", DeployRequest(spec=service(2)), DeployReply)

        async def deployed() -> bool:
            st = (await call(op, "service", ServiceRequest(name="web"), ServiceReply)).service
            return whole(st) and st.deployment is not None and \
                st.deployment.state == "succeeded"
        await wait_for(deployed, 30, what="the service deployed")
        await wait_for(lambda: "deployed" in heard, 10, what="the operator hears it")
        await call(op, "scale", ScaleRequest(name="web", count=1), ServiceReply)
        await call(op, "stop", StopServiceRequest(name="web"), ServiceReply)
        listed = await call(op, "services", ServicesRequest(), ServicesReply)
        assert [s.stopped for s in listed.services] == [True]
        assert authed.violations() == []
    finally:
        for agent in agents:
            await agent.stop()
        await asyncio.gather(*tasks)
        await broker.close()
