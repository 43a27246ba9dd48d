"""Packs written by broker.packs are packs git accepts, big commits land as one pack, and
small packs are merged before there are many of them - without a reader losing an object."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pygit2
import pytest

from gavel.broker.ledger import packs
from gavel.broker.ledger.objects import object_id
from gavel.broker.ledger.repository import Ledger, encode
from gavel.shared.records import NodeFile

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "--git-dir", str(repo), *args], capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def node_files(n: int, version: int) -> dict[str, bytes | None]:
    return {f"nodes/n{i:03d}/node.json": encode(NodeFile(node_id=f"n{i:03d}")) +
            b" " * version for i in range(n)}


@needs_git
def test_a_written_pack_is_one_git_reads_and_verifies(tmp_path: Path) -> None:
    repo = pygit2.init_repository(str(tmp_path / "r.git"), bare=True)
    bodies = [b"x" * 5000, b"y", b"", b"z" * 20] + [b"%d" % i for i in range(200)]
    objs = [(object_id(b"blob", b), b"blob", b) for b in bodies]
    idx = packs.write_pack(Path(repo.path) / "objects" / "pack", objs + objs[:3])  # dups once
    assert sorted(packs.object_ids(idx)) == sorted({raw for raw, _, _ in objs})
    fresh = pygit2.Repository(repo.path)
    for raw, _, body in objs:
        blob = fresh[pygit2.Oid(raw=raw)]
        assert isinstance(blob, pygit2.Blob) and blob.data == body
    out = git(tmp_path / "r.git", "verify-pack", "-v", str(idx))
    assert f"non delta: {len(bodies)} objects" in out


@needs_git
def test_a_big_commit_is_one_pack_and_a_small_one_stays_loose(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "state.git")
    pack_dir = tmp_path / "state.git" / "objects" / "pack"
    head = ledger.write_files(node_files(40, 0), "big", None)  # 82 objects: one pack
    assert len(list(pack_dir.glob("pack-*.idx"))) == 1
    loose = [p for p in (tmp_path / "state.git" / "objects").glob("??/*")]
    assert loose == []  # the commit is in the pack too
    head = ledger.write_files({"nodes/n000/node.json": encode(NodeFile(node_id="n000"))},
                              "small", head)
    assert len(list(pack_dir.glob("pack-*.idx"))) == 1
    # Loose: the blob, its three trees (n000/, nodes/, the root) and the commit.
    assert len(list((tmp_path / "state.git" / "objects").glob("??/*"))) == 5
    assert Ledger(tmp_path / "state.git").state().head == head
    git(tmp_path / "state.git", "fsck", "--strict", "--full")


@needs_git
def test_small_packs_are_merged_and_a_stale_reader_still_reads(tmp_path: Path) -> None:
    writer = Ledger(tmp_path / "state.git")
    pack_dir = tmp_path / "state.git" / "objects" / "pack"
    # Someone else's kept pack is never merged or removed.
    other = pygit2.Repository(str(tmp_path / "state.git"))
    kept = packs.write_pack(pack_dir, [(object_id(b"blob", b"theirs"), b"blob", b"theirs")])
    kept.with_suffix(".keep").write_text("")
    head = writer.write_files(node_files(40, 0), "v0", None)
    reader = Ledger(tmp_path / "state.git")
    assert reader.state().head == head  # lists the packs as they are now
    counts = []
    for v in range(1, 17):
        head = writer.write_files(node_files(40, v), f"v{v}", head)
        counts.append(len(list(pack_dir.glob("pack-*.idx"))) - 1)  # ours, not the kept one
    # 17 commits of 81 new objects each (tier 2): never more than a tier's width of packs,
    # never one per commit.
    assert max(counts) <= 2 * (packs.TIER_WIDTH - 1), counts  # a few a tier, two tiers
    assert min(counts[packs.TIER_WIDTH:]) < max(counts)  # merged on the way
    ours = sorted(packs._count(i) for i in pack_dir.glob("pack-*.idx") if i != kept)
    assert packs.merge_split(ours) == 0  # no tier is full
    assert kept.exists() and kept.with_suffix(".pack").exists()
    # The reader's handle predates the merges; it reads the new head all the same.
    st = reader.state()
    assert st.head == head
    assert len(st.nodes) == 40
    assert other[pygit2.Oid(raw=object_id(b"blob", b"theirs"))].read_raw() == b"theirs"
    git(tmp_path / "state.git", "fsck", "--strict", "--full")
    # Every commit is still whole: the first one's files are still there.
    assert len(git(tmp_path / "state.git", "ls-tree", "-r", "HEAD~16").splitlines()) == 40


@pytest.mark.parametrize(("counts", "k"), [
    ([], 0), ([50], 0), ([50] * 7, 0), ([50] * 8, 8), ([5, 9, 50, 60, 70, 80, 90, 100, 110], 0),
    ([1, 2, *[64] * 8, 600], 10),  # a full tier takes every smaller pack along, not bigger
    ([3] * 8 + [10] * 8, 8),  # the smallest full tier first
    ([10, 20, *[600] * 8, 5000], 10),
])
def test_the_merge_split_takes_the_smallest_full_tier(counts: list[int], k: int) -> None:
    assert packs.merge_split(counts) == k


@pytest.mark.parametrize(("n", "size", "copies"), [(2000, 50, 4), (33, 3000, 1.5),
                                                    (400, 500, 2.5)])
def test_steady_commits_copy_each_object_a_logarithmic_number_of_times(
        n: int, size: int, copies: float) -> None:
    """Merging every pack past a count was quadratic; this must stay n log n, with a few
    packs a tier at most."""
    sizes: list[int] = []
    copied = 0
    for _ in range(n):
        sizes.append(size)
        sizes.sort()
        while (k := packs.merge_split(sizes)) >= 2:  # as merge_small_packs cascades
            merged = sum(sizes[:k])
            copied += merged
            sizes = sorted([merged, *sizes[k:]])
        assert len(sizes) <= 30
    assert copied <= n * size * copies, copied / (n * size)


def test_a_read_that_fails_is_retried_once_on_a_fresh_handle(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "state.git")
    handles = [ledger.repo]
    calls = 0

    def flaky() -> str:
        nonlocal calls
        calls += 1
        handles.append(ledger.repo)
        if calls == 1:
            raise pygit2.GitError("failed to open packfile")  # what a merged-away pack gives
        return "read"

    assert ledger._retrying(flaky) == "read"
    assert calls == 2 and handles[2] is not handles[1]  # the second read ran on a new handle

    def broken() -> str:
        raise KeyError("really missing")

    with pytest.raises(KeyError):  # a second failure is real and propagates
        ledger._retrying(broken)


@needs_git
def test_merging_a_git_made_pack_with_deltas_inflates_them(tmp_path: Path) -> None:
    repo_dir = tmp_path / "state.git"
    ledger = Ledger(repo_dir)
    head = None
    for v in range(12):  # small commits of near-identical files: loose, delta-friendly
        head = ledger.write_files({"nodes/a/node.json": encode(NodeFile(node_id="a")) +
                                   b" " * v * 50}, f"v{v}", head)
    git(repo_dir, "-c", "pack.writeReverseIndex=false", "repack", "-a", "-d", "-f",
        "--no-write-bitmap-index", "--window=50")
    pack_dir = repo_dir / "objects" / "pack"
    assert "chain length" in git(repo_dir, "verify-pack", "-v",
                                 str(next(pack_dir.glob("pack-*.idx"))))  # it has deltas
    (git_made,) = pack_dir.glob("pack-*.idx")
    size = packs._count(git_made)
    for p in range(packs.TIER_WIDTH - 1):  # packs of its size fill its tier: all must merge
        bodies = [b"filler %d %d" % (p, i) for i in range(size)]
        packs.write_pack(pack_dir, [(object_id(b"blob", b), b"blob", b) for b in bodies])
    assert packs.merge_small_packs(pack_dir, ledger._raw_object) == packs.TIER_WIDTH
    (merged,) = pack_dir.glob("pack-*.idx")
    assert "chain length" not in git(repo_dir, "verify-pack", "-v", str(merged))
    git(repo_dir, "fsck", "--strict", "--full")
    fresh = Ledger(repo_dir)
    assert fresh.state().head == head
    assert len(git(repo_dir, "rev-list", "--all").split()) == 12
