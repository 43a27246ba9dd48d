"""HEAD of the state repository, and of a `--push` remote on this machine, names the active
branch: plain `git log` (the real git, as an operator types it) shows the history, whatever
`--ref` is and whatever default branch `git init --bare` gave the remote."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gavel.broker.ledger.remote import Pusher
from gavel.broker.ledger.repository import Change, Ledger
from gavel.shared.messages import Spec
from gavel.shared.records import InstanceRecord

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")]


def git_log(repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "--git-dir", str(repo), "log", "--format=%s"],
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("ref", ["refs/heads/main", "refs/heads/prod", "staging"])
def test_git_log_shows_the_history_here_and_on_the_remote(tmp_path: Path, ref: str) -> None:
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "--quiet", "--bare", "--initial-branch=master", str(remote)],
                   check=True, timeout=30)
    ledger = Ledger(tmp_path / "state.git", ref)
    rec = InstanceRecord(instance_id="i1", spec=Spec(name="i1", command=["true"]))
    ledger.apply(Change(instances={"i1": rec}), "submit i1\n", ledger.state().head)
    assert Pusher(ledger.path, ledger.ref, str(remote)).sync() is not None
    for repo in (ledger.path, remote):
        got = git_log(repo)
        assert got.returncode == 0, got.stderr
        assert got.stdout.splitlines() == ["submit i1"]
    # A broker started again on the repository (HEAD already right) changes nothing.
    assert Ledger(tmp_path / "state.git", ref).repo.references["HEAD"].target == ledger.ref


def test_a_head_on_an_existing_branch_is_left_alone(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "state.git", "refs/heads/main")
    rec = InstanceRecord(instance_id="i1", spec=Spec(name="i1", command=["true"]))
    ledger.apply(Change(instances={"i1": rec}), "submit i1\n", ledger.state().head)
    other = Ledger(tmp_path / "state.git", "refs/heads/prod")
    assert other.repo.references["HEAD"].target == "refs/heads/main"
