"""A client through a failover: while no broker leads, a request finds no responders at once;
`gavel submit` asks again with its key until one leads, and the submission lands once.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest

from gavel.broker.ledger.repository import Ledger
from gavel.cli import commands
from gavel.shared.timing import Timing
from gavel.transport import client
from tests.integration.harness import Cluster

pytestmark = pytest.mark.integration


async def test_submit_asks_again_while_no_broker_leads_and_lands_once(
        cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(commands, "SUBMIT_PAUSE_S", 0.2)
    # submit's own asking again is tested, not call's
    monkeypatch.setattr(client, "_TIMING", Timing(interest_s=0.1))
    spec = tmp_path / "job.toml"
    spec.write_text('name = "job"\ncommand = ["sleep", "60"]\n')
    args = argparse.Namespace(command="submit", spec=spec, id="", key="failover-key-1",
                              wait=False, json=False, nats=cluster.url, creds=None,
                              timeout=1.0)
    submitting = asyncio.create_task(commands.submit(args))  # nobody leads yet
    await asyncio.sleep(1.0)
    assert not submitting.done()
    await cluster.start_broker()  # a leader at last
    assert await asyncio.wait_for(submitting, 60) == 0
    printed = capsys.readouterr()
    assert "no broker is answering" in printed.err and "asking again" in printed.err
    records = Ledger(cluster.state / "state.git").state().instances
    assert [r.key for r in records.values()] == ["failover-key-1"]
    assert printed.out.strip() in records


async def test_without_a_broker_submit_names_its_key_to_ask_again_with(
        cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands, "SUBMIT_PAUSE_S", 0.1)
    monkeypatch.setattr(commands, "SUBMIT_TRY_S", 0.5)
    spec = tmp_path / "job.toml"
    spec.write_text('name = "job"\ncommand = ["sleep", "60"]\n')
    args = argparse.Namespace(command="submit", spec=spec, id="", key="lonely-key-1",
                              wait=False, json=False, nats=cluster.url, creds=None,
                              timeout=1.0)
    with pytest.raises(commands.ClientError, match="--key lonely-key-1"):
        await commands.submit(args)
