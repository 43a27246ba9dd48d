"""What a daemon runs beside its part has an owner (`gavel.cli.daemons` rule 9): a crash of
the broker's pusher or of the gateway's keeper is logged as it happens and stops the daemon,
instead of waiting, unsaid, for a signal to find it. Each daemon runs in this process against
a real nats-server, its pusher or keeper replaced by one that fails at once."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pygit2
import pytest

from gavel.broker import service
from gavel.broker.ledger.remote import Pusher
from gavel.cli import daemons, gatewaydaemon, logs
from gavel.cli.main import build_parser
from gavel.gateway.keeper import Keeper
from gavel.transport.natsserver import free_port

pytestmark = pytest.mark.integration

#: Bounds a stop that comes at once when the code is right: a wrong one fails, never hangs.
HANG_S = 60.0


async def broken(_self: object) -> None:
    await asyncio.sleep(0)
    raise RuntimeError("a bug in the loop")


def daemon_args(monkeypatch: pytest.MonkeyPatch, nats_url: str, *argv: str) -> argparse.Namespace:
    monkeypatch.setenv("GAVEL_NATS_URL", nats_url)
    monkeypatch.setattr(logs, "configure", lambda *_a, **_k: None)  # pytest keeps the logs
    args = build_parser().parse_args(list(argv))
    args.settings = daemons.settings(args)
    return args


async def test_a_crashed_pusher_stops_the_broker_and_is_said_at_once(
        nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    remote = tmp_path / "remote.git"
    pygit2.init_repository(str(remote), bare=True, initial_head="main")
    monkeypatch.setattr(Pusher, "run", broken)
    monkeypatch.setattr(service, "tune_gc", lambda: None)  # the test process's own GC
    args = daemon_args(monkeypatch, nats_url, "broker", "--state", str(tmp_path / "b"),
                       "--push", str(remote))
    with pytest.raises(RuntimeError, match="a bug in the loop"):
        async with asyncio.timeout(HANG_S):
            await daemons.run_broker(args)
    assert "the broker's pusher task pusher failed" in caplog.text


async def test_a_crashed_keeper_stops_the_gateway_with_status_1(
        nats_url: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(Keeper, "run", broken)
    args = daemon_args(monkeypatch, nats_url, "gateway", "--admin",
                       f"http://127.0.0.1:{free_port()}", "--listen",
                       f"127.0.0.1:{free_port()}", "--trust-advertised-addresses")
    async with asyncio.timeout(HANG_S):
        assert await gatewaydaemon.run_gateway(args) == 1
    assert "the gateway task keeper failed" in caplog.text
