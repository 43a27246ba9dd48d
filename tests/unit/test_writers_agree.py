"""The ledger's own object writing and libgit2's (`Ledger` rule 9, `cascommit` rule 5) make
the same trees and the same commits for the same changes, on a thread and in the writer
process alike: the alternative `bench.complexity` measures the pack writer against is the
same ledger, only slower."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from unittest import mock

import pygit2
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gavel.broker.ledger import cascommit
from gavel.broker.ledger.committer import Committer, Item, Planned
from gavel.broker.ledger.plan import View, submit
from gavel.broker.ledger.repository import Ledger
from gavel.shared.messages import Spec
from gavel.shared.records import InstanceRecord
from tests.unit.commitkit import Then, heard

#: Names that sort differently as files and as directories, nested, and a file that turns
#: into a directory ("a" and "a/x" are never in one step).
_PATHS = ["a", "a/x", "a-", "a.b", "a0/y", "d/f/x", "d/a", "nodes/n1/node.json",
          "nodes/n2/node.json"]
_CHANGE = st.one_of(st.none(), st.sampled_from([b"x", b"y", b'{"z": 1}\n']))
_STEP = st.dictionaries(st.sampled_from(_PATHS), _CHANGE, max_size=5).filter(
    lambda step: not ("a" in step and "a/x" in step))


def _tree(ledger: Ledger, sha: str) -> pygit2.Oid:
    return ledger.repo[sha].peel(pygit2.Tree).id


@settings(max_examples=40)
@given(st.lists(_STEP, min_size=1, max_size=6))
@example([{"a": b"x", "a-": b"y"}, {"a/x": b"x"}, {"a/x": None}, {"a": b"y", "a-": None}])
def test_both_writers_make_the_same_trees_and_commits(steps: list[dict[str, bytes | None]]
                                                      ) -> None:
    # One stamp for both (and an offset west of UTC): the commits must then be identical.
    stamp = b"gavel-broker <broker@gavel.local> 1764467000 -0230"
    with tempfile.TemporaryDirectory() as d, \
            mock.patch.object(cascommit, "person", lambda now=None: stamp):
        ours = Ledger(Path(d) / "packs.git")
        theirs = Ledger(Path(d) / "libgit2.git", objects="libgit2")
        for k, step in enumerate(steps):
            a = ours.write_files(step, f"step {k}\n", ours.head())
            b = theirs.write_files(step, f"step {k}\n", theirs.head())
            assert _tree(ours, a) == _tree(theirs, b)
            assert a == b
        commit = theirs.repo[theirs.head()]
        assert isinstance(commit, pygit2.Commit)
        assert (commit.author.time, commit.author.offset) == (1764467000, -150)


def test_a_big_commit_is_the_same_tree_packed_or_loose(tmp_path: Path) -> None:
    ours = Ledger(tmp_path / "packs.git")
    theirs = Ledger(tmp_path / "libgit2.git", objects="libgit2")
    first = {f"nodes/n{k}/node.json": b'{"n": %d}\n' % k for k in range(60)}
    second = {**{f"nodes/n{k}/node.json": None for k in range(0, 60, 3)},
              **{f"nodes/n{k}/node.json": b"{}\n" for k in range(1, 60, 3)}}
    for step in (first, second):
        a = ours.write_files(step, "m\n", ours.head())
        b = theirs.write_files(step, "m\n", theirs.head())
        assert _tree(ours, a) == _tree(theirs, b)
    assert list((tmp_path / "packs.git" / "objects" / "pack").glob("*.pack"))
    assert not list((tmp_path / "libgit2.git" / "objects" / "pack").glob("*.pack"))
    assert [e.name for e in theirs.repo[theirs.head()].peel(pygit2.Tree) / "nodes"] == \
        sorted(f"n{k}" for k in range(60) if k % 3)


def test_an_unknown_object_writer_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="objects must be one of"):
        Ledger(tmp_path / "state.git", objects="gitpython")


def _item(name: str, landed: list[str]) -> Item:
    def plan(view: View) -> Planned:
        submit(view, InstanceRecord(instance_id=name, spec=Spec(name="s", command=["true"])))
        return Planned(lines=[f"submit {name}"], effects=[Then(landed.append)])
    return Item(plan=plan, retry=False)


@pytest.mark.parametrize("writer", ["thread", "process"])
@pytest.mark.parametrize("objects", ["packs", "libgit2"])
async def test_the_committer_writes_with_either_writer_and_either_object_writer(
        tmp_path: Path, writer: str, objects: str) -> None:
    """The writer process and the in-process (thread) writer both commit, and the writer
    process writes objects the way its ledger says (a group commit of 40 records is a pack
    with the ledger's own writer, loose objects with libgit2's)."""
    ledger = Ledger(tmp_path / "state.git", objects=objects)
    committer = heard(Committer(ledger, writer=writer))
    task = asyncio.create_task(committer.run())
    landed: list[str] = []
    try:
        for k in range(40):
            committer.submit(_item(f"i{k:02d}", landed))
        await asyncio.sleep(0)
        await asyncio.wait_for(committer.idle.wait(), 60)
    finally:
        task.cancel()
        committer.close()
    assert committer.commits == 1 and landed == [ledger.head()] * 40
    assert set(Ledger(tmp_path / "state.git").state().instances) == \
        {f"i{k:02d}" for k in range(40)}
    packs = list((tmp_path / "state.git" / "objects" / "pack").glob("*.pack"))
    assert bool(packs) == (objects == "packs")
