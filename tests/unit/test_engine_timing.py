"""The worker's machine waits on other programs are the worker's `Timing` (`shared.timing`
rules 1 and 3): the Docker Engine API's (`engine_call_s`, `engine_ask_s`) and the one try at
start whether a child can be confined (`confine_s`), so a `[timing]` table sets them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker
import pytest

from gavel.shared.timing import Timing
from gavel.worker import engine, isolation

MINE = Timing(engine_call_s=71.0, engine_ask_s=7.0, confine_s=3.0)


def test_the_engine_api_is_asked_within_the_workers_timing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, float]] = []

    def get(url: str, path: str, timeout: float = -1.0) -> Any:
        asked.append((path, timeout))
        return {"Version": "27"} if path == "/version" else []

    made: list[dict[str, Any]] = []
    monkeypatch.setattr(engine, "get", get)
    monkeypatch.setattr(docker, "DockerClient", lambda **kw: made.append(kw) or object())
    got = engine.connect("tcp://127.0.0.1:1", node_id="n", home="/h", timing=MINE)
    assert got is not None
    assert asked == [("/version", 7.0), ("/images/json", 7.0)]
    assert got.client is not None and made[0]["timeout"] == 71.0
    assert (Timing().engine_call_s, Timing().engine_ask_s) == (60.0, 10.0)  # as they were


def test_the_confinement_try_at_start_takes_the_workers_timing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    tried: list[float] = []
    monkeypatch.setattr(isolation.os, "geteuid", lambda: 0)
    monkeypatch.setattr(isolation, "_works",
                        lambda identity, within, *, private_tmp: tried.append(within) or True)
    isolation.configure("uids", (500_000, 500_001), allow_root=False, owner="n",
                        leases=tmp_path / "leases", timing=MINE)
    assert tried == [3.0]
    assert Timing().confine_s == 30.0
