"""The git ledger: the state repository is the deployment. `Ledger` is the one handle on
it: the active ref and its head, the `State` at the head, and the writes that move it.

Rules (each kept where its concept lives):
1. Only pygit2, never a `git` subprocess, never a working tree (`broker.ledger.cascommit`).
2. The branch moves by compare-and-swap (`broker.ledger.cascommit`): a moved ref raises
   `Conflict`; the caller refreshes and re-plans (plan, then apply).
3. If the active ref is a tag or a commit id the deployment is pinned: `apply` raises
   `Pinned` and writes nothing.
4. The in-memory `State` mirrors the tree at the head (`broker.ledger.reading`); it is
   re-read whenever the ref moved under us (another writer) and updated in place after our
   own commits. A broker's ledger (`settle=True`) holds one placement per instance in what
   it read: the keep rule of `broker.ledger.integrity`, against the State it had (none at
   the first read).
5. A commit's outcome is the ref's: once the ref moved, the commit has landed, and nothing
   after that (merging packs, re-opening the repository) can make `write` report a failure.
   A write that failed in a way that leaves the outcome open (the writer process died, an
   error past the compare-and-swap) is settled by reading the ref (`landed`,
   `broker.ledger.history`).
6. An object the tree or the history needs that is missing or does not read raises
   `Damaged` (`broker.ledger.errors`). Nothing is guessed around it.
7. HEAD names the active branch when it named a branch without commits (`name_head`).
8. At a broker's start a lock on the ref that outlives a short wait is a dead writer's, and
   is removed (`clear_stale_lock`, `broker.ledger.stalelock`).
9. Blobs and trees are written by the ledger itself (`objects`: "packs", `broker.ledger.
   objects`) or, for measuring what that buys, by libgit2 ("libgit2", `cascommit` rule 5).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar

import pygit2

from gavel.broker.ledger.cascommit import commit_files, commit_files_libgit2
from gavel.broker.ledger.errors import Conflict, Damaged, LedgerError, Pinned, damaged
from gavel.broker.ledger.history import auctions, landed_at, walk, winners
from gavel.broker.ledger.integrity import settle as settle_disputes
from gavel.broker.ledger.objects import Entries, ObjectStore, Trees, git_order
from gavel.broker.ledger.packs import merge_small_packs
from gavel.broker.ledger.reading import read_tree, service_problem
from gavel.broker.ledger.stalelock import remove_stale_lock
from gavel.broker.ledger.state import Change, State, compact, encode, parse_stamp, pretty, stamp
from gavel.shared.records import AuctionRecord

# `State`, `Change` and the encodings live in `broker.ledger.state`, the errors in
# `broker.ledger.errors`; they are re-exported here, where most callers met them first.
__all__ = ["Change", "Conflict", "Damaged", "Ledger", "LedgerError", "Pinned", "State",
           "compact", "encode", "name_head", "parse_stamp", "pretty", "service_problem",
           "stamp"]

_SHA = re.compile(r"^[0-9a-f]{7,40}$")
T = TypeVar("T")
#: How long a checked head is trusted without looking at the ref's files again. The broker
#: asks several times per placement; a move by someone else is noticed this much later at
#: most (every write is a compare-and-swap anyway), and our own commits forget the cache.
_HEAD_FRESH_S = 0.005
_KIND_NAMES = {1: b"commit", 2: b"tree", 3: b"blob", 4: b"tag"}
#: Rule 9: who writes blobs and trees.
OBJECT_WRITERS = ("packs", "libgit2")
log = logging.getLogger("gavel.ledger")


def name_head(repo: pygit2.Repository, ref: str) -> None:
    """Rule 7: a HEAD that names a branch with no commits (``git init``'s default, or the
    ``main`` this module creates) is pointed at the active branch `ref`, so plain ``git log``
    shows the deployment's history. A HEAD on a branch that exists is the owner's choice and
    stays; a pinned ref (a tag, a commit) changes nothing."""
    if not ref.startswith("refs/heads/"):
        return
    try:
        head = repo.references.get("HEAD")
        target = head.target if head is not None else None
        if isinstance(target, str) and target != ref and target not in repo.references:
            repo.set_head(ref)
    except (pygit2.GitError, OSError, ValueError) as exc:  # a read-only or odd repository
        log.debug("left HEAD of %s alone: %s", repo.path, exc)


class Ledger:
    def __init__(self, path: Path, ref: str = "refs/heads/main", *, settle: bool = False,
                 objects: str = "packs") -> None:
        if objects not in OBJECT_WRITERS:
            raise ValueError(f"objects must be one of {OBJECT_WRITERS}, not {objects!r}")
        self.path = path
        #: Rule 9.
        self.objects = objects
        #: Hold one placement per instance in what is read (rule 4): the broker's ledger.
        self.settle = settle
        #: Whether the State is the broker's own history yet (it has looked at the ref once).
        self._seen = False
        try:
            if (path / "HEAD").exists():
                self.repo = pygit2.Repository(str(path))
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                self.repo = pygit2.init_repository(str(path), bare=True,
                                                   initial_head="main")
        except (pygit2.GitError, OSError) as exc:
            raise LedgerError(f"cannot open state repository {path}: {exc}") from exc
        self.ref = self._qualify(ref)
        if not _SHA.match(self.ref) and not pygit2.reference_is_valid_name(self.ref):
            raise LedgerError(f"active ref {ref!r} is not a valid git ref name")
        name_head(self.repo, self.ref)
        self._state = State()
        self._lock = threading.RLock()
        self._landed: str | None = None  # our commit, written but not yet adopted
        #: Set while a writer process commits for us: the ref may move under our feet before
        #: `adopt`, and `state()` must keep the cached state until then.
        self.writing = False
        self._head_cache: tuple[tuple[object, ...], str | None] | None = None
        self._head_checked = float("-inf")
        self._stamp_paths = (str(path / self.ref), str(path / "packed-refs"))
        self._objects = ObjectStore(Path(self.repo.path) / "objects")
        self._trees = Trees(self._tree_entries)

    # -- the active ref ------------------------------------------------------------------
    def _qualify(self, ref: str) -> str:
        if ref.startswith("refs/"):
            return ref
        if _SHA.match(ref):
            return ref
        if f"refs/tags/{ref}" in self.repo.references:
            return f"refs/tags/{ref}"
        return f"refs/heads/{ref}"

    @property
    def pinned(self) -> bool:
        return not self.ref.startswith("refs/heads/")

    def _ref_stamp(self) -> tuple[object, ...]:
        """A cheap fingerprint of the files a ref lives in (loose ref and packed-refs)."""
        out: list[object] = []
        for path in self._stamp_paths:
            try:
                st = os.stat(path)
                out.append((st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size))
            except OSError:
                out.append(None)
        return tuple(out)

    def head(self) -> str | None:
        """The commit the active ref points at (peeled), or None for an empty branch.

        Resolving a ref reads files; the answer is reused while the ref's files are
        unchanged (two stats), and for `_HEAD_FRESH_S` without even those, which keeps the
        hot path off the filesystem."""
        if self.ref.startswith("refs/"):
            now = time.monotonic()
            cache = self._head_cache
            if cache is not None and now - self._head_checked < _HEAD_FRESH_S:
                return cache[1]
            stamp = self._ref_stamp()
            self._head_checked = now
            if cache is not None and cache[0] == stamp:
                return cache[1]
            sha = self._resolve()
            self._head_cache = (stamp, sha)
            return sha
        return self._resolve()

    def forget(self) -> None:
        """Read the branch afresh, as at a broker's start: no history to compare with (a
        takeover moved it to the remote's, which the state read before never was)."""
        with self._lock:
            self._state = State()
            self._seen = False
            self._head_cache = None

    def forget_head(self) -> None:
        """Resolve the ref afresh next time (after a conflict: the stat fingerprint of the
        ref file could, in theory, repeat across fast rewrites on a coarse clock)."""
        self._head_cache = None

    def _resolve(self) -> str | None:
        try:
            if not self.ref.startswith("refs/"):
                return str(self.repo.revparse_single(self.ref).peel(pygit2.Commit).id)
            ref = self.repo.references.get(self.ref)
            if ref is None:
                return None
            if self.ref.startswith("refs/heads/"):
                # A branch names its commit: no object read. Peeling read the commit, and
                # each commit the writer makes lives in a new pack - the broker process
                # opened and mapped every one of them, and its memory grew with every commit
                # (docs/performance.md).
                target = ref.resolve().target
                if isinstance(target, pygit2.Oid):
                    return str(target)
            return str(ref.peel(pygit2.Commit).id)
        except (pygit2.GitError, KeyError, ValueError) as exc:
            raise LedgerError(f"cannot resolve {self.ref}: {exc}") from exc

    # -- reading -------------------------------------------------------------------------
    def state(self) -> State:
        """The tree at the head, re-read only when someone else moved the ref.

        Between our own `write` landing and its `adopt`, the ref already points at our
        commit while its side effects (telling the winner, starting its clocks) have not
        run yet: the cached state, one commit behind, is returned until `adopt` folds the
        change in — so nobody acts on a placement the broker has not finished making.

        A head resolved within `_HEAD_FRESH_S` that the state already holds (or our commit
        landing) answers without the lock: what the locked path returns then, read a few
        times a placement (docs/performance.md)."""
        cache = self._head_cache
        if cache is not None and self._seen and not self.writing \
                and time.monotonic() - self._head_checked < _HEAD_FRESH_S:
            st = self._state
            if cache[1] == st.head or cache[1] == self._landed:
                return st
        if self.writing or not self._lock.acquire(blocking=False):
            return self._state  # our write is in flight: never block the event loop on git
        try:
            head = self.head()
            if head != self._state.head and head != self._landed:
                history = self._state if self._seen else None
                try:
                    st = self._retrying(lambda: self._read(head, history))
                except (pygit2.GitError, KeyError) as exc:
                    raise damaged(self.path, exc) from exc
                self._state = st
            self._seen = True
            return self._state
        finally:
            self._lock.release()

    def _read(self, head: str | None, history: State | None = None) -> State:
        st = read_tree(self.repo, head)
        if self.settle:  # rule 4
            settle_disputes(st, history, self._winners)
        return st

    def history(self, limit: int | None = None) -> Iterator[pygit2.Commit]:
        """The branch's commits, newest first (`broker.ledger.history`)."""
        yield from walk(self.repo, self.head(), limit)

    def _winners(self, iids: Iterable[str], limit: int = 10_000) -> dict[str, str]:
        """The winner the newest recorded auction of each instance names (one walk of the
        history for all of them; those without a recorded winner are left out)."""
        return winners(self.history(limit), iids)

    def auctions_for(self, instance_id: str, limit: int = 10_000) -> list[AuctionRecord]:
        """Every recorded auction for the instance, newest first."""
        with self._lock:
            return self._retrying(lambda: auctions(self.history(limit), instance_id))

    def _retrying(self, read: Callable[[], T]) -> T:
        """`read`, once more on a fresh handle if it fails: the writer may have merged away
        a pack this handle still lists (see `broker.packs`). A second failure is real."""
        try:
            return read()
        except (pygit2.GitError, KeyError, OSError):
            self._reopen()
            return read()

    # -- writing -------------------------------------------------------------------------
    def clear_stale_lock(self, wait_s: float) -> Path | None:
        """Rule 8, at a broker's start: remove the ref's lock file if it is still there,
        unchanged, after `wait_s` (the broker's `Timing.stale_lock_s`); the path removed, or
        None."""
        return remove_stale_lock(Path(self.repo.path), self.ref, wait_s)

    def apply(self, change: Change, message: str, planned_on: str | None) -> str:
        """`write`, then `adopt`: the synchronous path for callers on one thread."""
        sha = self.write(change, message, planned_on)
        self.adopt(change, planned_on, sha)
        return sha

    def write(self, change: Change, message: str, planned_on: str | None) -> str:
        """Commit `change` on top of `planned_on` and move the branch by compare-and-swap.

        Safe to call from a worker thread: it only looks up the cached `State`'s hand-made
        flat records (to move those it writes into their shards)."""
        return self.write_files(change.files(self._state.flat), message, planned_on)

    def write_files(self, files: Mapping[str, bytes | None], message: str,
                    planned_on: str | None, compact: Mapping[str, bytes] | None = None
                    ) -> str:
        """`write` for already-encoded files (what a writer process receives); `compact`:
        more files, as compact JSON, written pretty (`Change.files_compact`)."""
        if self.pinned:
            raise Pinned(f"{self.ref} is pinned")
        if compact:
            files = {**files, **{path: pretty(data) for path, data in compact.items()}}
        with self._lock:
            try:
                try:
                    sha = self._commit(files, message, planned_on)
                except KeyError:  # a tree it builds on is in a pack someone else removed
                    self._reopen()  # (git gc): nothing moved yet, so try on a fresh handle
                    sha = self._commit(files, message, planned_on)
            except KeyError as exc:  # the tree it builds on does not read
                raise damaged(self.path, exc) from exc
            except (pygit2.GitError, OSError) as exc:
                raise LedgerError(str(exc)) from exc
            self._landed = sha
            self._head_cache = None
            return sha

    def adopt(self, change: Change, planned_on: str | None, sha: str) -> None:
        """Fold our own landed commit into the cached state (no re-read)."""
        st = self._state
        with self._lock:
            self._landed = None
            self._head_cache = None  # our commit moved the ref: look again
        if st.head != planned_on:
            return  # the cache is stale anyway; the next `state()` re-reads
        st.head = sha
        for iid, rec in change.instances.items():
            st.put_instance(iid, rec)
            st.flat.pop(iid, None)  # `files` moved it into its shard
        for name, svc in change.services.items():
            st.put_service(name, svc)
        for name, job in change.periodic.items():
            st.put_periodic(name, job)
        for nid, nf in change.nodes.items():
            st.put_node(nid, nf, change.committed.get(nid), change.grown.get(nid))
            data = change.encoded_of(nid, nf) if nf is not None else None
            if nf is None or data is None:
                st.encoded.pop(nid, None)
            else:
                st.encoded[nid] = (nf, data)

    def _commit(self, files: Mapping[str, bytes | None], message: str,
                planned_on: str | None) -> str:
        if self.objects == "libgit2":  # rule 9
            return commit_files_libgit2(self.repo, self.ref, files, message, planned_on)
        sha, packed = commit_files(self.repo, self.ref, self._trees, self._objects, files,
                                   message, planned_on)
        # The ref has moved: the commit has landed, whatever happens from here (rule 5).
        if packed:
            self._tidy_packs()
        return sha

    def _tidy_packs(self) -> None:
        """Merge small packs (`broker.packs`): housekeeping after a commit landed, so a
        failure here (a full disk) is logged and left for the next commit to try again."""
        try:
            if merge_small_packs(Path(self.repo.path) / "objects" / "pack", self._raw_object):
                self._reopen()  # our handle still lists the packs just removed
        except (OSError, ValueError, KeyError, pygit2.GitError) as exc:
            log.warning("could not merge the small packs of %s (%s); the commit landed, the "
                        "next one tries again", self.path, exc)
            with contextlib.suppress(OSError, pygit2.GitError):
                self._reopen()  # packs may have gone before the failure

    def landed(self, planned_on: str | None, message: str) -> str | None:
        """After a write whose outcome is open (rule 5): the commit that write made if the
        branch holds it - on top of `planned_on`, with `message`, by the broker, at the head
        or under what others put on top since (a merge of a push) - or None: the ref did not
        move with it, and never will, as the writer is done."""
        self.forget_head()

        def look() -> str | None:
            return landed_at(self.repo, self._resolve(), planned_on, message)

        with self._lock:
            try:
                return self._retrying(look)
            except (pygit2.GitError, KeyError) as exc:
                raise damaged(self.path, exc) from exc

    def _raw_object(self, raw: bytes) -> tuple[bytes, bytes]:
        kind, data = self.repo.odb.read(pygit2.Oid(raw=raw))
        return _KIND_NAMES[int(kind)], data

    def _reopen(self) -> None:
        """A fresh handle on the repository: it lists the packs as they are now."""
        self.repo = pygit2.Repository(str(self.path))

    def _tree_entries(self, raw: bytes) -> Entries | None:
        obj = self.repo[pygit2.Oid(raw=raw)]
        if not isinstance(obj, pygit2.Tree):
            return None
        # In git's order, whoever wrote it: `Trees` keeps that order and sorts only news.
        return git_order({e.raw_name or b"": (b"%o" % e.filemode, e.id.raw) for e in obj})
