from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gavel.worker.engine import Engine
from tests.integration.authed import authed
from tests.integration.dockerkit import engine_client
from tests.integration.harness import Cluster, UpDemo, release_ports

__all__ = ["authed", "cluster", "docker", "engines", "up_demo"]

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _ports_let_go() -> Iterator[None]:
    """The ports a test claimed (`harness.free_range`) are free for the next, once it and
    every fixture it used are done."""
    yield
    release_ports()


@pytest.fixture
async def cluster(nats_url: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(nats_url, tmp_path)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
def docker() -> Iterator[Any]:
    """A client of the real Docker Engine (skipped with a sentence where none answers)."""
    client = engine_client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
async def engines(docker: Any, cluster: Cluster) -> AsyncIterator[list[Engine]]:
    """The workers' engine clients, closed after the cluster (and its workers) stopped."""
    made: list[Engine] = []
    try:
        yield made
    finally:
        await cluster.close()  # its workers first: they use the clients until they stop
        for e in made:
            e.close()


@pytest.fixture(scope="session")
def up_demo(tmp_path_factory: pytest.TempPathFactory) -> UpDemo:
    """The demo run once for every test that reads what it did (auth's keys, the gateway's
    answer): the run is the expensive part, and the tests only read its output and files."""
    state = tmp_path_factory.mktemp("up-demo") / "up"
    proc = subprocess.run([sys.executable, "-m", "gavel", "up", "--demo", "--workers", "2",
                           "--state", str(state)], capture_output=True, text=True, timeout=150,
                          env={**os.environ, "GAVEL_ISOLATION": "uids"})  # as `make run`
    return UpDemo(proc, state)
