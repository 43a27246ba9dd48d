"""A periodic job across broker processes killed with SIGKILL right after they made a run:
every fire time the branch records is recorded once (a run or a skip, never two runs), and
none is lost - each one between two recorded is counted as missed in the later one's
commit. The broker is a real `gavel broker` child process; git is read afresh."""

from __future__ import annotations

from pathlib import Path

import nats
import pytest

from gavel.broker.ledger.repository import Ledger
from gavel.shared.api import SubmitReply, SubmitRequest
from gavel.shared.messages import Spec
from gavel.transport.client import ClientError, call
from gavel.transport.natsserver import NatsServer
from tests.integration.harness import Daemons, healthy_nodes, wait_for
from tests.integration.test_periodic import accounted, recorded

pytestmark = pytest.mark.integration


def position(state: Path) -> str:
    job = Ledger(state / "state.git").state().periodic.get("beat")
    return job.last_run if job is not None else ""


async def test_a_broker_killed_after_each_run_neither_loses_nor_doubles_a_fire_time(
        nats_server: NatsServer, tmp_path: Path) -> None:
    d = Daemons(nats_server.url, tmp_path)
    nc = await nats.connect(nats_server.url)
    try:
        d.broker()
        d.worker("node-a")
        await wait_for(lambda: _has(nc), 60, what="node-a healthy")
        spec = Spec(name="beat", command=["true"], schedule="* * * * * *", overlap="allow")
        await call(nc, "submit", SubmitRequest(spec=spec), SubmitReply, timeout=10.0)
        for _ in range(3):  # killed as soon as it committed a run, started again
            before = position(d.state)
            await wait_for(lambda b=before: position(d.state) > b, 60, what="a new run")
            d.kill(d.brokers[-1])
            d.broker()
            await wait_for(lambda: _answers(nc), 60, what="the broker answering again")
        last = position(d.state)
        await wait_for(lambda: position(d.state) > last, 60, what="the schedule going on")
    finally:
        await nc.close()
        d.close()
    got = recorded(d.state, "beat")
    accounted(got)
    assert len([iid for _, _, iid in got if iid]) >= 4


async def _has(nc: nats.NATS) -> bool:
    return "node-a" in await healthy_nodes(nc)


async def _answers(nc: nats.NATS) -> bool:
    try:
        await healthy_nodes(nc)
    except ClientError:
        return False
    return bool(await healthy_nodes(nc))
