"""One commit of changed files, landed by moving the branch with compare-and-swap.

Rules:
1. Only pygit2 and the ledger's own object writer, never a `git` subprocess, never a working
   tree: blobs and trees are written straight into the bare repository, touching only the
   paths that changed (`broker.ledger.objects`).
2. The ref is locked with git's own lock file, its target compared with the commit the
   change was planned on, and only then moved. A moved ref raises `Conflict`; the caller
   refreshes and re-plans.
3. Once the ref moved, the commit has landed: what the caller does after (merging packs)
   cannot make it a failure.
4. The broker is the author and the committer (`AUTHOR_EMAIL`), stamped now in the
   machine's time zone: how `landed` knows its own commit among others'.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import pygit2

from gavel.broker.ledger.errors import Conflict
from gavel.broker.ledger.objects import Batch, ObjectStore, Trees, commit_body

__all__ = ["AUTHOR_EMAIL", "commit_files", "person"]

AUTHOR_EMAIL = "broker@gavel.local"
_SIGNATURE = b"gavel-broker <%s>" % AUTHOR_EMAIL.encode()


def person(now: float | None = None) -> bytes:
    """The ledger's author and committer line, stamped now in the machine's time zone (what
    `pygit2.Signature` would write)."""
    secs = int(time.time() if now is None else now)
    off = time.localtime(secs).tm_gmtoff // 60
    sign = "-" if off < 0 else "+"
    return b"%s %d %s%02d%02d" % (_SIGNATURE, secs, sign.encode(), abs(off) // 60, abs(off) % 60)


def commit_files(repo: pygit2.Repository, ref: str, trees: Trees, objects: ObjectStore,
                 files: Mapping[str, bytes | None], message: str, planned_on: str | None
                 ) -> tuple[str, bool]:
    """Commit `files` (None: removed) on top of `planned_on` and move `ref` to it (rule 2):
    the commit's id, and whether its objects went into a new pack."""
    base = repo[planned_on].peel(pygit2.Tree).id.raw if planned_on else None
    nested: dict[str, object] = {}
    for path, data in files.items():
        parts = path.split("/")
        cur = nested
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})  # type: ignore[assignment]
        cur[parts[-1]] = data
    batch = Batch()
    # New blobs and trees are collected in `batch` and stored by `broker.objects`: one
    # pack for a big commit, loose files for a small one - never libgit2's many system
    # calls an object (`broker.objects`).
    tree_id, _ = trees.write(base, nested, batch)
    parents = [bytes.fromhex(planned_on)] if planned_on else []
    # The commit goes into the same pack (libgit2 would write it as a loose object).
    commit_id = pygit2.Oid(raw=batch.commit(commit_body(tree_id, parents, person(),
                                                        message)))
    packed = objects.flush(batch)
    with repo.transaction() as txn:
        txn.lock_ref(ref)
        current = repo.references.get(ref)
        current_sha = str(current.target) if current is not None else None
        if current_sha != planned_on:
            raise Conflict(f"{ref} moved to {current_sha}, planned on {planned_on}")
        txn.set_target(ref, commit_id, message=message.splitlines()[0][:200])
    # The ref has moved: the commit has landed, whatever happens from here (rule 3).
    return str(commit_id), packed
