"""A pusher killed inside receive-pack leaves the ref's lock in a remote on a local path, and
git refuses every later push to that ref while it stays (`broker.ledger.caspush` rule 4):
the next leader's push removes a lock older than its lease TTL and lands; a younger one -
a live push's - is left alone. Real git, real bare repositories.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pygit2
import pytest

from gavel.broker.ledger.caspush import Refused, push_local

pytestmark = pytest.mark.integration

REF = "refs/heads/main"
_SIG = pygit2.Signature("t", "t@example.com")


def _commit(repo: pygit2.Repository, n: int) -> str:
    tb = repo.TreeBuilder()
    tb.insert("n.txt", repo.create_blob(str(n).encode()), pygit2.enums.FileMode.BLOB)
    ref = repo.references.get(REF)
    parents = [ref.target] if ref is not None else []
    return str(repo.create_commit(REF, _SIG, _SIG, f"commit {n}", tb.write(), parents))


def _repos(tmp_path: Path) -> tuple[pygit2.Repository, Path]:
    remote = tmp_path / "remote.git"
    bare = pygit2.init_repository(str(remote), bare=True, initial_head="main")
    bare.config["receive.denyNonFastForwards"] = True
    local = pygit2.init_repository(str(tmp_path / "local.git"), bare=True, initial_head="main")
    _commit(local, 1)
    push_local(Path(local.path), str(remote), REF)
    return local, remote


def _lock(remote: Path, age_s: float) -> list[Path]:
    """The locks receive-pack holds while it moves the branch, left `age_s` old."""
    locks = [remote / f"{REF}.lock", remote / "HEAD.lock"]
    for lock in locks:
        lock.write_text("0" * 40 + "\n")
        then = time.time() - age_s
        os.utime(lock, (then, then))
    return locks


def _remote_head(remote: Path) -> str:
    return str(pygit2.Repository(str(remote)).references[REF].target)


def test_a_lock_older_than_the_lease_is_a_dead_pushers_and_is_removed(tmp_path: Path) -> None:
    local, remote = _repos(tmp_path)
    head = _commit(local, 2)
    locks = _lock(remote, age_s=3600)
    with pytest.raises(Refused):  # git alone refuses while the lock stays
        push_local(Path(local.path), str(remote), REF)
    push_local(Path(local.path), str(remote), REF, stale_lock_s=10.0)
    assert _remote_head(remote) == head
    assert not any(lock.exists() for lock in locks)


def test_a_young_lock_is_a_live_pushers_and_is_left_alone(tmp_path: Path) -> None:
    local, remote = _repos(tmp_path)
    before = _remote_head(remote)
    _commit(local, 2)
    locks = _lock(remote, age_s=0)
    with pytest.raises(Refused):
        push_local(Path(local.path), str(remote), REF, stale_lock_s=10.0)
    assert _remote_head(remote) == before
    assert all(lock.exists() for lock in locks)
