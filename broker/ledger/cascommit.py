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
5. `commit_files_libgit2` is the same commit written with libgit2's own object writing
   (`TreeBuilder`, `create_blob`, `create_commit`): the same trees and the same commit for
   the same files, kept as the simplest alternative the hand-written writer is measured
   against (`python -m gavel.bench.complexity`, docs/performance.md).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import pygit2

from gavel.broker.ledger.errors import Conflict
from gavel.broker.ledger.objects import Batch, ObjectStore, Trees, commit_body

__all__ = ["AUTHOR_EMAIL", "commit_files", "commit_files_libgit2", "person"]

AUTHOR_EMAIL = "broker@gavel.local"
_SIGNATURE = b"gavel-broker <%s>" % AUTHOR_EMAIL.encode()


def person(now: float | None = None) -> bytes:
    """The ledger's author and committer line, stamped now in the machine's time zone (what
    `pygit2.Signature` would write)."""
    secs = int(time.time() if now is None else now)
    off = time.localtime(secs).tm_gmtoff // 60
    sign = "-" if off < 0 else "+"
    return b"%s %d %s%02d%02d" % (_SIGNATURE, secs, sign.encode(), abs(off) // 60, abs(off) % 60)


def _nested(files: Mapping[str, bytes | None]) -> dict[str, object]:
    """``{"a/b/c": data}`` as ``{"a": {"b": {"c": data}}}``."""
    nested: dict[str, object] = {}
    for path, data in files.items():
        parts = path.split("/")
        cur = nested
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})  # type: ignore[assignment]
        cur[parts[-1]] = data
    return nested


def _move_ref(repo: pygit2.Repository, ref: str, commit_id: pygit2.Oid,
              planned_on: str | None, message: str) -> None:
    """Rule 2: lock the ref, compare, move."""
    with repo.transaction() as txn:
        txn.lock_ref(ref)
        current = repo.references.get(ref)
        current_sha = str(current.target) if current is not None else None
        if current_sha != planned_on:
            raise Conflict(f"{ref} moved to {current_sha}, planned on {planned_on}")
        txn.set_target(ref, commit_id, message=message.splitlines()[0][:200])


def commit_files(repo: pygit2.Repository, ref: str, trees: Trees, objects: ObjectStore,
                 files: Mapping[str, bytes | None], message: str, planned_on: str | None
                 ) -> tuple[str, bool]:
    """Commit `files` (None: removed) on top of `planned_on` and move `ref` to it (rule 2):
    the commit's id, and whether its objects went into a new pack."""
    base = repo[planned_on].peel(pygit2.Tree).id.raw if planned_on else None
    nested = _nested(files)
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
    _move_ref(repo, ref, commit_id, planned_on, message)
    # The ref has moved: the commit has landed, whatever happens from here (rule 3).
    return str(commit_id), packed


def commit_files_libgit2(repo: pygit2.Repository, ref: str, files: Mapping[str, bytes | None],
                         message: str, planned_on: str | None) -> str:
    """Rule 5: `commit_files` through libgit2's own object writing (every blob and tree a
    loose object); the commit's id."""
    base = repo[planned_on].peel(pygit2.Tree) if planned_on else None
    tree_id, _ = _tree_libgit2(repo, base, _nested(files), top=True)
    secs, off = _stamp(person())
    sig = pygit2.Signature(_SIGNATURE.split(b" <")[0].decode(), AUTHOR_EMAIL, secs, off)
    parents = [pygit2.Oid(hex=planned_on)] if planned_on else []
    commit_id = repo.create_commit(None, sig, sig, message, tree_id, parents)
    _move_ref(repo, ref, commit_id, planned_on, message)
    return str(commit_id)


def _stamp(line: bytes) -> tuple[int, int]:
    """The seconds and the offset in minutes of a `person` line."""
    secs, off = line.rsplit(b" ", 2)[1:]
    minutes = int(off[1:3]) * 60 + int(off[3:5])
    return int(secs), -minutes if off.startswith(b"-") else minutes


def _tree_libgit2(repo: pygit2.Repository, base: pygit2.Tree | None,
                  changes: Mapping[str, object], top: bool) -> tuple[pygit2.Oid, int]:
    """`objects.Trees.write` with libgit2's `TreeBuilder`: the tree `base` with `changes`
    applied, a directory left empty dropped (only an empty root is written)."""
    tb = repo.TreeBuilder(base) if base is not None else repo.TreeBuilder()
    for name, sub in changes.items():
        was = tb.get(name)
        if isinstance(sub, dict):
            sub_base = repo[was.id] if was is not None else None
            tid, count = _tree_libgit2(
                repo, sub_base if isinstance(sub_base, pygit2.Tree) else None, sub, top=False)
            if count == 0:
                if was is not None:
                    tb.remove(name)
            else:
                tb.insert(name, tid, pygit2.enums.FileMode.TREE)
        elif sub is None:
            if was is not None:
                tb.remove(name)
        else:
            assert isinstance(sub, bytes)
            tb.insert(name, repo.create_blob(sub), pygit2.enums.FileMode.BLOB)
    if len(tb) == 0 and not top:
        return pygit2.Oid(raw=b"\0" * 20), 0
    return tb.write(), len(tb)
