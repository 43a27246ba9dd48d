"""A commit has one outcome, and every item of it hears that one: a write that fails after
the ref moved has landed (and is reported so); one that fails before never lands - not on
the next commit, not ever - and an item told it failed is never written later.
(`broker.ledger.repository` rule 5, `broker.ledger.committer` rules 4 and 8.)"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pygit2
import pytest

from gavel.broker.ledger import objects, packs, repository
from gavel.broker.ledger.committer import Committer, Item, Planned
from gavel.broker.ledger.plan import View, submit
from gavel.broker.ledger.repository import Change, Ledger
from gavel.shared.messages import Spec
from gavel.shared.reasons import Reason
from gavel.shared.records import InstanceRecord, instance_path
from tests.unit.commitkit import Failed, Then, heard

SPEC = Spec(name="s", command=["true"])
#: Enough records that the commit is written as a pack (and packs are merged after it).
BIG = packs.PACK_MIN


def disk_full(*args: Any, **kw: Any) -> Any:
    raise OSError(errno.ENOSPC, "No space left on device")


def records(prefix: str, n: int) -> dict[str, InstanceRecord | None]:
    return {f"{prefix}-{k}": InstanceRecord(instance_id=f"{prefix}-{k}", spec=SPEC)
            for k in range(n)}


def every_path(ledger: Ledger) -> Iterator[str]:
    """Every file path in every commit of the branch."""
    def walk(tree: pygit2.Tree, prefix: str) -> Iterator[str]:
        for entry in tree:
            obj = ledger.repo[entry.id]
            if isinstance(obj, pygit2.Tree):
                yield from walk(obj, f"{prefix}{entry.name}/")
            else:
                yield f"{prefix}{entry.name}"
    for commit in ledger.history():
        yield from walk(commit.peel(pygit2.Tree), "")


class Heard:
    """What one item was told: that it landed (its effect) and its failure."""

    def __init__(self, name: str, n: int = 1, retry: bool = False) -> None:
        self.name, self.n, self.retry = name, n, retry
        self.landed: list[str] = []
        self.failed: list[Reason] = []

    def item(self) -> Item:
        def plan(view: View) -> Planned:
            for rec in records(self.name, self.n).values():
                assert rec is not None
                submit(view, rec)
            return Planned(lines=[f"submit {self.name}"], effects=[Then(self.landed.append)])
        return Item(plan=plan, retry=self.retry, gave_up=[
            Failed(lambda reason, _detail: self.failed.append(Reason(reason)))])


async def settle(committer: Committer) -> None:
    await asyncio.sleep(0)
    await asyncio.wait_for(committer.idle.wait(), 10)


# -- the ledger: once the ref moved, `write` reports the commit ----------------------------

def test_a_pack_merge_that_fails_after_the_ref_moved_is_no_failure_of_the_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = Ledger(tmp_path / "state.git")
    monkeypatch.setattr(repository, "merge_small_packs", disk_full)
    sha = ledger.apply(Change(instances=records("big", BIG)), "big\n", None)
    assert ledger.head() == sha
    assert set(Ledger(tmp_path / "state.git").state().instances) == set(records("big", BIG))


def test_a_write_that_fails_before_the_ref_moved_leaves_the_branch_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = Ledger(tmp_path / "state.git")
    first = ledger.apply(Change(instances=records("a", 1)), "a\n", None)
    monkeypatch.setattr(objects, "put_file", disk_full)
    monkeypatch.setattr(packs, "put_file", disk_full)
    with pytest.raises(repository.LedgerError, match="No space left"):
        ledger.write(Change(instances=records("lost", 1)), "lost\n", first)
    assert ledger.head() == first and ledger.landed(first, "lost\n") is None


# -- the committer: one outcome per item -------------------------------------------------

async def test_a_commit_whose_write_fails_after_the_ref_moved_is_reported_landed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever fails once the ref has moved (a pack merge on a full disk, a writer that
    dies before it answers), the branch holds the commit: the item hears it landed."""
    ledger = Ledger(tmp_path / "state.git")
    write = ledger.write_files

    def moved_then_failed(*args: Any) -> str:
        write(*args)
        raise repository.LedgerError("[Errno 28] No space left on device")

    monkeypatch.setattr(ledger, "write_files", moved_then_failed)
    committer = heard(Committer(ledger, writer="thread"))
    runner = asyncio.create_task(committer.run())
    submission = Heard("sub", n=BIG)
    try:
        committer.submit(submission.item())
        await settle(committer)
    finally:
        runner.cancel()
        committer.close()
    assert submission.failed == []
    assert submission.landed == [ledger.head()]
    assert set(ledger.state().instances) == set(records("sub", BIG))
    assert committer.commits == 1


async def test_a_real_pack_merge_failing_on_a_full_disk_reports_the_commit_landed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = Ledger(tmp_path / "state.git")
    monkeypatch.setattr(repository, "merge_small_packs", disk_full)
    committer = heard(Committer(ledger, writer="thread"))
    runner = asyncio.create_task(committer.run())
    submission = Heard("sub", n=BIG)
    try:
        committer.submit(submission.item())
        await settle(committer)
    finally:
        runner.cancel()
        committer.close()
    assert submission.failed == [] and submission.landed == [ledger.head()]


async def test_a_commit_that_fails_before_the_ref_moved_never_lands_and_says_so_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk is full: the submission (not retried) hears it failed, and nothing of it is
    ever on the branch - not after space is freed, not after the next commits. Work that is
    retried (the broker's own bookkeeping) hears nothing until it lands."""
    ledger = Ledger(tmp_path / "state.git")
    first = ledger.apply(Change(instances=records("before", 1)), "before\n", None)
    committer = heard(Committer(ledger, writer="thread", retry_s=0.05))
    runner = asyncio.create_task(committer.run())
    submission, bookkeeping = Heard("sub"), Heard("retried", retry=True)
    try:
        monkeypatch.setattr(objects, "put_file", disk_full)
        monkeypatch.setattr(packs, "put_file", disk_full)
        committer.submit(submission.item())
        committer.submit(bookkeeping.item())
        while not submission.failed:
            await asyncio.sleep(0.01)
        assert submission.failed == [Reason.LEDGER_UNWRITABLE]
        assert ledger.head() == first
        monkeypatch.undo()  # space is freed
        later = [Heard(f"later{k}") for k in range(3)]
        for h in later:
            committer.submit(h.item())
            await settle(committer)
        while not bookkeeping.landed:
            await asyncio.sleep(0.01)
        await settle(committer)
    finally:
        runner.cancel()
        committer.close()
    assert bookkeeping.failed == [], "a retried item was told it failed, then written"
    assert submission.landed == [] and submission.failed == [Reason.LEDGER_UNWRITABLE]
    assert all(h.landed and not h.failed for h in later)
    fresh = Ledger(tmp_path / "state.git")
    assert "sub-0" not in fresh.state().instances
    assert instance_path("sub-0") not in set(every_path(fresh))
    assert not any("submit sub" in c.message.split("\n") for c in fresh.history())
    assert "retried-0" in fresh.state().instances
