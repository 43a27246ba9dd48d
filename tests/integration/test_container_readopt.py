"""Re-adoption of a container its worker started but did not record, through the real Docker
Engine (images built here FROM scratch, `tests.integration.dockerkit`; nothing pulls)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gavel.shared.messages import InstanceState, Spec
from gavel.worker.engine import Engine
from gavel.worker.localstate import load, save
from tests.integration.dockerkit import image
from tests.integration.harness import Cluster, wait_for
from tests.integration.test_containers import LONG, containers, start

pytestmark = pytest.mark.integration


async def test_a_container_started_before_its_worker_recorded_it_is_readopted_by_its_labels(
        cluster: Cluster, engines: list[Engine], docker: Any) -> None:
    """A worker killed after its container started and before it recorded the container's
    id (a window a loaded machine widens) leaves the award's record only. The next worker
    finds the container by its labels and re-adopts it - no second copy, no failure, and
    its timeout counted from the container's start, not spent at once."""
    tag = image(docker, "v1")
    await cluster.start_broker()
    await start(cluster, engines, "n1")
    await cluster.wait_nodes(1)
    iid = await cluster.submit(Spec(name="long", image=tag, command=LONG,  # ends on SIGTERM
                                    timeout_s=600))
    await wait_for(lambda: len(containers(docker, cluster, iid)) == 1, 60,
                   what="its container to run")
    (before,) = containers(docker, cluster, iid)
    await cluster.stop_agent("n1", kill_children=False)  # as a worker killed: it runs on
    path = cluster.root / "workers" / "n1" / "agent.json"
    saved = load(path)
    assert saved is not None
    saved.instances[iid] = msgspec.structs.replace(  # the record as the award left it
        saved.instances[iid], state=InstanceState.PROVISIONING, pid=0, create_time=0.0,
        container="", started_at=0.0)
    save(path, saved)
    await start(cluster, engines, "n1")
    await wait_for(lambda: any(r.instance_id == iid and r.state == "running"
                               for r in cluster.agents["n1"].instances()), 30,
                   what="the instance re-adopted")
    kept = load(path)
    assert kept is not None and kept.instances[iid].container == before
    assert kept.instances[iid].state == InstanceState.RUNNING
    assert containers(docker, cluster, iid) == [before], "a second copy, or none"
    assert cluster.holders(iid) == ["n1"]
