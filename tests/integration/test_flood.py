"""One node cannot starve the broker.

A real nats-server with the config `gavel auth init` writes, a real `gavel broker` and two
`gavel worker` processes each on its own credential, and a flooding node on its own
credential publishing, as fast as it can, heartbeats far larger than it could hold in turn
with valid-size ones. Meanwhile 50 concurrent API calls (status and submit) all answer, the
submissions are placed on the other nodes and run there while the flood goes on, and the
broker is never disconnected: no "Slow Consumer" in the server's log, no lost connection
in the broker's. The oversized heartbeats that reach the broker are refused by their size.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gavel.broker.heartbeats import TOO_LARGE
from gavel.shared.api import (
    NodesReply,
    NodesRequest,
    StatusReply,
    StatusRequest,
    SubmitReply,
    SubmitRequest,
)
from gavel.transport import identity as auth
from gavel.transport.client import call, connect
from gavel.transport.natsserver import NatsServer
from tests.integration.harness import Daemons, healthy_nodes, sleeper_spec, wait_for

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


async def test_a_flooding_node_does_not_starve_the_broker(tmp_path: Path) -> None:
    ids = auth.init(tmp_path, ["node-1", "node-2", "flood"])
    log = tmp_path / "nats.log"
    server = NatsServer(store_dir=tmp_path / "js", config=ids.config, log=log).start()
    d = Daemons(server.url, tmp_path, creds={"broker": ids.broker, **ids.nodes})
    flooder: subprocess.Popen[str] | None = None
    op: Any = None
    try:
        d.broker()
        d.worker("node-1")
        d.worker("node-2")
        op = await connect(server.url, str(ids.operator))
        await wait_for(lambda: _has(op, {"node-1", "node-2"}), 30, what="both nodes healthy")

        flooder = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.flooder", server.url,
             str(ids.nodes["flood"]), "flood"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert flooder.stdout is not None
        started = await asyncio.to_thread(flooder.stdout.readline)
        assert started.strip() == "flooding"
        await asyncio.sleep(3.0)  # several seconds of flood in all: a few before the calls

        spec = sleeper_spec("light", cpu=0.05, memory_mb=16)

        async def one(k: int) -> str:
            if k % 2:
                return (await call(op, "submit", SubmitRequest(spec=spec), SubmitReply,
                                   timeout=30.0)).instance_id
            await call(op, "status", StatusRequest(), StatusReply, timeout=30.0)
            return ""

        answers = await asyncio.gather(*(one(k) for k in range(50)))  # raises if one did not
        submitted = [iid for iid in answers if iid]
        assert len(submitted) == 25

        async def all_running() -> bool:
            st = await call(op, "status", StatusRequest(), StatusReply, timeout=30.0)
            mine = {i.instance_id: i for i in st.instances if i.instance_id in submitted}
            return len(mine) == 25 and all(i.state == "running" and
                                           i.node_id in ("node-1", "node-2")
                                           for i in mine.values())
        await wait_for(all_running, 60, every=0.2, what="every submission running")
        assert flooder.poll() is None, "the flood ended before the placements landed"

        nodes = await call(op, "nodes", NodesRequest(), NodesReply, timeout=30.0)
        assert nodes.rejected.get(TOO_LARGE, 0) >= 1
    finally:
        sent: dict[str, int] = {}
        if flooder is not None:
            flooder.terminate()
            out, _ = await asyncio.to_thread(flooder.communicate, timeout=30)
            sent = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        if op is not None:
            await op.close()
        d.close()
        server.stop()
    assert sent.get("big", 0) > 0 and sent.get("small", 0) > 0, sent
    assert "Slow Consumer" not in log.read_text(), "nats-server cut a client off"
    broker_log = (tmp_path / "broker.log").read_text()
    assert "lost NATS" not in broker_log, "the broker was disconnected"


async def _has(nc: Any, nodes: set[str]) -> bool:
    return nodes <= await healthy_nodes(nc)
