"""One outcome per submission, end to end: a key survives a real broker restart, the CLI
asks again with its key when the broker's answer is late (and submits once), and a damaged
state repository stops `gavel broker` with one sentence, never a traceback."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gavel.broker.ledger.repository import Change, Ledger
from gavel.cli import commands
from gavel.shared import subjects
from gavel.shared.api import SubmitReply, SubmitRequest
from gavel.shared.messages import Spec
from gavel.shared.records import InstanceRecord
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


# -- a damaged state repository ----------------------------------------------------------

def _history(state: Path) -> Path:
    """A state repository with a few commits: packs (big commits) and loose objects."""
    ledger = Ledger(state / "state.git")
    spec = Spec(name="s", command=["true"])
    for k in range(3):
        change = Change(instances={f"i{k}-{j}": InstanceRecord(instance_id=f"i{k}-{j}",
                                                               spec=spec) for j in range(40)})
        ledger.apply(change, f"submit batch {k}\n", ledger.state().head)
    ledger.apply(Change(instances={"one": InstanceRecord(instance_id="one", spec=spec)}),
                 "submit one\n", ledger.state().head)
    return state / "state.git"


def _damage(repo: Path, how: str) -> None:
    pack_dir = repo / "objects" / "pack"
    oldest = min(pack_dir.glob("*.pack"), key=lambda p: p.stat().st_mtime_ns)
    if how == "deleted pack":
        oldest.unlink()
        return
    if how == "truncated pack":
        data = oldest.read_bytes()
        os.chmod(oldest, 0o644)
        oldest.write_bytes(data[:len(data) // 2])
        return
    loose = sorted(p for p in (repo / "objects").glob("??/*"))
    assert loose, "no loose object to damage"
    if how == "deleted loose object":
        loose[0].unlink()
    else:
        os.chmod(loose[0], 0o644)
        loose[0].write_bytes(b"not zlib")


@pytest.mark.parametrize("how", ["deleted pack", "truncated pack", "deleted loose object",
                                 "corrupt loose object"])
def test_a_damaged_state_repository_stops_the_broker_with_one_sentence(
        tmp_path: Path, nats_url: str, how: str) -> None:
    state = tmp_path / "state"
    repo = _history(state)
    _damage(repo, how)
    proc = subprocess.run(
        [sys.executable, "-m", "gavel", "broker", "--state", str(state), "--nats", nats_url],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "GAVEL_LOG_LEVEL": "WARNING"})
    assert proc.returncode != 0, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    (line,) = lines
    assert line.startswith("gavel broker: object ")
    assert re.search(r"object [0-9a-f]{40} in the state repository", line), line
    assert str(repo) in line
    assert "restore state.git from the push remote, or run `git fsck" in line


async def test_a_running_broker_that_finds_its_repository_damaged_stops(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    """Someone moves the branch to a commit whose blob is not there: the broker's next read
    finds it, logs the sentence and stops - it does not serve a state it cannot read."""
    import pygit2

    from gavel.broker.ledger.repository import Damaged
    from gavel.shared.records import instance_path
    from tests.integration.harness import wait_for

    broker = await cluster.start_broker()
    await cluster.submit(sleeper_spec("before"), "before-1")
    repo = pygit2.Repository(str(cluster.state / "state.git"))
    rec = InstanceRecord(instance_id="gone-1", spec=sleeper_spec("gone"))
    sig = pygit2.Signature("someone", "someone@example.com")
    with caplog.at_level("ERROR", logger="gavel.broker"):
        for _ in range(100):  # as someone would: again while the broker holds the branch
            blob = repo.create_blob(msgspec.json.encode(rec))
            head = repo.references["refs/heads/main"].target
            index = pygit2.Index()
            index.read_tree(repo[head].peel(pygit2.Tree))
            index.add(pygit2.IndexEntry(instance_path("gone-1"), blob,
                                        pygit2.enums.FileMode.BLOB))
            commit = repo.create_commit(None, sig, sig, "by hand\n", index.write_tree(repo),
                                        [head])
            (cluster.state / "state.git" / "objects" / str(blob)[:2] / str(blob)[2:]).unlink()
            try:
                repo.references["refs/heads/main"].set_target(commit)
                break
            except (OSError, pygit2.GitError):
                await asyncio.sleep(0.05)
        await wait_for(lambda: broker.fatal is not None, 15, what="the broker stopped")
    assert isinstance(broker.fatal, Damaged)
    assert f"object {blob} in the state repository" in str(broker.fatal)
    assert any("the broker stops" in r.getMessage() and str(blob) in r.getMessage()
               for r in caplog.records)
    assert broker._stopped.is_set()
