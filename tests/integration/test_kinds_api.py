"""Batch arrays, system jobs and periodic jobs through the HTTP API and the typed client,
against a real cluster: the status of an array (its tally), of a system job (its nodes and
those still waiting) and of a periodic job (its schedule and runs) read the same over HTTP
as from the client; the client waits for a job's end (`wait_job`: an array's last task, a
lone instance's end, `Ended` naming what failed) and for a system job to run on every node
(`wait_system`)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from gavel.cli.api import app
from gavel.client import Client, Ended
from gavel.shared.messages import Spec
from gavel.shared.spec import Restart
from tests.integration.harness import Cluster, wait_for
from tests.integration.httpclient import get_json, http

pytestmark = pytest.mark.integration


@pytest.fixture
async def api(cluster: Cluster) -> AsyncIterator[app.ApiServer]:
    await cluster.start_broker()
    await cluster.start_agent("n1", labels={"zone": "a"})
    await cluster.start_agent("n2", labels={"zone": "b"})
    await cluster.wait_nodes(2)
    server = await app.start(cluster.url, None, port=0)
    try:
        yield server
    finally:
        await server.close()


def steady(obj: Any) -> Any:
    """An answer without what changes from one moment to the next (usage, ages)."""
    if isinstance(obj, dict):
        return {k: steady(v) for k, v in obj.items()
                if k not in ("cpu_used", "memory_used_mb", "last_seen_s", "next_run")}
    if isinstance(obj, list):
        return [steady(v) for v in obj]
    return obj


async def agree(port: int, path: str, mine: Any) -> None:
    status, theirs = await get_json(port, path)
    assert status == 200, theirs
    assert steady(msgspec.to_builtins(mine)) == steady(theirs), path


async def test_arrays_system_and_periodic_jobs_in_the_api_and_the_clients_waits(
        cluster: Cluster, api: app.ApiServer) -> None:
    async with await Client.connect(cluster.url) as client:
        arr = Spec(name="arr", command=["true"], count=3, parallelism=2, cpu=0.1)
        await client.submit(arr, instance_id="arr", count=3)
        done = await client.wait_job("arr", timeout=120)
        assert done.array is not None and done.array.ok and done.array.succeeded == 3
        await agree(api.port, "/v1/instances/arr", await client.status("arr"))

        bad = Spec(name="bad", command=["false"], attempts=1, restart=Restart(attempts=0))
        await client.submit(bad, instance_id="bad")
        with pytest.raises(Ended, match="bad failed"):
            await client.wait_job("bad", timeout=120)

        agent = Spec(name="agent", type="system", cpu=0.1,
                     command=[sys.executable, "-c", "import time; time.sleep(600)"])
        await client.submit(agent)
        st = await client.wait_system("agent", timeout=120)
        assert st.system and st.nodes == ["n1", "n2"] and st.waiting == []
        assert sorted(r.node_id for r in st.replicas if r.state == "running") == ["n1", "n2"]
        await agree(api.port, "/v1/services/agent", await client.service("agent"))

        tick = msgspec.to_builtins(Spec(name="tick", command=["true"],
                                        schedule="* * * * * *"))
        status, _, got = await http(api.port, "POST", "/v1/instances",
                                    json_body={"spec": tick})
        assert status == 200 and b'"instance_id":"tick"' in got.replace(b" ", b""), got

        async def ran() -> bool:
            st = await client.status("tick")
            return st.periodic is not None and any(h.instance_id for h in st.periodic.history)
        await wait_for(ran, 60, what="the periodic job's first run")
        status, theirs = await get_json(api.port, "/v1/instances/tick")
        assert status == 200 and theirs["periodic"]["schedule"] == "* * * * * *"
        await client.cancel("tick")
