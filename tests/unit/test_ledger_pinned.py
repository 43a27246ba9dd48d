"""The ledger's own pinned-ref guard (broker/ledger/repository.py rule 3), on its own: with a
tag or a commit id as the active ref, `write_files` and `apply` raise `Pinned` and the
repository is byte for byte what it was - refs, packed refs, objects, every file. The API
and the auctioneer refuse earlier; this is the guard under them, for any other caller."""

from __future__ import annotations

from pathlib import Path

import pygit2
import pytest

from gavel.broker.ledger.repository import Change, Ledger, Pinned
from gavel.shared.messages import Spec
from gavel.shared.records import InstanceRecord, instance_path

SPEC = Spec(name="web", command=["true"])


def _files(repo: Path) -> dict[str, bytes]:
    """Every file of the bare repository, with its bytes."""
    return {str(p.relative_to(repo)): p.read_bytes()
            for p in sorted(repo.rglob("*")) if p.is_file()}


def _refs(repo: pygit2.Repository) -> dict[str, str]:
    return {name: str(repo.references[name].target) for name in repo.references}


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str]:
    """A state repository with one commit on main, a lightweight tag `v1` and an annotated
    tag `v2` on it."""
    path = tmp_path / "state.git"
    ledger = Ledger(path)
    rec = InstanceRecord(instance_id="web-1", spec=SPEC)
    head = ledger.apply(Change(instances={"web-1": rec}), "submit web-1", None)
    ledger.repo.references.create("refs/tags/v1", pygit2.Oid(hex=head))
    sig = pygit2.Signature("someone", "someone@example.com")
    ledger.repo.create_tag("v2", pygit2.Oid(hex=head), pygit2.enums.ObjectType.COMMIT, sig,
                           "release v2\n")
    return path, head


@pytest.mark.parametrize("ref", ["v1", "refs/tags/v1", "v2", "full sha", "short sha"])
def test_a_pinned_ref_writes_nothing_at_all(repo: tuple[Path, str], ref: str) -> None:
    path, head = repo
    active = {"full sha": head, "short sha": head[:12]}.get(ref, ref)
    ledger = Ledger(path, ref=active)
    assert ledger.pinned
    assert ledger.head() == head  # it reads the pinned commit ...
    assert ledger.state().instances["web-1"].spec == SPEC
    before, refs = _files(path), _refs(ledger.repo)
    rec = InstanceRecord(instance_id="web-2", spec=SPEC)
    # ... and writes nothing, by either door
    with pytest.raises(Pinned, match="is pinned"):
        ledger.write_files({instance_path("web-2"): b"{}"}, "submit web-2", head)
    with pytest.raises(Pinned, match="is pinned"):
        ledger.write_files({instance_path("web-2"): None}, "forget web-2", head,
                           compact={instance_path("web-3"): b"{}"})
    with pytest.raises(Pinned, match="is pinned"):
        ledger.apply(Change(instances={"web-2": rec}), "submit web-2", head)
    with pytest.raises(Pinned, match="is pinned"):
        ledger.apply(Change(instances={"web-2": rec}), "submit web-2", None)
    fresh = pygit2.Repository(str(path))
    assert _refs(fresh) == refs
    assert _files(path) == before, "a pinned ledger wrote into the repository"
    assert ledger.head() == head and "web-2" not in ledger.state().instances


def test_a_branch_on_the_same_repository_still_writes(repo: tuple[Path, str]) -> None:
    """The guard is the ref's kind, not the repository: main takes the same change."""
    path, head = repo
    ledger = Ledger(path)
    assert not ledger.pinned
    rec = InstanceRecord(instance_id="web-2", spec=SPEC)
    sha = ledger.apply(Change(instances={"web-2": rec}), "submit web-2", head)
    assert ledger.head() == sha != head
    assert str(ledger.repo.references["refs/tags/v1"].target) == head
