"""A worker that restarts while its engine does not answer keeps its containers: the real
Docker Engine behind a unix-socket relay this test can silence (`worker.drivers` rule 3,
`worker.supervisor` `_adopt_later`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from gavel.shared.api import CancelReply, CancelRequest
from gavel.shared.messages import Spec
from gavel.worker.engine import Engine, connect
from tests.integration.dockerkit import image
from tests.integration.harness import Cluster, wait_for
from tests.integration.test_containers import containers, left_running

pytestmark = pytest.mark.integration


class Relay:
    """A unix socket that forwards each connection to the engine's, or, while `down`, shuts
    each new one at once: an engine that does not answer, as a restarting dockerd is."""

    def __init__(self, path: Path, engine: str) -> None:
        self.path, self.engine, self.down = path, engine, False
        self.refused = 0
        self._server: asyncio.AbstractServer | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Relay:
        self._server = await asyncio.start_unix_server(self._serve, str(self.path))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for t in self._pipes:
            t.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            self.refused += 1
            writer.close()
            return
        up_r, up_w = await asyncio.open_unix_connection(self.engine)
        for a, b in ((reader, up_w), (up_r, writer)):
            task = asyncio.create_task(self._pipe(a, b))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                dst.close()


def _engine_socket() -> str:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        pytest.skip(f"the relay speaks to a unix socket; DOCKER_HOST is {host}")
    return host[len("unix://"):]


async def test_a_container_is_kept_when_the_engine_does_not_answer_at_readoption(
        cluster: Cluster, engines: list[Engine], docker: Any, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """The worker restarts, and the engine does not answer while it re-adopts: the instance
    is held (not ended "exit status unknown" and placed again), its container is not swept,
    and once the engine answers the same container is watched again - no second copy."""
    caplog.set_level(logging.INFO, logger="gavel.worker")
    tag = image(docker, "v1")
    async with Relay(tmp_path / "engine.sock", _engine_socket()) as relay:
        iid, before = await left_running(cluster, engines, docker, tag)
        home = str((cluster.root / "workers" / "n1").resolve())
        engine = await asyncio.to_thread(  # blocking: the relay answers on this loop
            connect, f"unix://{relay.path}", node_id="n1", home=home)
        assert engine is not None
        engines.append(engine)
        relay.down = True  # the engine answered at start, and not while the worker adopts
        await cluster.start_agent("n1", engine=engine)
        await wait_for(lambda: relay.refused >= 2, 30, what="the worker to ask the engine")
        agent = cluster.agents["n1"]
        assert [r.instance_id for r in agent.instances()] == [iid], "held while unsure"
        assert containers(docker, cluster, iid) == [before], "swept while unsure"
        relay.down = False
        await wait_for(lambda: f"re-adopted instance {iid} (watch" in caplog.text, 60,
                       what="the container watched again")
        assert containers(docker, cluster, iid) == [before], "a second copy, or none"
        assert cluster.holders(iid) == ["n1"]
        assert (await cluster.status(iid)).state == "running"
        await cluster.call("cancel", CancelRequest(instance_id=iid), CancelReply)
        await wait_for(lambda: not containers(docker, cluster, iid, all_=True), 60,
                       what="the watched container to be stopped and removed by a cancel")


async def test_an_engine_that_answers_after_the_worker_started_is_taken_up(
        cluster: Cluster, engines: list[Engine], docker: Any, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """The engine is not up when the worker starts (a dockerd slower than its worker): the
    containers an earlier worker left are held, not ended; once the engine answers, the
    worker re-adopts them and bids on images again (`worker.engine` rule 5)."""
    caplog.set_level(logging.INFO, logger="gavel.worker")
    tag = image(docker, "v1")
    async with Relay(tmp_path / "engine.sock", _engine_socket()) as relay:
        iid, before = await left_running(cluster, engines, docker, tag)
        home = str((cluster.root / "workers" / "n1").resolve())
        found: list[Engine] = []

        def find() -> Engine | None:
            engine = connect(f"unix://{relay.path}", node_id="n1", home=home, quiet=True)
            found.extend([engine] if engine is not None else [])
            return engine

        relay.down = True
        agent = await cluster.start_agent("n1", engine=None, find_engine=find)
        await wait_for(lambda: relay.refused >= 2, 30, what="the worker to ask the engine")
        assert [r.instance_id for r in agent.instances()] == [iid], "held while no engine"
        relay.down = False
        await wait_for(lambda: f"re-adopted instance {iid} (watch" in caplog.text, 60,
                       what="the container re-adopted once the engine answered")
        engines.extend(found)
        assert containers(docker, cluster, iid) == [before], "a second copy, or none"
        second = await cluster.submit(Spec(name="next", image=tag, command=["sleep", "600"]))
        await wait_for(lambda: len(containers(docker, cluster, second)) == 1, 60,
                       what="the node to bid on images again and run one")
        assert cluster.holders(second) == ["n1"]
        # ended through the relay while it still forwards: the worker's engine client speaks
        # only through it, so one stopped after it closed would leave both containers behind
        for done in (iid, second):
            await cluster.call("cancel", CancelRequest(instance_id=done), CancelReply)
        await wait_for(lambda: not containers(docker, cluster, all_=True), 60,
                       what="both containers stopped and removed by their cancels")
