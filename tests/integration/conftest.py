from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.integration.authed import authed
from tests.integration.harness import Cluster

__all__ = ["authed", "cluster"]

pytestmark = pytest.mark.integration


@pytest.fixture
async def cluster(nats_url: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(nats_url, tmp_path)
    try:
        yield c
    finally:
        await c.close()
