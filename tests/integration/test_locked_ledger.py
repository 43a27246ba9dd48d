"""A locked state repository: an error event with a clear sentence, nothing half-written,
the API still answering, and the placement made once the lock is gone."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import msgspec
import nats
import pytest

from gavel.shared import subjects
from gavel.shared.messages import Event
from gavel.shared.reasons import Reason
from gavel.transport import wire
from gavel.transport.client import ClientError
from tests.integration.harness import Cluster, sleeper_spec, wait_for

pytestmark = pytest.mark.integration


async def take_lock(lock: Path) -> None:
    """Lock the ref as git does - create the lock file exclusively - waiting out the
    broker's own lock if a commit of its is in flight (overwriting that lock file would
    make the broker rename our words into the ref)."""
    for _ in range(1000):
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            await asyncio.sleep(0.01)
            continue
        os.write(fd, b"held by someone else\n")
        os.close(fd)
        return
    raise AssertionError(f"{lock} stayed locked for 10 s")


async def test_locked_repo_errors_then_recovers(cluster: Cluster) -> None:
    await cluster.start_broker()
    iid = await cluster.submit(sleeper_spec("svc"))  # queued: no node yet
    lock = cluster.state / "state.git" / "refs" / "heads" / "main.lock"
    await take_lock(lock)
    head = cluster.ledger().head()  # once the lock is ours: nothing can land after this

    seen: list[Event] = []

    async def collect(m: nats.aio.msg.Msg) -> None:
        seen.append(msgspec.msgpack.decode(m.data, type=Event))

    nc = await cluster.client()
    await nc.subscribe(subjects.EVENTS.format(instance=iid), cb=collect)
    await wire.subscribed(nc)
    await cluster.start_agent("node-a")
    await wait_for(lambda: any(e.type == "error" for e in seen), 15, what="an error event")
    err = next(e for e in seen if e.type == "error")
    assert err.reason == Reason.LEDGER_UNWRITABLE
    assert "locked or unwritable" in err.reason
    assert cluster.ledger().head() == head  # nothing written
    with pytest.raises(ClientError, match="locked or unwritable"):
        await cluster.submit(sleeper_spec("other"))
    assert (await cluster.status(iid)).instance_id == iid  # the API still answers

    lock.unlink()
    await wait_for(lambda: cluster.holders(iid) == ["node-a"], 15, what="placed after unlock")


async def test_a_lock_left_by_a_writer_killed_mid_commit_is_cleared_at_start(
        cluster: Cluster) -> None:
    """Found by the chaos run: a broker killed -9 between locking the ref and moving it
    leaves ``main.lock`` behind, and every broker after it failed every commit "locked" for
    good. A broker starting waits a moment for the lock to go, then removes it (ledger rule
    8) and places as before."""
    await cluster.start_broker()
    iid = await cluster.submit(sleeper_spec("svc"))  # queued: no node yet
    await cluster.stop_broker()
    lock = cluster.state / "state.git" / "refs" / "heads" / "main.lock"
    lock.write_bytes(b"")  # what libgit2's lock looks like until the ref is written
    await cluster.start_broker()
    assert not lock.exists()
    await cluster.start_agent("node-a")
    await wait_for(lambda: cluster.holders(iid) == ["node-a"], 15, what="placed after start")
