"""Retention with the real pieces: a real worker runs an instance to its end, the broker
stamps the end in git, and `timing.retention_s` later the record leaves the state tree in a
commit that names it, while git history keeps it; a record written by hand without a stamp
is timed from the broker's start; retention 0 keeps everything."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pygit2
import pytest
from prometheus_client import generate_latest

from gavel.broker.ledger.repository import Ledger, encode, parse_stamp
from gavel.shared.api import StatusReply, StatusRequest
from gavel.shared.messages import InstanceState, Spec
from gavel.shared.reasons import Reason
from gavel.shared.records import InstanceRecord, flat_instance_path, instance_path
from gavel.transport.client import ClientError
from tests.integration.harness import TIMING, Cluster, wait_for

KEEP_S = 1.0


def _in_tree(cluster: Cluster, iid: str) -> bool:
    return iid in cluster.ledger().state().instances


def _messages(state_dir: Path) -> str:
    repo = pygit2.Repository(str(state_dir / "state.git"))
    return "\n".join(c.message for c in repo.walk(repo.head.target))


async def test_an_ended_instance_is_forgotten_after_retention_and_history_keeps_it(
        cluster: Cluster) -> None:
    broker = await cluster.start_broker(timing=msgspec.structs.replace(TIMING,
                                                                       retention_s=KEEP_S))
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    iid = await cluster.submit(Spec(name="once", command=["true"]))
    await wait_for(lambda: (r := cluster.ledger().state().instances.get(iid)) is not None
                   and r.state is InstanceState.SUCCEEDED, 15, what="succeeded")
    rec = cluster.ledger().state().instances[iid]
    ended = parse_stamp(rec.ended_at)
    assert ended is not None
    ended_commit = pygit2.Repository(str(cluster.state / "state.git")).head.target
    await wait_for(lambda: not _in_tree(cluster, iid), KEEP_S + 15, what="forgotten")
    # Not before the window is over (the stamp is the end commit's time, to the ms).
    assert datetime.now(UTC) >= ended + timedelta(seconds=KEEP_S)
    assert f"forget {iid} (succeeded, ended {rec.ended_at}): " \
        f"{Reason.RETAINED}" in _messages(cluster.state)
    repo = pygit2.Repository(str(cluster.state / "state.git"))
    assert instance_path(iid) in repo[ended_commit].peel(pygit2.Tree)  # history keeps it
    # counted by the commit's effects, which run once it is durable: soon after the tree moved
    await wait_for(lambda: broker.retention.forgotten_total >= 1, 15, what="counted")
    assert broker.retention.forgotten_total == 1
    assert iid not in broker.ledger.state().instances and not broker.ledger.state().ended
    with pytest.raises(ClientError, match=f"no such instance: {iid} \\(the record of an ended "
                       "instance leaves the state tree 1 s after it ended or once 100000 newer "
                       r"ended ones are kept; git history keeps it\)"):
        await cluster.call("status", StatusRequest(instance_id=iid), StatusReply)
    text = generate_latest(broker.metrics.registry).decode()
    assert "gavel_instances_forgotten_total 1.0" in text


async def test_a_hand_written_end_counts_from_the_broker_start_and_zero_keeps_it(
        cluster: Cluster) -> None:
    # An operator commits an ended record without a stamp (or an older gavel wrote it).
    old = InstanceRecord(instance_id="by-hand", spec=Spec(name="h", command=["true"]),
                         state=InstanceState.FAILED, reason="exited")
    Ledger(cluster.state / "state.git").write_files(
        {flat_instance_path("by-hand"): encode(old)}, "by hand", None)
    # Retention 0: kept for ever.
    await cluster.start_broker(timing=msgspec.structs.replace(TIMING, retention_s=0.0))
    await cluster.submit(Spec(name="nudge", command=["true"]), "nudge")  # a commit happens
    await wait_for(lambda: "nudge" in cluster.ledger().state().instances, 10, what="submitted")
    time.sleep(KEEP_S)
    assert _in_tree(cluster, "by-hand")
    await cluster.stop_broker()
    # With a window: timed from this start, then forgotten (flat path and all).
    started = time.monotonic()
    await cluster.start_broker(timing=msgspec.structs.replace(TIMING, retention_s=KEEP_S))
    await wait_for(lambda: not _in_tree(cluster, "by-hand"), KEEP_S + 15, what="forgotten")
    assert time.monotonic() - started >= KEEP_S - 0.5
    assert "forget by-hand (failed): " in _messages(cluster.state)
    assert _in_tree(cluster, "nudge")  # not ended: never forgotten


async def test_beyond_ended_max_the_oldest_ended_records_leave_first(
        cluster: Cluster) -> None:
    await cluster.start_broker(timing=msgspec.structs.replace(TIMING, retention_s=0.0),
                               ended_max=1)
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    for k in range(3):  # one after another, so the end order is known
        iid = await cluster.submit(Spec(name="once", command=["true"]), f"once-{k}")
        # The newest ended record is never the one forgotten: it can be waited for.
        def ended(iid: str = iid) -> bool:
            r = cluster.ledger().state().instances.get(iid)
            return r is not None and r.state is InstanceState.SUCCEEDED
        await wait_for(ended, 15, what="succeeded")
    await wait_for(lambda: set(cluster.ledger().state().instances) == {"once-2"}, 15,
                   what="only the newest ended record left")
    messages = _messages(cluster.state)
    for iid in ("once-0", "once-1"):
        assert f"forget {iid} (succeeded, ended " in messages
    assert Reason.RETAINED_MAX in messages
