"""`Client.wait_deployed` (`gavel.client.deploywait`) against a real broker and worker: a
deploy that becomes whole is its status, one whose replicas never pass their check is
`TimedOut` past the timeout with the status last seen, and one cancelled by a stop is
`Ended` with the sentence `gavel deploy --wait` says."""

from __future__ import annotations

import sys

import pytest

from gavel.client import Client, Ended, TimedOut
from gavel.shared.messages import Spec
from gavel.shared.spec import Check
from tests.integration.harness import Cluster

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


async def test_a_deploy_is_waited_for_to_its_end(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    async with await Client.connect(cluster.url) as client:
        web = await client.deploy(Spec(name="web", type="service", count=2, cpu=0.1,
                                       command=SLEEP))
        st = await client.wait_deployed("web", web.version, timeout=120)
        assert st.name == "web" and [(v.version, v.healthy) for v in st.versions] == \
            [(web.version, 2)]

        sick = await client.deploy(Spec(name="sick", type="service", cpu=0.1, command=SLEEP,
                                        checks=[Check(type="exec", command=["false"],
                                                      interval_s=0.2)]))
        with pytest.raises(TimedOut) as timed_out:
            await client.wait_deployed("sick", sick.version, timeout=1)
        assert timed_out.value.status.name == "sick"
        await client.stop("sick")
        with pytest.raises(Ended, match="sick version 1 was cancelled: stopped"):
            await client.wait_deployed("sick", sick.version, timeout=120)
