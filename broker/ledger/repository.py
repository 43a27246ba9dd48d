"""The git ledger: the state repository is the deployment.

Rules:
1. Only pygit2, never a `git` subprocess, never a working tree: blobs and trees are written
   straight into a bare repository, touching only the paths that changed.
2. The branch moves by compare-and-swap: the ref is locked with git's own lock file, its
   target compared with the commit the change was planned on, and only then moved. A moved
   ref raises `Conflict`; the caller refreshes and re-plans (plan, then apply).
3. If the active ref is a tag or a commit id the deployment is pinned: `apply` raises
   `Pinned` and writes nothing.
4. The in-memory `State` mirrors the tree at the head; it is re-read whenever the ref moved
   under us (another writer) and updated in place after our own commits. A broker's ledger
   (`settle=True`) holds one placement per instance in what it read: the keep rule of
   `broker.ledger.integrity`, against the State it had (none at the first read).
5. A commit's outcome is the ref's: once the ref moved, the commit has landed, and nothing
   after that (merging packs, re-opening the repository) can make `write` report a failure.
   A write that failed in a way that leaves the outcome open (the writer process died, an
   error past the compare-and-swap) is settled by reading the ref (`landed`).
6. An object the tree or the history needs that is missing or does not read raises
   `Damaged`: one sentence naming the object and what to do. Nothing is guessed around it.
7. HEAD names the active branch when it named a branch without commits (`name_head`).
8. A broker starting finds no writer of its own alive (there is one broker, and the last
   one's writer died with it), so a lock on the ref that outlives a short wait was left by a
   writer killed between locking the ref and moving it: `clear_stale_lock` removes it,
   logged, instead of leaving every commit to fail "locked" for good. git and libgit2 hold
   a ref's lock for one write; a lock that is still there, unchanged, after `LOCK_WAIT_S`
   is no one's write in flight. Only at the start: a lock taken while the broker runs is
   someone's, waited out and retried.
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

import msgspec
import pygit2

from gavel.broker.ledger.integrity import settle as settle_disputes
from gavel.broker.ledger.objects import Batch, Entries, ObjectStore, Trees, commit_body, git_order
from gavel.broker.ledger.packs import merge_small_packs
from gavel.broker.ledger.state import Change, State, compact, encode, parse_stamp, pretty, stamp
from gavel.shared.records import (
    AuctionRecord,
    InstanceRecord,
    NodeFile,
    ServiceRecord,
    instance_path,
    parse_trailers,
)

# `State`, `Change` and the encodings live in `broker.state`; they are re-exported here, where
# most callers met them first.
__all__ = ["Change", "Conflict", "Damaged", "Ledger", "LedgerError", "Pinned", "State",
           "compact", "encode", "name_head", "parse_stamp", "pretty", "service_problem",
           "stamp"]

#: How long a lock on the ref must stay unchanged at a broker's start to be stale (rule 8).
LOCK_WAIT_S = 1.0
_SHA = re.compile(r"^[0-9a-f]{7,40}$")
_OID = re.compile(r"[0-9a-f]{40}")
_instance_dec = msgspec.json.Decoder(InstanceRecord)
_node_dec = msgspec.json.Decoder(NodeFile)
_service_dec = msgspec.json.Decoder(ServiceRecord)
_EMAIL = "broker@gavel.local"
_SIGNATURE = b"gavel-broker <%s>" % _EMAIL.encode()
#: How many commits others may have put on top of ours before `landed` looks (a merge of
#: a push, a hand commit): it walks no further back.
_LANDED_DEPTH = 64
T = TypeVar("T")
#: How long a checked head is trusted without looking at the ref's files again. The broker
#: asks several times per placement; a move by someone else is noticed this much later at
#: most (every write is a compare-and-swap anyway), and our own commits forget the cache.
_HEAD_FRESH_S = 0.005
_KIND_NAMES = {1: b"commit", 2: b"tree", 3: b"blob", 4: b"tag"}
log = logging.getLogger("gavel.ledger")


def _person(now: float | None = None) -> bytes:
    """The ledger's author and committer line, stamped now in the machine's time zone (what
    `pygit2.Signature` would write)."""
    secs = int(time.time() if now is None else now)
    off = time.localtime(secs).tm_gmtoff // 60
    sign = "-" if off < 0 else "+"
    return b"%s %d %s%02d%02d" % (_SIGNATURE, secs, sign.encode(), abs(off) // 60, abs(off) % 60)


def service_problem(svc: ServiceRecord, name: str) -> str:
    """Why a decoded ``services/<name>.json`` is not a usable service record ("" if it is):
    it names its own file, lists the version it runs, and every version is a service of
    that name (its replicas' ids start with the name)."""
    if svc.name != name:
        return f"it names service {svc.name!r}"
    if svc.spec_of(svc.version) is None:
        return f"it runs version {svc.version}, which it does not list"
    for v in svc.versions:
        if not v.spec.service or v.spec.name != name:
            return f"version {v.version} is not a service named {name!r}"
    return ""


class LedgerError(Exception):
    """The state repository could not be read or written."""


class Conflict(LedgerError):
    """The branch moved since the change was planned."""


class Pinned(LedgerError):
    """The active ref is a tag or a commit: nothing may be written."""


class Damaged(LedgerError):
    """An object the state repository needs is missing or corrupt: the broker cannot know
    what its branch says, and stops (the sentence names the object and what to do)."""


def damaged(path: Path, exc: BaseException) -> Damaged:
    """`exc` (libgit2's KeyError for a missing object, GitError for one that does not read)
    as one sentence for the operator."""
    if isinstance(exc, KeyError) and exc.args:
        oid, why = str(exc.args[0]), "is missing"
    else:
        text = str(exc)
        found = _OID.search(text)
        oid = found.group(0) if found else "an object"
        why = f"does not read ({text.replace(oid, '').strip(' :') or type(exc).__name__})"
    return Damaged(f"object {oid} in the state repository {path} {why}: restore state.git "
                   f"from the push remote, or run `git fsck --full` in {path} to see what is "
                   "damaged")
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
    def __init__(self, path: Path, ref: str = "refs/heads/main", *, settle: bool = False
                 ) -> None:
        self.path = path
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
        change in — so nobody acts on a placement the broker has not finished making."""
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
        st = self._read_tree(head)
        if self.settle:  # rule 4
            settle_disputes(st, history, self._winners)
        return st

    def _read_tree(self, head: str | None) -> State:
        st = State(head=head)
        if head is None:
            return st
        tree = self.repo[head].peel(pygit2.Tree)
        if "instances" in tree:
            def read(entry: pygit2.Object, path: str) -> None:
                if not (entry.name or "").endswith(".json") or entry.type_str != "blob":
                    return
                try:
                    rec = _instance_dec.decode(self._data(entry.id))
                except msgspec.DecodeError as exc:
                    st.unreadable[path] = str(exc)
                    return
                iid = rec.instance_id
                if f"{iid}.json" != entry.name:
                    st.unreadable[path] = f"it names instance {iid!r}"
                    return
                where = instance_path(iid)
                if path != where and iid in st.instances:
                    return  # a stray copy: the record read first, or the broker's, wins
                st.put_instance(iid, rec)
                if path != where:  # by hand (flat) or in a wrong shard: moved at the next write
                    st.flat[iid] = path

            top = list(self._tree(tree["instances"].id))
            for entry in top:  # records put there by hand
                read(entry, f"instances/{entry.name}")
            for shard in top:  # after the flat ones: the broker's own write wins
                if shard.type_str == "tree":
                    for entry in self._tree(shard.id):
                        read(entry, f"instances/{shard.name}/{entry.name}")
        if "nodes" in tree:
            for entry in self._tree(tree["nodes"].id):
                sub = self.repo[entry.id]
                if isinstance(sub, pygit2.Tree) and "node.json" in sub:
                    path = f"nodes/{entry.name}/node.json"
                    try:
                        nf = _node_dec.decode(self._data(sub["node.json"].id))
                    except msgspec.DecodeError as exc:
                        st.unreadable[path] = str(exc)
                        st.unusable_nodes.add(entry.name or "")
                        continue
                    if nf.node_id != entry.name:
                        st.unreadable[path] = f"it names node {nf.node_id!r}"
                        st.unusable_nodes.add(entry.name or "")
                        continue
                    st.put_node(nf.node_id, nf)
        if "services" in tree:
            for entry in self._tree(tree["services"].id):
                name = entry.name or ""
                if not name.endswith(".json") or entry.type_str != "blob":
                    continue
                path = f"services/{name}"
                try:
                    svc = _service_dec.decode(self._data(entry.id))
                except (msgspec.DecodeError, RecursionError) as exc:  # by hand: anything
                    st.unreadable[path] = str(exc) or "nested too deeply"
                    continue
                problem = service_problem(svc, name.removesuffix(".json"))
                if problem:
                    st.unreadable[path] = problem
                    continue
                st.put_service(svc.name, svc)
        for path, why in st.unreadable.items():
            log.error("%s is not a usable gavel file (%s): left as it is and ignored; fix or "
                      "remove it in git", path, why)
        st.order_ended()
        return st

    def _tree(self, oid: pygit2.Oid) -> pygit2.Tree:
        obj = self.repo[oid]
        if not isinstance(obj, pygit2.Tree):
            raise LedgerError(f"{oid} is not a tree")
        return obj

    def _data(self, oid: pygit2.Oid) -> bytes:
        obj = self.repo[oid]
        if not isinstance(obj, pygit2.Blob):
            raise LedgerError(f"{oid} is not a file")
        return obj.data

    def history(self, limit: int | None = None) -> Iterator[pygit2.Commit]:
        head = self.head()
        if head is None:
            return
        for n, commit in enumerate(self.repo.walk(pygit2.Oid(hex=head),
                                                  pygit2.enums.SortMode.TOPOLOGICAL)):
            if limit is not None and n >= limit:
                return
            yield commit

    def _winners(self, iids: Iterable[str], limit: int = 10_000) -> dict[str, str]:
        """The winner the newest recorded auction of each instance names (one walk of the
        history for all of them; those without a recorded winner are left out)."""
        wanted = set(iids)
        out: dict[str, str] = {}
        for commit in self.history(limit):
            message = commit.message
            if not any(iid in message for iid in wanted):
                continue
            for r in parse_trailers(message):
                if r.instance_id in wanted and r.winner:
                    out.setdefault(r.instance_id, r.winner)
                    wanted.discard(r.instance_id)
            if not wanted:
                break
        return out

    def auctions_for(self, instance_id: str, limit: int = 10_000) -> list[AuctionRecord]:
        """Every recorded auction for the instance, newest first."""
        def scan() -> list[AuctionRecord]:
            out: list[AuctionRecord] = []
            for commit in self.history(limit):
                if instance_id not in commit.message:
                    continue
                out.extend(r for r in parse_trailers(commit.message)
                           if r.instance_id == instance_id)
            return out

        with self._lock:
            return self._retrying(scan)

    def _retrying(self, read: Callable[[], T]) -> T:
        """`read`, once more on a fresh handle if it fails: the writer may have merged away
        a pack this handle still lists (see `broker.packs`). A second failure is real."""
        try:
            return read()
        except (pygit2.GitError, KeyError, OSError):
            self._reopen()
            return read()

    # -- writing -------------------------------------------------------------------------
    def clear_stale_lock(self, wait_s: float = LOCK_WAIT_S) -> Path | None:
        """Rule 8, at a broker's start: remove the ref's lock file if it is still there,
        unchanged, after `wait_s`; the path removed, or None."""
        lock = Path(self.repo.path) / f"{self.ref}.lock"
        try:
            before = lock.stat()
        except OSError:
            return None
        time.sleep(wait_s)
        try:
            now = lock.stat()
        except OSError:
            return None  # someone's write finished
        if (now.st_ino, now.st_mtime_ns) != (before.st_ino, before.st_mtime_ns):
            return None  # a new lock: someone is writing
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
        log.warning("removed %s: a lock on the state branch left by a writer that died "
                    "holding it (no write holds it for %gs)", lock, wait_s)
        return lock

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
        for nid, nf in change.nodes.items():
            st.put_node(nid, nf, change.committed.get(nid), change.grown.get(nid))
            data = change.encoded_of(nid, nf) if nf is not None else None
            if nf is None or data is None:
                st.encoded.pop(nid, None)
            else:
                st.encoded[nid] = (nf, data)

    def _commit(self, files: Mapping[str, bytes | None], message: str,
                planned_on: str | None) -> str:
        repo = self.repo
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
        tree_id, _ = self._trees.write(base, nested, batch)
        parents = [bytes.fromhex(planned_on)] if planned_on else []
        # The commit goes into the same pack (libgit2 would write it as a loose object).
        commit_id = pygit2.Oid(raw=batch.commit(commit_body(tree_id, parents, _person(),
                                                            message)))
        packed = self._objects.flush(batch)
        with repo.transaction() as txn:
            txn.lock_ref(self.ref)
            current = repo.references.get(self.ref)
            current_sha = str(current.target) if current is not None else None
            if current_sha != planned_on:
                raise Conflict(f"{self.ref} moved to {current_sha}, planned on {planned_on}")
            txn.set_target(self.ref, commit_id, message=message.splitlines()[0][:200])
        # The ref has moved: the commit has landed, whatever happens from here (rule 5).
        if packed:
            self._tidy_packs()
        return str(commit_id)

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
            sha = self._resolve()
            want = message.encode()
            for _ in range(_LANDED_DEPTH):  # first parents: a merge puts ours first
                if sha is None or sha == planned_on:
                    return None
                commit = self.repo[sha].peel(pygit2.Commit)
                parents = [str(p) for p in commit.parent_ids]
                if parents[:1] == ([planned_on] if planned_on else []) \
                        and commit.raw_message == want and commit.author.email == _EMAIL:
                    return sha
                sha = parents[0] if parents else None
            return None

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
