"""An image the node lacks is pulled when its container is created, from a registry on
loopback (`tests.integration.dockerkit.local_registry`: Debian's ``docker-registry``, holding
only the image this test pushed to it), and the node holds it from then on: its bid for that
image says so (`Bid.warm`: the strategies price a cold node `shared.strategies.WARM_BONUS`
higher, tests/unit/test_core_feasibility.py).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gavel.bench.containerstart import measure
from gavel.shared import subjects
from gavel.shared.messages import RFB, Bid, BidReply, Shape, Spec
from gavel.transport.natsserver import free_port
from gavel.transport.wire import subscribed
from gavel.worker.engine import Engine
from tests.integration.dockerkit import PREFIX, image, local_registry
from tests.integration.harness import TIMING, Cluster, wait_for
from tests.integration.test_containers import ended, instance_dir, start

pytestmark = pytest.mark.integration


async def bid(nc: Any, node: str, shape: Shape) -> Bid:
    """The node's answer to a dry-run request for bids on `shape` alone."""
    sub = await nc.subscribe(subjects.BIDS.format(node=node))
    try:
        await subscribed(nc)
        auction = uuid.uuid4().hex
        await nc.publish(subjects.RFB_NODE.format(node=node), msgspec.msgpack.encode(
            RFB(auction_id=auction, shapes=[shape], deadline_s=5.0, dry_run=True)))
        while True:
            reply = msgspec.msgpack.decode((await sub.next_msg(timeout=10)).data,
                                           type=BidReply)
            if reply.auction_id == auction:
                (answer,) = reply.answers
                assert isinstance(answer, Bid), answer
                return answer
    finally:
        await sub.unsubscribe()


async def test_an_image_the_node_lacks_is_pulled_at_provisioning_then_bid_warm(
        cluster: Cluster, engines: list[Engine], docker: Any, tmp_path: Path) -> None:
    with local_registry(tmp_path, free_port()) as registry:
        repo, tag = f"{registry}/{PREFIX}-pulled", uuid.uuid4().hex[:12]
        remote = f"{repo}:{tag}"
        docker.images.get(image(docker, "v1")).tag(repo, tag)
        pushed = list(docker.images.push(repo, tag=tag, stream=True, decode=True))
        assert not [p for p in pushed if "error" in p], pushed
        docker.images.remove(remote)  # the node lacks it now: only the registry has it
        try:
            await cluster.start_broker()
            await start(cluster, engines, "n1")
            await cluster.wait_nodes(1)
            nc = await cluster.client()
            shape = Shape(cpu=0.1, memory_mb=64, image=remote)
            cold = await bid(nc, "n1", shape)
            assert not cold.warm

            iid = await cluster.submit(Spec(name="pulled", image=remote,
                                            command=["sh", "-c", "echo pulled"]))
            st = await ended(cluster, iid)
            assert st.state == "succeeded", st
            assert (instance_dir(cluster, "n1", iid) / "stdout.log").read_text() == "pulled\n"
            warm: list[Bid] = []

            async def says_warm() -> bool:
                warm.append(await bid(nc, "n1", shape))
                return warm[-1].warm
            await wait_for(says_warm, 30, what="the node's bid to say it holds the image")
        finally:
            with contextlib.suppress(Exception):
                docker.images.remove(remote, force=True)


async def test_the_start_bench_measures_a_pulled_image_beside_the_others(
        docker: Any, tmp_path: Path) -> None:
    """`python -m gavel.bench.containerstart --registry`: the pulled kind beside the
    process, the warm and the cold image, each image it made removed afterwards."""
    (tmp_path / "registry").mkdir()
    (tmp_path / "bench").mkdir()
    with local_registry(tmp_path / "registry", free_port()) as registry:
        lines = await measure(1, tmp_path / "bench", registry, TIMING)
    assert [(line["kind"], line["n"]) for line in lines] == [
        ("process", 1), ("container-warm", 1), ("container-cold", 1),
        ("container-pulled", 1)]
    mine = f"gavel-bench-start:start-{os.getpid()}-"  # this run's (another may share the engine)
    left = [t for i in docker.images.list() for t in i.tags
            if t.startswith(mine) or (f"/gavel-bench-start:start-{os.getpid()}-" in t)]
    assert left == []
