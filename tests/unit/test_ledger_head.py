"""The head is trusted for a few milliseconds between looks at the ref's files - never
across our own commit, and never longer than that window after someone else's."""

from __future__ import annotations

import time
from pathlib import Path

import pygit2

from broker import ledger as ledger_mod
from broker.ledger import Ledger, encode
from shared.records import NodeFile


def test_our_commit_is_seen_at_once_and_theirs_within_the_window(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "state.git")
    files = {"nodes/a/node.json": encode(NodeFile(node_id="a"))}
    first = ledger.write_files(files, "one", None)
    assert ledger.head() == first
    second = ledger.write_files({"nodes/b/node.json": encode(NodeFile(node_id="b"))},
                                "two", first)
    assert ledger.head() == second  # at once, though the last look was microseconds ago
    # Someone else moves the branch.
    repo = pygit2.Repository(str(tmp_path / "state.git"))
    sig = pygit2.Signature("else", "e@example.com")
    tree = repo[second].peel(pygit2.Tree).id
    theirs = str(repo.create_commit("refs/heads/main", sig, sig, "theirs", tree,
                                    [pygit2.Oid(hex=second)]))
    time.sleep(ledger_mod._HEAD_FRESH_S * 2)
    assert ledger.head() == theirs
    assert ledger.state().head == theirs
