"""A `[timing]` value in the config a daemon is started with reaches the part that waits by it
(`shared.timing` rule 1), not `Timing()`'s default read where the part's module is loaded:
the broker's wait before it removes a dead writer's lock (`stale_lock_s`), its writer
process's look for its broker (`orphan_s`), a broker's first connect (`connect_s`, when the
`Config` does not say), a worker's read of a failed HTTP check's body (`explain_s`); and the
event follower and the wait for an instance running (`follow_s`) take the `Timing` of the
program that holds the client. At the defaults each is the value it was."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gavel.broker import service
from gavel.broker.config import Config
from gavel.broker.ledger import gitwriter
from gavel.broker.ledger.repository import Ledger
from gavel.cli.config import BrokerConfig, WorkerConfig, effective_timing, load
from gavel.cli.options import BROKER_OPTIONS, WORKER_OPTIONS
from gavel.client import aio
from gavel.shared.spec import Check
from gavel.shared.strategies import make_strategy
from gavel.shared.timing import Timing
from gavel.transport import eventstream
from gavel.worker import probes
from gavel.worker.agent import Agent

MINE = "[timing]\nstale_lock_s = 0.25\norphan_s = 0.75\nconnect_s = 7.0\nexplain_s = 0.125\n" \
       "follow_s = 0.375\n"


class _Reached(Exception):
    """The wait in question was reached: the test has seen what it was handed."""


@pytest.fixture
def writers(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Any, ...]]]:
    """The writer processes' initializer arguments, their pools made as threads."""
    made: list[tuple[Any, ...]] = []

    class Pool(ThreadPoolExecutor):
        def __init__(self, *, max_workers: int, mp_context: Any,
                     initializer: Callable[..., None], initargs: tuple[Any, ...]) -> None:
            made.append(initargs)
            super().__init__(max_workers=max_workers)

    monkeypatch.setattr(gitwriter, "ProcessPoolExecutor", Pool)
    yield made


def _broker_config(tmp_path: Path, text: str) -> BrokerConfig:
    file = tmp_path / "broker.toml"
    file.write_text(f'state = "{tmp_path / "s"}"\n' + text)
    return load(BrokerConfig, BROKER_OPTIONS, file=str(file), env={})


@pytest.mark.parametrize(("text", "stale_lock_s", "orphan_s"), [
    (MINE, 0.25, 0.75), ("", 1.0, 1.0)])
async def test_the_brokers_config_reaches_its_stale_lock_wait_and_its_writer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writers: list[tuple[Any, ...]],
        text: str, stale_lock_s: float, orphan_s: float) -> None:
    from gavel.cli.daemons import make_broker

    waited: list[float] = []

    def clear_stale_lock(self: Ledger, wait_s: float) -> None:
        waited.append(wait_s)
        raise _Reached

    broker = make_broker(_broker_config(tmp_path, text), {})
    try:
        assert writers == [(os.getpid(), orphan_s)]
        assert broker.committer.stale_lock_s == stale_lock_s  # its writer's death (rule 11)
        monkeypatch.setattr(Ledger, "clear_stale_lock", clear_stale_lock)
        with pytest.raises(_Reached):
            await broker.start()
        assert waited == [stale_lock_s]
    finally:
        broker.committer.close()


async def test_an_ha_brokers_config_reaches_its_stale_lock_wait(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gavel.broker.ha import HaBroker
    from gavel.cli.daemons import make_broker

    waited: list[float] = []

    def clear_stale_lock(self: Ledger, wait_s: float) -> None:
        waited.append(wait_s)
        raise _Reached

    broker = make_broker(_broker_config(
        tmp_path, f'push = "file://{tmp_path / "r.git"}"\n[ha]\nreplicas = 1\n' + MINE), {})
    assert isinstance(broker, HaBroker)
    monkeypatch.setattr(Ledger, "clear_stale_lock", clear_stale_lock)
    with pytest.raises(_Reached):
        await broker.start()
    assert waited == [0.25]


def test_a_broker_connects_within_its_timings_connect_s_unless_its_config_says(
        tmp_path: Path) -> None:
    base = Config(nats_url="nats://127.0.0.1:1", state_dir=tmp_path)
    assert base.first_connect_s == 30.0 == Timing().connect_s  # as it was
    mine = replace(base, timing=Timing(connect_s=7.0))
    assert mine.first_connect_s == 7.0
    assert replace(mine, connect_wait_s=1.5).first_connect_s == 1.5
    assert replace(mine, connect_wait_s=None).first_connect_s is None  # the daemon: for ever
    from gavel.cli.daemons import make_broker

    config = make_broker(_broker_config(tmp_path, MINE), {}).config
    assert (config.timing.connect_s, config.first_connect_s) == (7.0, None)


async def test_a_brokers_first_connect_is_given_its_connect_s(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    given: list[float | None] = []

    async def connect_within(make: Any, url: str, options: Any, wait_s: float | None,
                             retry_s: float) -> Any:
        given.append(wait_s)
        raise _Reached

    monkeypatch.setattr(service, "connect_within", connect_within)
    broker = service.Broker(Config(nats_url="nats://127.0.0.1:1", state_dir=tmp_path,
                                   writer="thread", timing=Timing(connect_s=7.0)))
    try:
        with pytest.raises(_Reached):
            await broker.start()
    finally:
        broker.committer.close()
    assert given == [7.0]


async def test_the_workers_config_reaches_its_http_checks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "worker.toml"
    file.write_text('node_id = "n1"\n' + MINE)
    timing = effective_timing(load(WorkerConfig, WORKER_OPTIONS, file=str(file), env={}), {})
    agent = Agent(nats_url="nats://127.0.0.1:1", node_id="n1",
                  strategy=make_strategy("least-loaded"), labels={}, state_dir=tmp_path,
                  timing=timing, cpu=1.0, memory_mb=512)
    assert agent._supervisor.timing.explain_s == 0.125  # what its instances' checks read

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 503 Busy\r\nContent-Length: 7\r\n\r\nno room")
        await writer.drain()
        writer.close()

    bounds: list[float | None] = []
    real = asyncio.timeout

    def timeout(delay: float | None) -> asyncio.Timeout:
        bounds.append(delay)
        return real(delay)

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    async def env() -> dict[str, str]:
        return {}

    try:
        monkeypatch.setattr(probes.asyncio, "timeout", timeout)
        for explain_s in (0.125, Timing().explain_s):
            bounds.clear()
            ok, out = await probes.probe(Check(type="http", port="web", timeout_s=9.0),
                                         ports={"web": port}, env=env, cwd=tmp_path,
                                         explain_s=explain_s)
            assert (ok, out) == (False, "HTTP 503 Busy (expected 200): no room")
            assert bounds == [9.0, explain_s]
    finally:
        monkeypatch.undo()
        server.close()
        await server.wait_closed()


async def test_the_event_follower_and_the_wait_for_running_take_the_clients_timing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert eventstream.follow(object()).follow_s == Timing().follow_s == 1.0  # as it was
    assert eventstream.follow(object(), follow_s=0.375).follow_s == 0.375
    followed: list[float] = []
    waited: list[float] = []

    class Started:
        def __init__(self, nc: Any, instance_id: str, after: int | None, *,
                     follow_s: float) -> None:
            followed.append(follow_s)

        async def start(self) -> Started:
            return self

    async def running(client: Any, iid: str, timeout: float | None, watch: Any, *,
                      poll_s: float) -> None:
        waited.append(poll_s)

    monkeypatch.setattr(eventstream, "follow", Started)
    monkeypatch.setattr(aio, "running", running)
    for client, follow_s in ((aio.Client(object(), timing=Timing(follow_s=0.375)), 0.375),
                             (aio.Client(object()), 1.0)):
        await client.follow_events("i-1")
        await client.wait("i-1")
        assert (followed.pop(), waited.pop()) == (follow_s, follow_s)
