"""Pushing the state repository to a git remote (GitLab, Gitea, a bare repository).

Rules:
1. At most one push is in flight; commits that land meanwhile coalesce into the next push.
   A failed push is retried with exponential back-off, capped; new commits do not cut the
   back-off short.
2. Never a force push. When the remote has commits we lack, they are fetched and merged into
   our branch as a commit with two parents (ours first), and our branch moves by
   compare-and-swap like any other ledger write; then the push is tried again.
3. The merge rule: a file only they changed is taken from them; a file both sides changed
   keeps our version, because the broker is the single writer of placements. A taken
   ``instances/`` or ``nodes/`` file that does not decode is left out, and the merge commit's
   message names it.
4. All git work runs on one thread with its own repository handle. To the ledger a merge is
   just "the ref moved": it re-reads the tree and re-plans whatever was in flight. What the
   merge took is not mirrored as they wrote it: the broker's next pass mirrors the state it
   read, which holds one placement per instance (`broker.ledger.integrity`), so a node file
   of theirs that lists an instance on a second node never reaches that node's worker.
5. A remote on this machine whose HEAD names a branch without commits is given HEAD on the
   pushed branch (`ledger.repository.name_head`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pygit2
from prometheus_client import Counter
from prometheus_client.registry import CollectorRegistry

from gavel.broker.ledger.repository import name_head
from gavel.broker.ledger.state import Change
from gavel.shared.records import InstanceRecord, NodeFile
from gavel.shared.redact import mask_url

if TYPE_CHECKING:
    from gavel.broker.ledger.committer import Committer
    from gavel.broker.ledger.repository import Ledger

__all__ = ["PushError", "Pusher"]

log = logging.getLogger("gavel.remote")
_SIGNATURE = ("gavel-broker", "broker@gavel.local")
#: A record in its shard, or put flat by hand (`shared.records.instance_path`).
_INSTANCE = re.compile(r"^instances/(?:[0-9a-f]{2}/)?(?P<id>[^/]+)\.json$")
_NODE = re.compile(r"^nodes/(?P<id>[^/]+)/node\.json$")
_instance_dec = msgspec.json.Decoder(InstanceRecord)
_node_dec = msgspec.json.Decoder(NodeFile)
Files = dict[str, tuple[str, int]]  # path -> (blob id, file mode)


class PushError(Exception):
    """The push did not land; the sentence says why."""


class _Moved(Exception):
    """Our branch moved while we merged: merge again on the new head."""


class _Callbacks(pygit2.RemoteCallbacks):
    """Records refusals; credentials from the environment for ssh and https remotes."""

    def __init__(self) -> None:
        super().__init__()
        self.rejected: str | None = None

    def push_update_reference(self, refname: str, message: str | None) -> None:
        if message:
            self.rejected = f"{refname}: {message}"

    def credentials(self, url: str, username_from_url: str | None, allowed: int) -> Any:
        if allowed & pygit2.enums.CredentialType.SSH_KEY:
            user = username_from_url or "git"
            key = os.environ.get("GAVEL_PUSH_SSH_KEY", "")
            if key:
                pub = key + ".pub"
                return pygit2.Keypair(user, pub if Path(pub).exists() else None, key,
                                      os.environ.get("GAVEL_PUSH_SSH_PASSPHRASE", ""))
            return pygit2.KeypairFromAgent(user)
        if allowed & pygit2.enums.CredentialType.USERPASS_PLAINTEXT:
            token = os.environ.get("GAVEL_PUSH_TOKEN", "")
            if token:
                user = os.environ.get("GAVEL_PUSH_USERNAME") or username_from_url or "oauth2"
                return pygit2.UserPass(user, token)
        return None


class Pusher:
    """Keeps `remote`'s copy of `ref` up to date with the state repository at `repo_path`."""

    def __init__(self, repo_path: Path, ref: str, remote: str, *, backoff_s: float = 0.5,
                 max_backoff_s: float = 60.0, max_rounds: int = 5,
                 on_merged: Callable[[Change, str], None] | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        self.repo_path = Path(repo_path)
        self.ref = ref
        self.remote = remote
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_rounds = max_rounds
        self.on_merged = on_merged
        self.pushes = 0
        self.merges = 0
        self.failures = 0
        self.pushed: str | None = None
        self.last_error = ""
        #: Set while nothing is waiting to be pushed and the last attempt landed.
        self.idle = asyncio.Event()
        self._kick = asyncio.Event()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gavel-push")
        self._repo: pygit2.Repository | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outcomes = Counter("gavel_git_pushes_total",
                                 "Pushes of the state branch, by outcome", ["outcome"],
                                 registry=registry) if registry is not None else None

    @classmethod
    def attach(cls, ledger: Ledger, committer: Committer, remote: str, *,
               wake: Callable[[], None], registry: CollectorRegistry | None = None,
               **kw: Any) -> Pusher:
        """A pusher for `ledger`, notified after each commit `committer` writes; `wake` is
        called after a merge of what others pushed: there may be new work, and the broker's
        pass mirrors the nodes the merge changed, as its state holds them (rule 4)."""
        prev = committer.on_commit

        def merged(change: Change, sha: str) -> None:
            wake()

        pusher = cls(ledger.path, ledger.ref, remote, on_merged=merged, registry=registry, **kw)

        def committed(change: Change, sha: str) -> None:
            if prev is not None:
                prev(change, sha)
            pusher.notify()

        committer.on_commit = committed
        return pusher

    @property
    def url(self) -> str:
        return mask_url(self.remote)

    # -- the loop ------------------------------------------------------------------------
    def notify(self) -> None:
        """A commit landed: push it (with anything else that lands before the push starts)."""
        self.idle.clear()
        self._kick.set()

    async def run(self) -> None:
        """Push once at start, then after every `notify`, until cancelled."""
        self._loop = asyncio.get_running_loop()
        delay = 0.0
        self.notify()
        try:
            while True:
                await self._kick.wait()
                self._kick.clear()
                try:
                    await self._loop.run_in_executor(self._pool, self.sync)
                except Exception as failure:  # never let one bad attempt end the pusher
                    self._repo = None  # the next try on a fresh handle (packs may be merged)
                    exc = failure if isinstance(failure, PushError) else PushError(
                        f"push to {self.url} failed: {failure}")
                    self._count("failed")
                    self.failures += 1
                    level = logging.DEBUG if str(exc) == self.last_error else logging.WARNING
                    self.last_error = str(exc)
                    delay = min(self.max_backoff_s, delay * 2 if delay else self.backoff_s)
                    log.log(level, "%s; retrying in %.1fs", exc, delay,
                            extra={"remote": self.url, "retry_s": delay})
                    self._kick.set()
                    await asyncio.sleep(delay)
                    continue
                delay = 0.0
                self.last_error = ""
                if not self._kick.is_set():
                    self.idle.set()
        finally:
            self._pool.shutdown(wait=False)

    async def flush(self) -> None:
        """Wait until everything notified so far has landed on the remote."""
        await self.idle.wait()

    async def close(self, task: asyncio.Future[None], timeout: float = 5.0) -> None:
        """Give pending commits `timeout` seconds to land, then stop `task` (our `run`)."""
        if not task.done() and not self.idle.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.flush(), timeout)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def _count(self, outcome: str) -> None:
        if self._outcomes is not None:
            self._outcomes.labels(outcome=outcome).inc()

    # -- one synchronisation (blocking; on the pusher's thread) ---------------------------
    def sync(self) -> str | None:
        """Push the branch; on a refusal fetch, merge theirs in, and push again."""
        if not self.ref.startswith("refs/heads/"):
            return None  # pinned: nothing is ever written, so nothing to push
        repo = self._open()
        error = ""
        for _ in range(self.max_rounds):
            ours = self._head(repo)
            if ours is None:
                return None
            try:
                self._push(repo)
            except (pygit2.GitError, PushError) as exc:
                error = str(exc)
            else:
                self.pushes += 1
                self.pushed = ours
                self._count("pushed")
                self._name_remote_head()
                return ours
            theirs = self._fetch(repo)
            if theirs is None or theirs == ours or repo.descendant_of(ours, theirs):
                raise PushError(f"push to {self.url} failed: {error}")
            try:
                self._merge(repo, ours, theirs)
            except (_Moved, pygit2.GitError) as exc:  # the ref moved, or its lock was taken
                error = str(exc) or "our branch moved during the merge"
                continue
        raise PushError(f"push to {self.url} failed {self.max_rounds} times: {error}")

    def _open(self) -> pygit2.Repository:
        if self._repo is None:
            self._repo = pygit2.Repository(str(self.repo_path))
        return self._repo

    def _head(self, repo: pygit2.Repository) -> str | None:
        ref = repo.references.get(self.ref)
        return None if ref is None else str(ref.target)

    def _remote(self, repo: pygit2.Repository) -> Any:
        names = {r.name for r in repo.remotes}
        if self.remote in names:
            return repo.remotes[self.remote]
        return repo.remotes.create_anonymous(self.remote)

    def _push(self, repo: pygit2.Repository) -> None:
        cb = _Callbacks()
        self._remote(repo).push([f"{self.ref}:{self.ref}"], callbacks=cb)
        if cb.rejected:
            raise PushError(f"the remote refused {cb.rejected}")

    def _name_remote_head(self) -> None:
        """Rule 5: a remote on this machine (a path or file:// URL) whose HEAD names a branch
        without commits gets HEAD on ours, so ``git log`` there shows the history; a remote
        across the network keeps the default branch its server was given."""
        path = self.remote.removeprefix("file://")
        if self.remote.startswith(("file://", "/", ".")) and os.path.isdir(path):
            try:
                name_head(pygit2.Repository(path), self.ref)
            except pygit2.GitError as exc:
                log.debug("left HEAD of %s alone: %s", self.url, exc)

    def _fetch(self, repo: pygit2.Repository) -> str | None:
        tracking = "refs/gavel/remote/" + self.ref.removeprefix("refs/heads/")
        try:
            self._remote(repo).fetch([f"+{self.ref}:{tracking}"], callbacks=_Callbacks())
        except pygit2.GitError as exc:
            raise PushError(f"fetch from {self.url} failed: {exc}") from None
        ref = repo.references.get(tracking)
        return None if ref is None else str(ref.target)

    # -- the merge -----------------------------------------------------------------------
    def _merge(self, repo: pygit2.Repository, ours: str, theirs: str) -> str:
        base_id = repo.merge_base(ours, theirs)
        base = _files(repo, repo[base_id].peel(pygit2.Tree)) if base_id else {}
        mine = _files(repo, repo[ours].peel(pygit2.Tree))
        their = _files(repo, repo[theirs].peel(pygit2.Tree))
        result = dict(mine)
        took: list[str] = []
        kept: list[str] = []
        ignored: list[str] = []
        change = Change()
        for path in sorted(set(base) | set(their)):
            b, t, o = base.get(path), their.get(path), mine.get(path)
            if t == b or o == t:
                continue  # they did not change it, or made the same change as we did
            if o != b:
                kept.append(path)  # both changed it: ours wins
                continue
            problem = _take(repo, path, t, change)
            if problem:
                ignored.append(f"{path} ({problem})")
                continue
            if t is None:
                result.pop(path, None)
            else:
                result[path] = t
            took.append(path)
        branch = self.ref.removeprefix("refs/heads/")
        lines = [f"merge {branch} from {self.url}: took {len(took)} of their changes, "
                 f"kept ours on {len(kept)}", ""]
        lines += [f"Gavel-Merge-Took: {p}" for p in took]
        lines += [f"Gavel-Merge-Kept-Ours: {p}" for p in kept]
        lines += [f"Gavel-Merge-Ignored: {p}" for p in ignored]
        message = "\n".join(lines) + "\n"
        sig = pygit2.Signature(*_SIGNATURE)
        commit = repo.create_commit(None, sig, sig, message, _build(repo, result),
                                    [pygit2.Oid(hex=ours), pygit2.Oid(hex=theirs)])
        with repo.transaction() as txn:
            txn.lock_ref(self.ref)
            current = repo.references.get(self.ref)
            if current is None or str(current.target) != ours:
                raise _Moved()
            txn.set_target(self.ref, commit, message=lines[0][:200])
        sha = str(commit)
        self.merges += 1
        self._count("merged")
        log.info("%s", lines[0], extra={"remote": self.url, "commit": sha[:12],
                                        "took": took, "kept_ours": kept, "ignored": ignored})
        if self.on_merged is not None and self._loop is not None and change:
            self._loop.call_soon_threadsafe(self.on_merged, change, sha)
        return sha


def _files(repo: pygit2.Repository, tree: pygit2.Tree, prefix: str = "") -> Files:
    out: Files = {}
    for entry in tree:
        path = prefix + str(entry.name)
        obj = repo[entry.id]
        if isinstance(obj, pygit2.Tree):
            out.update(_files(repo, obj, path + "/"))
        else:
            out[path] = (str(entry.id), int(entry.filemode))
    return out


def _build(repo: pygit2.Repository, files: Files) -> pygit2.Oid:
    nested: dict[str, Any] = {}
    for path, blob in files.items():
        *dirs, name = path.split("/")
        cur = nested
        for d in dirs:
            cur = cur.setdefault(d, {})
        cur[name] = blob

    def write(level: dict[str, Any]) -> pygit2.Oid:
        tb = repo.TreeBuilder()
        for name, value in sorted(level.items()):
            if isinstance(value, dict):
                tb.insert(name, write(value), pygit2.enums.FileMode.TREE)
            else:
                tb.insert(name, pygit2.Oid(hex=value[0]), value[1])
        return tb.write()

    return write(nested)


def _take(repo: pygit2.Repository, path: str, blob: tuple[str, int] | None,
          change: Change) -> str:
    """Check a file of theirs and note it in `change`; a non-empty answer says why not."""
    inst, node = _INSTANCE.match(path), _NODE.match(path)
    if inst is None and node is None:
        return ""
    data = b"" if blob is None else repo[pygit2.Oid(hex=blob[0])].read_raw()
    try:
        if inst is not None:
            key = inst.group("id")
            rec = None if blob is None else _instance_dec.decode(data)
            if rec is not None and rec.instance_id != key:
                return f"instance_id {rec.instance_id!r} does not match the file name"
            change.instances[key] = rec
        elif node is not None:
            key = node.group("id")
            nf = None if blob is None else _node_dec.decode(data)
            if nf is not None and nf.node_id != key:
                return f"node_id {nf.node_id!r} does not match the directory"
            change.nodes[key] = nf
    except (msgspec.DecodeError, RecursionError) as exc:
        return str(exc)
    return ""
