"""One outcome per submission, end to end: a key survives a real broker restart, and the
CLI asks again with its key when the broker's answer is late (and submits once)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gavel.broker.ledger.repository import Ledger
from gavel.cli import commands
from gavel.shared import subjects
from gavel.shared.api import SubmitReply, SubmitRequest
from gavel.transport import wire
from tests.integration.harness import Cluster, sleeper_spec

pytestmark = pytest.mark.integration
KEY = "6b1c7e0a93f54d2c8a1f0e9d7c6b5a43"


def keyed(cluster: Cluster, key: str) -> list[str]:
    st = Ledger(cluster.state / "state.git").state()
    return sorted(i for i, rec in st.instances.items() if rec.key == key)


async def test_a_retried_key_gets_the_first_ids_across_a_broker_restart(
        cluster: Cluster) -> None:
    await cluster.start_broker()
    req = SubmitRequest(spec=sleeper_spec("keyed"), count=3, key=KEY)
    first = await cluster.call("submit", req, SubmitReply)
    assert len(first.instance_ids) == 3
    await cluster.stop_broker()
    await cluster.start_broker()  # a new broker process state: only git remembers
    again = await cluster.call("submit", req, SubmitReply)
    assert again == first
    assert keyed(cluster, KEY) == sorted(first.instance_ids)


async def test_the_cli_asks_again_with_its_key_when_the_answer_is_late_and_submits_once(
        cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    broker = await cluster.start_broker(writer="thread")
    write = broker.ledger.write_files
    slow = {"first": True}

    def late(*args: Any) -> str:  # on the writer thread: the first commit takes a while
        if slow.pop("first", False):
            time.sleep(1.5)
        return write(*args)

    monkeypatch.setattr(broker.ledger, "write_files", late)
    monkeypatch.setattr(commands, "SUBMIT_TRY_S", 1.0)
    monkeypatch.setattr(commands, "SUBMIT_TRIES", 20)
    keys: list[str] = []
    nc = await cluster.client()

    async def heard(msg: Any) -> None:
        keys.append(msgspec.msgpack.decode(msg.data, type=SubmitRequest).key)

    await nc.subscribe(subjects.API.format(verb="submit"), cb=heard)
    await wire.subscribed(nc)
    spec = tmp_path / "late.toml"
    spec.write_text('name = "late"\ncommand = ["sleep", "60"]\n')
    args = argparse.Namespace(command="submit", spec=spec, id="", key="", wait=False,
                              json=False, nats=cluster.url, creds=None, timeout=1.0)
    assert await commands.submit(args) == 0
    printed = capsys.readouterr()
    iid = printed.out.strip()
    assert len(keys) >= 2 and len(set(keys)) == 1 and keys[0], keys  # asked again, one key
    assert "asking again with the same key" in printed.err
    assert keyed(cluster, keys[0]) == [iid]  # one submission
    assert len(Ledger(cluster.state / "state.git").state().instances) == 1
