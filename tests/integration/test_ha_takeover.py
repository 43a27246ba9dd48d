"""A standby that takes over derives everything from the remote, even when it had read its
own stale copy while standing by (a metrics scrape does): what another leadership moved
since is not "corrected" back to what the stale copy held.

A real nats-server, real state repositories and a real bare remote; the broker in this
process.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pygit2
import pytest

from gavel.broker.context import Leadership
from gavel.broker.ledger.remote import Pusher
from gavel.broker.ledger.repository import Change, Ledger
from gavel.broker.service import Broker, Config
from gavel.shared.messages import InstanceState, Spec
from gavel.shared.records import Assignment, InstanceRecord, NodeFile
from tests.integration.harness import TIMING

pytestmark = pytest.mark.integration
REF = "refs/heads/main"
SPEC = Spec(name="x", command=["true"])


def place(ledger: Ledger, iid: str, node: str, off: str = "") -> str:
    st = ledger.state()
    nodes: dict[str, NodeFile | None] = {node: NodeFile(node_id=node, instances={
        iid: Assignment(instance_id=iid, auction_id="a", cpu=SPEC.cpu,
                        memory_mb=SPEC.memory_mb)})}
    if off:
        nodes[off] = msgspec.structs.replace(st.nodes[off], instances={})
    rec = InstanceRecord(instance_id=iid, spec=SPEC, node_id=node, state=InstanceState.PLACED)
    return ledger.apply(Change(instances={iid: rec}, nodes=nodes),
                        f"place {iid} on {node}\n", st.head)


async def test_a_takeover_does_not_undo_what_another_leadership_moved(
        nats_url: str, tmp_path: Path) -> None:
    pygit2.init_repository(str(tmp_path / "remote.git"), bare=True, initial_head="main")
    url = str(tmp_path / "remote.git")
    b_path, a_path = tmp_path / "b" / "state.git", tmp_path / "a" / "state.git"
    pb = Pusher(Ledger(b_path).path, REF, url)
    pb.take_over("b", 1, "t0")  # b leads first, and places x on n1
    place(Ledger(b_path), "x", "n1")
    Pusher(b_path, REF, url, epoch=1).sync()
    pa = Pusher(Ledger(a_path).path, REF, url)
    pa.take_over("a", 2, "t1")  # then a leads, and moves x to n2
    place(Ledger(a_path), "x", "n2", off="n1")
    Pusher(a_path, REF, url, epoch=2).sync()

    leader = Leadership(broker_id="b", ha=True)  # b stands by again, readied
    broker = Broker(Config(nats_url=nats_url, state_dir=tmp_path / "b", timing=TIMING,
                           writer="thread"), leader=leader)
    assert broker.ledger.state().placement_of("x") == "n1"  # its stale copy, read
    taken = Pusher(b_path, REF, url).take_over("b", 3, "t2")
    leader.epoch = taken.epoch
    await broker.start()
    try:
        await asyncio.sleep(10 * TIMING.tick_s)  # a few passes of its loop
        st = broker.ledger.state()
        assert st.placement_of("x") == "n2" and not st.disputes
        assert Ledger(b_path).head() == taken.head  # no "correction" was committed
    finally:
        await broker.close()
