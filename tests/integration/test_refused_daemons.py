"""A daemon whose credential NATS refuses, or whose credential is another's, says so in one
error line and exits 1 on its own - after `daemons.AUTH_TRIES` refusals in a row, or at once
for a credential that is not its own - instead of retrying, and warning, for ever. Real
`gavel worker` / `gavel broker` processes against a nats-server run with `gavel auth init`'s
config."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gavel.transport import identity
from gavel.transport.natsserver import NatsServer
from tests.integration.harness import gavel_process

pytestmark = pytest.mark.integration


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[NatsServer, identity.Identities]]:
    ids = identity.init(tmp_path / "cluster", ["node-a", "node-b"])
    s = NatsServer(store_dir=tmp_path / "js", config=ids.config, log=tmp_path / "nats.log")
    s.start()
    try:
        yield s, ids
    finally:
        s.stop()


async def exits(args: list[str], log: Path) -> tuple[int, list[str]]:
    """Run `gavel ARGS` until it exits by itself; its status and its ERROR lines."""
    proc = gavel_process(args, log)
    try:
        code = await asyncio.to_thread(proc.wait, 60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"gavel {args[0]} did not give up: {log.read_text()[-2000:]}") \
            from None
    text = log.read_text()
    assert "Traceback" not in text, text
    return code, [line for line in text.splitlines() if " ERROR " in line]


async def test_a_worker_with_a_refused_credential_gives_up(
        server: tuple[NatsServer, identity.Identities], tmp_path: Path) -> None:
    s, _ = server
    stranger = identity.init(tmp_path / "elsewhere", ["node-a"]).nodes["node-a"]
    code, errors = await exits(["worker", "--node-id", "node-a", "--nats", s.url, "--creds",
                                str(stranger), "--state", str(tmp_path / "w")],
                               tmp_path / "worker.log")
    assert code == 1
    assert errors[-1].endswith(f"NATS at {s.url} refused the credentials in {stranger} 5 "
                               "times in a row; stopping")
    assert len(errors) == 2  # the first refusal ("retrying"), and giving up


async def test_a_worker_with_another_nodes_credential_stops_at_once(
        server: tuple[NatsServer, identity.Identities], tmp_path: Path) -> None:
    s, ids = server
    code, errors = await exits(["worker", "--node-id", "node-a", "--nats", s.url, "--creds",
                                str(ids.nodes["node-b"]), "--state", str(tmp_path / "w")],
                               tmp_path / "worker.log")
    assert code == 1 and len(errors) == 1
    assert f"the credentials in {ids.nodes['node-b']} are not node node-a's: NATS refused " \
        in errors[0]


async def test_a_broker_with_a_refused_or_foreign_credential_gives_up(
        server: tuple[NatsServer, identity.Identities], tmp_path: Path) -> None:
    s, ids = server
    stranger = identity.init(tmp_path / "elsewhere", []).broker
    code, errors = await exits(["broker", "--state", str(tmp_path / "b1"), "--nats", s.url,
                                "--creds", str(stranger)], tmp_path / "broker1.log")
    assert code == 1 and errors[-1].endswith("5 times in a row; stopping")
    code, errors = await exits(["broker", "--state", str(tmp_path / "b2"), "--nats", s.url,
                                "--creds", str(ids.operator)], tmp_path / "broker2.log")
    assert code == 1 and len(errors) == 1
    assert f"the credentials in {ids.operator} are not the broker's" in errors[0]
    # It stops where it stands (`broker.service` rule 10): the rest of its start, each
    # JetStream request waiting out its timeout on an inbox NATS refuses, is not waited for.
    log = (tmp_path / "broker2.log").read_text()
    assert "broker up" not in log and "JetStream cannot make" not in log, log


async def test_an_ha_broker_with_a_foreign_credential_stops_as_it_starts(
        server: tuple[NatsServer, identity.Identities], tmp_path: Path) -> None:
    """The same for one of several brokers: told to stop while it opens its lease (a
    JetStream bucket, asked through an inbox NATS refuses it), it stops there."""
    s, ids = server
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    code, errors = await exits(["broker", "--ha", "--ha-replicas", "1", "--push", str(remote),
                                "--state", str(tmp_path / "b"), "--nats", s.url,
                                "--creds", str(ids.operator)], tmp_path / "ha.log")
    assert code == 1 and len(errors) == 1, errors
    assert f"the credentials in {ids.operator} are not the broker's" in errors[0]
    log = (tmp_path / "ha.log").read_text()
    assert "stands by" not in log, log


async def test_a_gateway_with_a_refused_or_foreign_credential_gives_up(
        server: tuple[NatsServer, identity.Identities], tmp_path: Path) -> None:
    """The gateway too (`cli.daemons` rule 5): nats-py's first connect retried a refused
    credential for ever, a warning twice a second, deaf to SIGTERM."""
    s, ids = server
    stranger = identity.init(tmp_path / "elsewhere", []).operator
    admin = f"unix://{tmp_path / 'caddy.sock'}"  # no Caddy: the gateway stops before it
    code, errors = await exits(["gateway", "--nats", s.url, "--creds", str(stranger),
                                "--admin", admin, "--trust-advertised-addresses"],
                               tmp_path / "gateway1.log")
    assert code == 1
    assert errors[-1].endswith(f"NATS at {s.url} refused the credentials in {stranger} 5 "
                               "times in a row; stopping"), errors
    assert len(errors) == 2, errors  # the first refusal ("retrying"), and giving up
    code, errors = await exits(["gateway", "--nats", s.url, "--creds",
                                str(ids.nodes["node-a"]), "--admin", admin,
                                "--trust-advertised-addresses"], tmp_path / "gateway2.log")
    assert code == 1 and len(errors) == 1, errors
    assert f"the credentials in {ids.nodes['node-a']} are not the gateway's" in errors[0]
