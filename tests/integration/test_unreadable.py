"""A file committed by hand that is not what its path says (GitOps gone wrong) neither stops
the broker nor gets overwritten: it is logged, left as it is, and a node whose node.json it
is wins nothing until someone fixes it in git."""

from __future__ import annotations

import pytest

from gavel.broker.ledger.repository import Ledger
from gavel.shared.api import DrainReply, DrainRequest
from gavel.shared.messages import Spec
from gavel.shared.reasons import Reason
from gavel.shared.records import node_path
from gavel.transport.client import ClientError
from tests.integration.harness import Cluster, wait_for

GARBAGE = b'{"node_id": "node-a", "instances": {"x": 1}}\n'


async def test_a_broken_node_file_is_left_alone_and_its_node_wins_nothing(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    Ledger(cluster.state / "state.git").write_files(
        {node_path("node-a"): GARBAGE, "instances/junk.json": b"[1, 2"}, "by hand", None)
    with caplog.at_level("ERROR", logger="gavel.ledger"):
        await cluster.start_broker()  # starts: the broken files do not stop it
    assert f"{node_path('node-a')} is not a usable gavel file" in caplog.text
    assert "instances/junk.json is not a usable gavel file" in caplog.text
    await cluster.start_agent("node-a")  # would win every tie on its node id
    await cluster.start_agent("node-b")
    await cluster.wait_nodes(2)
    iids = [await cluster.submit(Spec(name="svc", command=["sleep", "60"], cpu=0.1,
                                      memory_mb=16)) for _ in range(3)]
    await wait_for(lambda: all(cluster.holders(i) for i in iids), 15, what="placed")
    assert all(cluster.holders(i) == ["node-b"] for i in iids)
    repo = cluster.ledger().repo
    assert repo.revparse_single(f"main:{node_path('node-a')}").data == GARBAGE  # type: ignore[attr-defined]
    assert repo.revparse_single("main:instances/junk.json").data == b"[1, 2"  # type: ignore[attr-defined]
    with pytest.raises(ClientError, match=f"{Reason.UNREADABLE_FILE}: "
                       f"{node_path('node-a')}"):
        await cluster.call("drain", DrainRequest(node_id="node-a"), DrainReply)
    assert repo.revparse_single(f"main:{node_path('node-a')}").data == GARBAGE  # type: ignore[attr-defined]
