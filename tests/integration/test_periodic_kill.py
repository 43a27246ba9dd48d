"""A periodic job across broker processes killed with SIGKILL right after they made a run:
every fire time the branch records is recorded once (a run or a skip, never two runs), and
none is lost - each one between two recorded is counted as missed in the later one's
commit. The broker is a real `gavel broker` child process; git is read afresh."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import nats
import pytest

from gavel.broker.ledger.repository import Ledger
from gavel.shared.api import SubmitReply, SubmitRequest
from gavel.shared.cron import unstamp
from gavel.shared.messages import Spec
from gavel.transport.client import ClientError, call
from gavel.transport.natsserver import NatsServer
from tests.integration.harness import Daemons, healthy_nodes, wait_for

pytestmark = pytest.mark.integration

#: A commit line of a run or a skip (`broker.periodic`), and its fire time in the run's id.
LINE = re.compile(r"^periodic beat: (?:run (?P<id>beat-\S+) for|skip) (?P<when>[\d-]+ "
                  r"[\d:]+) UTC")
MISSED = re.compile(r"\((\d+) earlier fire times missed\)$")


def position(state: Path) -> str:
    job = Ledger(state / "state.git").state().periodic.get("beat")
    return job.last_run if job is not None else ""


def recorded(state: Path) -> list[tuple[int, int, str]]:
    """Every fire time the branch's commits acted on: (time, missed before it, run id)."""
    out = []
    for commit in Ledger(state / "state.git").history():
        for line in commit.message.splitlines():
            m = LINE.match(line.strip())
            if m is not None:
                at = unstamp(m["when"].replace(" ", "T") + "Z")
                assert at is not None
                missed = MISSED.search(line.strip())
                out.append((at, int(missed[1]) if missed else 0, m["id"] or ""))
    return sorted(out)


async def test_a_broker_killed_after_each_run_neither_loses_nor_doubles_a_fire_time(
        nats_server: NatsServer, tmp_path: Path) -> None:
    d = Daemons(nats_server.url, tmp_path)
    nc = await nats.connect(nats_server.url)
    try:
        d.broker()
        d.worker("node-a")
        await wait_for(lambda: _has(nc), 60,
                       what="node-a healthy")
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
    got = recorded(d.state)
    times = [at for at, _, _ in got]
    assert len(times) == len(set(times)), got  # no fire time twice
    runs = [iid for _, _, iid in got if iid]
    assert len(runs) == len(set(runs)) and len(runs) >= 4
    for (before, _, _), (at, missed, _) in itertools.pairwise(got):
        assert at - before == 1 + missed, (before, at, missed)  # none lost


async def _has(nc: nats.NATS) -> bool:
    return "node-a" in await healthy_nodes(nc)


async def _answers(nc: nats.NATS) -> bool:
    try:
        await healthy_nodes(nc)
    except ClientError:
        return False
    return bool(await healthy_nodes(nc))
