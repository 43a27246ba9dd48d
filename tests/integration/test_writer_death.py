"""A broker whose writer process is killed goes on placing: the next submissions are
committed by a fresh writer, each once, and placed (`broker.ledger.committer` rule 11) -
a real nats-server, a real worker, git, and the writer process the broker started."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest

from gavel.shared.messages import InstanceState
from tests.integration.harness import Cluster, sleeper_spec, wait_for

pytestmark = pytest.mark.integration


async def test_a_broker_whose_writer_is_killed_places_what_comes_next_once(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gavel.ledger")
    broker = await cluster.start_broker(writer="process")
    await cluster.start_agent("n1")
    await cluster.wait_nodes(1)

    async def running(iid: str) -> bool:
        return (await cluster.status(iid)).state == InstanceState.RUNNING

    first = await cluster.submit(sleeper_spec("before"))
    await wait_for(lambda: running(first), 30, what="the first instance running")
    loop = asyncio.get_running_loop()
    pid = await loop.run_in_executor(broker.committer._pool, os.getpid)
    assert pid != os.getpid(), "the writer is a process of its own"
    os.kill(pid, signal.SIGKILL)
    later = [await cluster.submit(sleeper_spec(f"after-{i}")) for i in range(3)]
    for iid in later:
        await wait_for(lambda i=iid: running(i), 60, what=f"{iid} running after the kill")
    fresh = await loop.run_in_executor(broker.committer._pool, os.getpid)
    assert fresh not in (pid, os.getpid())
    assert caplog.text.count("the writer process died; a new one takes over") == 1
    lines = [line for c in broker.ledger.history() for line in c.message.splitlines()]
    for iid in later:  # a commit's message has a line per change (a submit may share one)
        assert sum(1 for line in lines if line.startswith(f"submit {iid}")) == 1, lines
