"""How a container ends, through the real Docker Engine: a cancel gives it SIGTERM and its
grace before SIGKILL, and a worker cut off from NATS past `offline_s` stops its containers as
it stops its processes (`worker.converge` rule 6).

Images are built here FROM scratch with the static busybox (`tests.integration.dockerkit`);
each test skips with a sentence where no engine answers.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
import nats
import pytest

from gavel.shared import subjects
from gavel.shared.api import CancelReply, CancelRequest
from gavel.shared.messages import Award, Spec
from gavel.transport.natsserver import NatsServer
from gavel.worker.agent import Agent
from gavel.worker.engine import Engine, connect
from tests.integration.dockerkit import image
from tests.integration.harness import TIMING, Cluster, wait_for
from tests.integration.test_containers import containers, instance_dir, start
from tests.integration.test_convergence import agent_options, start_as

pytestmark = pytest.mark.integration

#: A PID 1 that says when it is up, and on SIGTERM says so and exits 0: a process that would
#: have died by SIGKILL writes nothing more.
TRAPS_TERM = ('trap "echo term; exit 0" TERM; echo up; '
              'while true; do sleep 0.1; done')


async def test_a_cancelled_container_gets_sigterm_and_ends_within_its_grace(
        cluster: Cluster, engines: list[Engine], docker: Any) -> None:
    tag = image(docker, "v1")
    await cluster.start_broker()
    await start(cluster, engines, "n1")
    await cluster.wait_nodes(1)
    iid = await cluster.submit(Spec(name="graceful", image=tag, command=["sh", "-c", TRAPS_TERM]))
    out = instance_dir(cluster, "n1", iid) / "stdout.log"
    await wait_for(lambda: out.exists() and out.read_text() == "up\n", 60, what="it to run")
    (cid,) = containers(docker, cluster, iid)
    await cluster.call("cancel", CancelRequest(instance_id=iid), CancelReply)
    async def cancelled() -> bool:  # `cancelling` until its node says it ended
        return str((await cluster.status(iid)).state) == "cancelled"
    await wait_for(cancelled, 60, what="the cancel to end it")
    assert out.read_text() == "up\nterm\n", "SIGTERM first, and time to act on it"
    await wait_for(lambda: not docker.api.containers(all=True, filters={"id": cid}), 30,
                   what="its container removed")


async def test_a_worker_cut_off_past_offline_stops_its_containers(
        nats_server: NatsServer, cluster: Cluster, engines: list[Engine], docker: Any) -> None:
    """No broker: the award is published by hand, as the broker would; then the nats-server
    stops, and once `offline_s` passes without contact the worker stops and removes its
    container itself (the broker has re-placed it elsewhere by then)."""
    tag = image(docker, "v1")
    timing = msgspec.structs.replace(TIMING, offline_s=2.0)
    engine = connect("auto", node_id="n1",
                     home=str((cluster.root / "workers" / "n1").resolve()))
    assert engine is not None, "the engine answered the fixture but not the worker"
    engines.append(engine)
    agent = start_as(cluster, Agent(**agent_options(cluster, "n1", timing=timing,
                                                    engine=engine)))
    await asyncio.wait_for(agent.ready.wait(), 15)
    nc = await nats.connect(nats_server.url)
    award = Award(auction_id="x", instance_id="cut", node_id="n1",
                  spec=Spec(name="cut", image=tag, command=["sleep", "600"]))
    await nc.publish(subjects.AWARD.format(node="n1"), msgspec.msgpack.encode(award))
    await nc.close()
    await wait_for(lambda: len(containers(docker, cluster, "cut")) == 1, 60,
                   what="its container to run")

    await asyncio.to_thread(nats_server.stop)
    cut = time.monotonic()
    try:
        await wait_for(lambda: not containers(docker, cluster, "cut", all_=True),
                       timing.offline_s + timing.kill_grace_s + 30,
                       what="the cut-off worker to stop and remove its container")
        assert time.monotonic() - cut >= timing.offline_s - timing.heartbeat_s
        assert agent.converger.self_fenced and agent.instances() == []
    finally:
        await asyncio.to_thread(nats_server.start)
    await wait_for(lambda: not agent.converger.self_fenced, 15, what="contact again")
