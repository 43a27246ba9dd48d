"""broker.objects writes what git would: the same ids as libgit2 for the same content, trees
in git's order, and a repository `git fsck --strict` finds clean after the ledger's commits."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pygit2
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gavel.broker.ledger import cascommit
from gavel.broker.ledger.objects import (
    BLOB,
    TREE,
    Batch,
    ObjectStore,
    Trees,
    commit_body,
    object_id,
    tree_body,
)
from gavel.broker.ledger.repository import Ledger


@pytest.fixture
def repo(tmp_path: Path) -> pygit2.Repository:
    return pygit2.init_repository(str(tmp_path / "r.git"), bare=True)


def test_blob_and_tree_ids_match_libgit2(repo: pygit2.Repository) -> None:
    w = ObjectStore(Path(repo.path) / "objects")
    a = w.write(b"blob", b'{"node_id": "a"}\n')
    assert pygit2.Oid(raw=a) == repo.create_blob(b'{"node_id": "a"}\n')
    sub = w.write(b"tree", tree_body({b"node.json": (BLOB, a)}))
    # Names that sort differently as files and as directories ("a" vs "a.b" vs "a-").
    entries = {b"a.b": (BLOB, a), b"a": (TREE, sub), b"a-": (BLOB, a), b"Z": (BLOB, a),
               b"a0": (TREE, sub)}
    ours = w.write(b"tree", tree_body(entries))
    tb = repo.TreeBuilder()
    for name, (mode, raw) in entries.items():
        tb.insert(name.decode(), pygit2.Oid(raw=raw),
                  pygit2.enums.FileMode.TREE if mode == TREE else pygit2.enums.FileMode.BLOB)
    assert pygit2.Oid(raw=ours) == tb.write()
    # libgit2 reads what we wrote.
    tree = repo[pygit2.Oid(raw=ours)]
    assert isinstance(tree, pygit2.Tree)
    assert [e.name for e in tree] == ["Z", "a-", "a.b", "a", "a0"]
    # Listings of only directories or only files (sorted without a key function) too.
    for mode in (TREE, BLOB):
        same = {n: (mode, sub if mode == TREE else a) for n in (b"a.b", b"a", b"a-", b"a0")}
        tb = repo.TreeBuilder()
        for name, (m, raw) in same.items():
            tb.insert(name.decode(), pygit2.Oid(raw=raw), pygit2.enums.FileMode.TREE
                      if m == TREE else pygit2.enums.FileMode.BLOB)
        assert pygit2.Oid(raw=w.write(b"tree", tree_body(same))) == tb.write()
    # Writing the same object twice is harmless (same name, same bytes).
    assert w.write(b"blob", b'{"node_id": "a"}\n') == a


@pytest.mark.parametrize("message", ["one line", "place a on n1\n\nGavel-Auction: x\n", "ünï"])
def test_commit_ids_match_libgit2(repo: pygit2.Repository, message: str) -> None:
    """The ledger writes its commits itself (into the commit's pack): byte for byte what
    libgit2's create_commit writes, with and without a parent."""
    tree = repo.TreeBuilder().write()
    sig = pygit2.Signature("gavel-broker", "broker@gavel.local", 1764467000, 60)
    first = repo.create_commit(None, sig, sig, message, tree, [])
    second = repo.create_commit(None, sig, sig, message, tree, [first])
    person = b"gavel-broker <broker@gavel.local> 1764467000 +0100"
    assert pygit2.Oid(raw=object_id(b"commit", commit_body(tree.raw, [], person, message))) \
        == first
    assert pygit2.Oid(raw=object_id(b"commit", commit_body(tree.raw, [first.raw], person,
                                                           message))) == second
    # The ledger's own line: name, email, the second and the machine's offset, as git reads it.
    line = cascommit.person(1764467000.7)
    assert line.startswith(b"gavel-broker <broker@gavel.local> 1764467000 ")
    Batch().commit(commit_body(tree.raw, [], line, message))  # the batch takes a commit too


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command for fsck")
def test_ledger_commits_pass_git_fsck_and_keep_foreign_entries(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "state.git")
    head = ledger.write_files({"nodes/a/node.json": b"1\n", "nodes/b/node.json": b"2\n",
                               "instances/i-1.json": b"{}\n"}, "one", None)
    # Someone else adds an executable and a nested directory beside ours.
    repo = ledger.repo
    base = repo[head].peel(pygit2.Tree)
    tb = repo.TreeBuilder(base)
    tb.insert("tool.sh", repo.create_blob(b"#!/bin/sh\n"), pygit2.enums.FileMode.BLOB_EXECUTABLE)
    sig = pygit2.Signature("someone", "s@example.com")
    head = theirs = str(repo.create_commit("refs/heads/main", sig, sig, "theirs", tb.write(),
                                           [pygit2.Oid(hex=head)]))
    head = ledger.write_files({"nodes/a/node.json": b"1b\n", "nodes/b/node.json": None,
                               "nodes/c/node.json": b"3\n", "instances/i-1.json": None},
                              "two", head)
    tree = repo[head].peel(pygit2.Tree)
    assert sorted(str(e.name) for e in tree) == ["nodes", "tool.sh"]  # instances/ emptied away
    assert tree["tool.sh"].filemode == pygit2.enums.FileMode.BLOB_EXECUTABLE
    nodes = repo[tree["nodes"].id]
    assert isinstance(nodes, pygit2.Tree)
    assert sorted(str(e.name) for e in nodes) == ["a", "c"]
    assert repo[tree["nodes/a/node.json"].id].read_raw() == b"1b\n"
    commit = repo[head]
    assert isinstance(commit, pygit2.Commit)
    assert (commit.author.name, commit.committer.email) == ("gavel-broker", "broker@gavel.local")
    assert commit.message == "two" and [str(p) for p in commit.parent_ids] == [theirs]
    fsck = subprocess.run(["git", "--git-dir", str(ledger.path), "fsck", "--strict", "--full"],
                          capture_output=True, text=True, check=False)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    assert "error" not in fsck.stderr.lower()
    assert "dangling" not in fsck.stdout + fsck.stderr  # an emptied directory is not stored


def test_trees_written_are_not_read_back(repo: pygit2.Repository) -> None:
    reads: list[bytes] = []

    def read(raw: bytes) -> dict[bytes, tuple[bytes, bytes]] | None:
        reads.append(raw)
        obj = repo[pygit2.Oid(raw=raw)]
        if not isinstance(obj, pygit2.Tree):
            return None
        return {e.raw_name or b"": (b"%o" % e.filemode, e.id.raw) for e in obj}

    trees = Trees(read)
    batch = Batch()
    root, n = trees.write(None, {"nodes": {"a": {"node.json": b"1"}, "b": {"node.json": b"2"}}},
                          batch)
    assert n == 1 and reads == []
    root2, _ = trees.write(root, {"nodes": {"a": {"node.json": b"1b"}}}, batch)
    assert reads == []  # the base and its nodes/ and nodes/a were all remembered
    ObjectStore(Path(repo.path) / "objects").flush(batch)
    fresh = Trees(read)  # another writer: reads what it does not know, once each
    root3, _ = fresh.write(root2, {"nodes": {"b": None}}, Batch())
    assert len(reads) == 2  # the root and nodes/, not the untouched nodes/a
    again = Trees(read)
    assert again.write(root2, {"nodes": {"b": None}}, Batch())[0] == root3


# Names that sort differently as files and as directories, so a name turning from one into
# the other moves in its tree.
_NAMES = ["a", "a.b", "a-", "a0", "Z", "b"]
_changes = st.recursive(
    st.one_of(st.none(), st.sampled_from([b"x", b"y"])),
    lambda inner: st.dictionaries(st.sampled_from(_NAMES), inner, max_size=3),
    max_leaves=8)


def _scratch(files: dict[str, object]) -> bytes | None:
    """The tree id of `files` built from nothing (every tree sorted anew), or None if
    empty: the oracle for the incremental writer."""
    entries: dict[bytes, tuple[bytes, bytes]] = {}
    for name, sub in files.items():
        if isinstance(sub, dict):
            tid = _scratch(sub)
            if tid is not None:
                entries[name.encode()] = (TREE, tid)
        else:
            assert isinstance(sub, bytes)
            entries[name.encode()] = (BLOB, object_id(b"blob", sub))
    if not entries:
        return None
    order = sorted(entries, key=lambda n: n + b"/" if entries[n][0] == TREE else n)
    return object_id(b"tree", b"".join(entries[n][0] + b" " + n + b"\0" + entries[n][1]
                                       for n in order))


def _apply(files: dict[str, object], changes: dict[str, object]) -> None:
    for name, sub in changes.items():
        if isinstance(sub, dict):
            cur = files.get(name)
            nested: dict[str, object] = cur if isinstance(cur, dict) else {}
            _apply(nested, sub)
            if nested:
                files[name] = nested
            else:
                files.pop(name, None)
        elif sub is None:
            files.pop(name, None)
        else:
            files[name] = sub


@given(st.lists(st.dictionaries(st.sampled_from(_NAMES), _changes, max_size=4), max_size=8))
@example([{"a": b"x", "a-": b"y", "a0": b"x"}, {"a": {"b": b"x"}}, {"a": b"y"}])  # file, dir
def test_incremental_trees_equal_trees_built_from_nothing(
        steps: list[dict[str, object]]) -> None:
    """Trees keeps entries in git's order and sorts only when a name is new or changes
    between file and directory; every tree it writes must be the one a full sort gives."""
    trees = Trees(lambda raw: None)  # everything it bases on, it wrote itself
    files: dict[str, object] = {}
    root: bytes | None = None
    for changes in steps:
        root, _ = trees.write(root, changes, Batch())
        _apply(files, changes)
        assert root == (_scratch(files) or object_id(b"tree", b""))
