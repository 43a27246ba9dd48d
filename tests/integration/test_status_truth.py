"""`gavel status` says what is known (`broker.views`): an instance on a node that is not
heard is `unknown`, with the reason, not `running` until its lease expires; and a broker that
starts again shows what its nodes' newest stored heartbeats said (running, healthy) instead
of `placed` with no health until each node's next heartbeat - to a gateway too, which kept
no route for that time."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from gavel.shared.api import EndpointsReply, EndpointsRequest
from gavel.shared.messages import InstanceState
from gavel.shared.reasons import Reason
from gavel.shared.routes import derive
from gavel.shared.spec import Route
from gavel.shared.strategies import make_strategy
from gavel.worker.agent import Agent
from tests.integration.harness import TIMING, Cluster, sleeper_spec, wait_for

pytestmark = pytest.mark.integration


async def _running(cluster: Cluster, iid: str) -> None:
    async def ok() -> bool:
        st = await cluster.status(iid)
        return bool(st.state == InstanceState.RUNNING and st.health == "healthy")
    await wait_for(ok, 20, what=f"{iid} running and healthy")


async def test_an_instance_on_a_node_not_heard_is_unknown_then_running_again(
        cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.start_agent("n1")
    await cluster.wait_nodes(1)
    iid = await cluster.submit(sleeper_spec("s", 600), "s-1")
    await _running(cluster, iid)
    await cluster.stop_agent("n1", kill_children=False)  # the node falls silent; s-1 runs on

    async def unknown() -> bool:
        return bool((await cluster.status(iid)).state == "unknown")
    await wait_for(unknown, TIMING.offline_s, every=0.1, what="status to say unknown")
    st = await cluster.status(iid)
    assert (st.node_id, st.reason, st.detail, st.health) == (
        "n1", Reason.NODE_NOT_HEARD, "node n1 is unreachable", "")
    await cluster.start_agent("n1")  # back: it re-adopts what still runs
    await _running(cluster, iid)
    assert (await cluster.status(iid)).attempt == 1


async def test_a_restarted_broker_shows_what_the_stored_heartbeats_said(
        cluster: Cluster) -> None:
    # Heartbeats far apart, so the restarted broker hears none before it is asked.
    slow = msgspec.structs.replace(TIMING, heartbeat_s=60.0, unreachable_s=120.0,
                                   offline_s=240.0)
    await cluster.start_broker(timing=slow)
    agent = Agent(nats_url=cluster.url, node_id="n1", strategy=make_strategy("least-loaded"),
                  labels={}, state_dir=cluster.root / "workers" / "n1", timing=slow, cpu=4.0,
                  memory_mb=4096, advertise="127.0.0.1")
    cluster.agents["n1"] = agent
    cluster.agent_tasks["n1"] = asyncio.create_task(agent.run())
    await cluster.wait_nodes(1)
    spec = msgspec.structs.replace(sleeper_spec("s", 600), ports=["http"],
                                   routes=[Route(path="/s", port="http")])
    iid = await cluster.submit(spec, "s-1")
    await _running(cluster, iid)

    def listed() -> bool:  # a heartbeat that lists it running is the one stored
        b = cluster.broker
        assert b is not None
        hb = b.liveness.heartbeats.get("n1")
        return hb is not None and any(r.instance_id == iid and r.state == "running"
                                      for r in hb.instances)
    agent.set_draining(False)  # a heartbeat now
    await wait_for(listed, 20, what="a heartbeat listing s-1 running")
    await cluster.stop_broker()
    broker = await cluster.start_broker(timing=slow)
    st = await cluster.status(iid)
    assert "n1" not in broker.liveness.heartbeats  # no heartbeat heard since the start
    assert (st.state, st.health, st.node_id) == ("running", "healthy", "n1")
    # A gateway asking now keeps its route: the node is reached where it last said.
    got = await cluster.call("endpoints", EndpointsRequest(), EndpointsReply)
    (entry,) = derive(got.endpoints, got.nodes)
    assert [(u.instance_id, u.address, u.port) for u in entry.upstreams] == [
        (iid, "127.0.0.1", st.ports["http"])]
