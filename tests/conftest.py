"""Shared fixtures: a real nats-server on a free loopback port, fast timers everywhere."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("GAVEL_FAST_TIMERS", "1")

from broker.natsserver import NatsServer


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(store_dir=tmp_path / "jetstream", log=tmp_path / "nats.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    return nats_server.url
