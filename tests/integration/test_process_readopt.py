"""Re-adoption of a process its worker started but did not record (`worker.drivers` rule 6):
a real nats-server, git and processes. The record is put back as the award (or the restart's
back-off) left it, as a worker killed in between leaves it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from gavel.shared.api import CancelReply, CancelRequest
from gavel.shared.messages import InstanceState
from gavel.worker.localstate import load, save
from tests.integration.harness import Cluster, wait_for
from tests.integration.test_restarts import alive, counting_spec

pytestmark = pytest.mark.integration


def _starts(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


@pytest.mark.parametrize("gap", ["first-run", "restart"])
async def test_a_process_started_before_its_worker_recorded_it_is_readopted(
        cluster: Cluster, tmp_path: Path, gap: str) -> None:
    """No second copy, no failure: the next worker finds the run by its environment and
    watches it (its record gets the pid); a cancel then stops that very process."""
    await cluster.start_broker()
    await cluster.start_agent("n1")
    await cluster.wait_nodes(1)
    starts = tmp_path / "starts"
    iid = await cluster.submit(counting_spec("keep", starts))
    await wait_for(lambda: len(_starts(starts)) == 1, 30, what="its process to start")
    (pid,) = _starts(starts)
    await cluster.stop_agent("n1", kill_children=False)  # as a worker killed: it runs on
    path = cluster.root / "workers" / "n1" / "agent.json"
    saved = load(path)
    assert saved is not None
    was = saved.instances[iid]
    if gap == "first-run":  # the record as the award left it
        left = msgspec.structs.replace(was, state=InstanceState.PROVISIONING, pid=0,
                                       create_time=0.0, started_at=0.0)
    else:  # a restart's back-off under way, its run started and not recorded
        left = msgspec.structs.replace(was, pid=0, create_time=0.0, restart_at=1.0)
    saved.instances[iid] = left
    save(path, saved)
    agent = await cluster.start_agent("n1")
    await wait_for(lambda: any(r.instance_id == iid and r.state == "running"
                               for r in agent.instances()), 30, what="the instance re-adopted")
    kept = load(path)
    assert kept is not None and kept.instances[iid].pid == pid
    await asyncio.sleep(1.0)  # a second copy would have started by now
    assert _starts(starts) == [pid], "a second copy"
    assert cluster.holders(iid) == ["n1"]
    assert (await cluster.status(iid)).state == "running"
    await cluster.call("cancel", CancelRequest(instance_id=iid), CancelReply)
    await wait_for(lambda: not alive(pid), 30, what="the adopted process stopped by a cancel")
