from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.integration.authed import authed
from tests.integration.harness import Cluster, UpDemo

__all__ = ["authed", "cluster", "up_demo"]

pytestmark = pytest.mark.integration


@pytest.fixture
async def cluster(nats_url: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(nats_url, tmp_path)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture(scope="session")
def up_demo(tmp_path_factory: pytest.TempPathFactory) -> UpDemo:
    """The demo run once for every test that reads what it did (auth's keys, the gateway's
    answer): the run is the expensive part, and the tests only read its output and files."""
    state = tmp_path_factory.mktemp("up-demo") / "up"
    proc = subprocess.run([sys.executable, "-m", "gavel", "up", "--demo", "--workers", "2",
                           "--state", str(state)], capture_output=True, text=True, timeout=150,
                          env={**os.environ, "GAVEL_ISOLATION": "uids"})  # as `make run`
    return UpDemo(proc, state)
