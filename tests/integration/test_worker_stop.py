"""A worker that shuts down stops its instances and reports them `worker stopped`; that is
not the instances' failure: the broker re-places each without spending an attempt."""

from __future__ import annotations

import pytest

from tests.integration.harness import Cluster, sleeper_spec, wait_for

pytestmark = pytest.mark.integration


async def test_a_clean_worker_stop_re_places_without_spending_an_attempt(
        cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a", cpu=4.0)
    await cluster.wait_nodes(1)
    iid = await cluster.submit(sleeper_spec("s", cpu=0.5, attempts=1))

    async def running_on(node: str) -> bool:
        st = await cluster.status(iid)
        return bool(st.state == "running" and st.node_id == node)
    await wait_for(lambda: running_on("node-a"), 15, what="running on node-a")
    await cluster.start_agent("node-b", cpu=4.0)
    await cluster.wait_nodes(2)
    await cluster.stop_agent("node-a")  # kills its instances, reports them worker-stopped
    await wait_for(lambda: running_on("node-b"), 15, what="re-placed on node-b")
    st = await cluster.status(iid)
    assert st.attempt == 1  # its one attempt, given back: attempts = 1 would have failed it
