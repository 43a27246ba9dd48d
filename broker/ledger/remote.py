"""Pushing the state repository to a git remote (GitLab, Gitea, a bare repository).

Rules:
1. At most one push is in flight; commits that land meanwhile coalesce into the next push.
   A failed push is retried with exponential back-off, capped; new commits do not cut the
   back-off short.
2. Never a force push. When the remote has commits we lack, they are fetched and merged into
   our branch as a commit with two parents (ours first), and our branch moves by
   compare-and-swap like any other ledger write; then the push is tried again.
3. The merge rule (`broker.ledger.merge`): a file only they changed is taken from them; a
   file both sides changed keeps our version, because the broker is the single writer of
   placements. A taken ``instances/`` or ``nodes/`` file that does not decode is left out,
   and the merge commit's message names it.
4. All git work runs on one thread with its own repository handle. To the ledger a merge is
   just "the ref moved": it re-reads the tree and re-plans whatever was in flight. What the
   merge took is not mirrored as they wrote it: the broker's next pass mirrors the state it
   read, which holds one placement per instance (`broker.ledger.integrity`), so a node file
   of theirs that lists an instance on a second node never reaches that node's worker.
5. A leader (`epoch` set: `broker.ha`) pushes by compare-and-swap (`broker.ledger.caspush`)
   and only while `leading()` says its lease holds. Refused, it fetches: a remote branch of
   another epoch (`broker.ledger.takeover`: every leadership's first commit names its own)
   means another broker leads - `Fenced`, nothing is merged and nothing is retried; a
   branch of its own epoch with commits it lacks is a hand commit, merged as in rule 2.
6. `mark()` names every commit notified so far; `wait(mark)` returns once a push that
   started after them landed (the committer's "durable": `broker.ledger.committer` rule 10).
7. A remote on this machine whose HEAD names a branch without commits is given HEAD on the
   pushed branch (`ledger.repository.name_head`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pygit2
from prometheus_client import Counter
from prometheus_client.registry import CollectorRegistry

from gavel.broker.ledger import caspush, merge, takeover
from gavel.broker.ledger.caspush import PushError, Refused
from gavel.broker.ledger.repository import name_head
from gavel.broker.ledger.state import Change
from gavel.shared.redact import mask_url
from gavel.shared.timing import Timing

__all__ = ["Fenced", "PushError", "Pusher"]

log = logging.getLogger("gavel.remote")
_TIMING = Timing()


class Fenced(PushError):
    """Rule 5: this broker may not push any more (another leads, or its lease ran out)."""


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

    def __init__(self, repo_path: Path, ref: str, remote: str, *,
                 backoff_s: float = _TIMING.retry_s, max_backoff_s: float = _TIMING.retry_max_s,
                 max_rounds: int = 5,
                 on_merged: Callable[[Change, str], None] | None = None,
                 registry: CollectorRegistry | None = None, epoch: int = 0,
                 leading: Callable[[], bool] | None = None,
                 on_fenced: Callable[[str], None] | None = None,
                 outcomes: Counter | None = None, stale_lock_s: float | None = None,
                 push_s: float = _TIMING.push_s) -> None:
        self.repo_path = Path(repo_path)
        #: A lock in a local remote older than this is a dead pusher's (`caspush` rule 4).
        self.stale_lock_s = stale_lock_s
        #: One push to a local remote taking longer than this has failed.
        self.push_s = push_s
        #: Rule 5: the leadership this pusher writes for (0: no HA), whether its lease still
        #: holds, and who hears that it may push no more.
        self.epoch = epoch
        self.leading = leading
        self.on_fenced = on_fenced
        self.fenced = ""
        #: Rule 6: commits notified, and the count a landed push covered.
        self._notified = 0
        self._synced = 0
        self._pushed = 0
        self._progress = asyncio.Event()
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
        self._outcomes = outcomes if outcomes is not None else pushes_counter(registry) \
            if registry is not None else None

    @property
    def url(self) -> str:
        return mask_url(self.remote)

    # -- the loop ------------------------------------------------------------------------
    def notify(self) -> None:
        """A commit landed: push it (with anything else that lands before the push starts)."""
        self._notified += 1
        self.idle.clear()
        self._kick.set()

    def mark(self) -> int:
        """Rule 6: a token for every commit notified so far."""
        return self._notified

    async def wait(self, mark: int) -> None:
        """Rule 6: until the commits `mark` covers are on the remote (for ever if fenced)."""
        while self._pushed < mark:
            await self._progress.wait()

    def _landed(self) -> None:
        if self._synced > self._pushed:
            self._pushed = self._synced
            self._progress.set()
            self._progress = asyncio.Event()

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
                except Fenced as fenced:  # rule 5: for good
                    self._count("fenced")
                    self.fenced = str(fenced)
                    log.warning("%s; this broker pushes no more", fenced,
                                extra={"remote": self.url})
                    if self.on_fenced is not None:
                        self.on_fenced(str(fenced))
                    return
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
                self._landed()
                if not self._kick.is_set():
                    self.idle.set()
        finally:
            self._pool.shutdown(wait=False)

    async def lead(self, broker_id: str, at_least: int, since: str) -> takeover.Taken:
        """`take_over` on the pusher's thread (before `run`)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self.take_over, broker_id, at_least, since)

    def shutdown(self) -> None:
        """Let the pusher's thread go (`run` does it too when cancelled)."""
        self._pool.shutdown(wait=False)

    async def flush(self) -> None:
        """Wait until everything notified so far has landed on the remote."""
        await self.idle.wait()

    async def close(self, task: asyncio.Future[None], timeout: float) -> None:
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
        covered = self._notified  # before the head is read: these commits are under it
        for _ in range(self.max_rounds):
            ours = self._head(repo)
            if ours is None:
                return None
            try:
                self._push(repo)
            except Fenced:
                raise
            except (pygit2.GitError, PushError) as exc:
                if self.epoch and not isinstance(exc, Refused):
                    raise  # rule 5: only a refusal says something of the remote's branch
                error = str(exc)
            else:
                self.pushes += 1
                self.pushed = ours
                self._synced = covered
                self._count("pushed")
                self._name_remote_head()
                return ours
            theirs = self._fetch(repo)
            if self.epoch and theirs is not None:
                held = takeover.epoch_of(repo, theirs)
                if held != self.epoch:
                    raise Fenced(f"the remote {self.url} holds the branch of epoch {held}, "
                                 f"not ours ({self.epoch}): another broker leads")
            if theirs is None or theirs == ours or repo.descendant_of(ours, theirs):
                raise PushError(f"push to {self.url} failed: {error}")
            try:
                self._merge(repo, ours, theirs)
            except (merge.Moved, pygit2.GitError) as exc:  # the ref moved, or its lock was taken
                error = str(exc) or "our branch moved during the merge"
                continue
        raise PushError(f"push to {self.url} failed {self.max_rounds} times: {error}")

    def take_over(self, broker_id: str, at_least: int, since: str) -> takeover.Taken:
        """`broker.ledger.takeover`: the remote's branch made ours, our epoch commit on it,
        pushed by compare-and-swap; started over while an older leader's push gets in
        first. Blocking: on the pusher's thread, before `run`."""
        repo = self._open()
        error = "no round was tried"
        for _ in range(self.max_rounds):
            if self.leading is not None and not self.leading():
                raise takeover.TakeoverError("the lease ran out during the takeover")
            try:
                theirs = self._fetch(repo)
            except PushError as exc:
                raise takeover.TakeoverError(str(exc)) from None
            try:  # our branch locked (by whom?): no takeover, never a crash
                if theirs is not None:
                    takeover.set_branch(repo, self.ref, theirs,
                                        f"takeover: {self.url} holds this")
                base = theirs if theirs is not None else self._head(repo)
                held = takeover.epoch_of(repo, base)
                epoch = takeover.next_epoch(at_least, held)
                head = takeover.epoch_commit(repo, self.ref, base, takeover.LeaderFile(
                    epoch=epoch, broker_id=broker_id, since=since))
            except pygit2.GitError as exc:
                raise takeover.TakeoverError(f"our copy's branch: {exc}") from None
            self.epoch = epoch
            try:
                self._push(repo)
            except Refused as exc:
                error = str(exc)
                continue
            except (pygit2.GitError, PushError) as exc:
                raise takeover.TakeoverError(str(exc)) from None
            self.pushes += 1
            self.pushed = head
            self._count("pushed")
            log.info("epoch %d: broker %s leads from commit %s (the branch held epoch %d)",
                     epoch, broker_id, head[:12], held, extra={"remote": self.url})
            return takeover.Taken(epoch=epoch, head=head, previous=held)
        raise takeover.TakeoverError(f"the epoch commit was refused {self.max_rounds} times: "
                                     f"{error}")

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
        if self.epoch:  # rule 5
            if self.leading is not None and not self.leading():
                raise Fenced("the lease ran out before the push: another broker may lead")
            url = self._url(repo)
            if caspush.is_local(url):
                caspush.push_local(Path(repo.path), url, self.ref, self.stale_lock_s,
                                   self.push_s)
                return
        cb = _Callbacks()
        try:
            self._remote(repo).push([f"{self.ref}:{self.ref}"], callbacks=cb)
        except pygit2.GitError as exc:
            if "fastforward" not in str(exc).replace("-", ""):
                raise
            raise Refused(f"the remote {self.url} refused {self.ref}: {exc}") from None
        if cb.rejected:
            raise Refused(f"the remote refused {cb.rejected}")

    def _url(self, repo: pygit2.Repository) -> str:
        """The remote's URL (`remote` may name a remote of the state repository)."""
        names = {r.name for r in repo.remotes}
        return str(repo.remotes[self.remote].url) if self.remote in names else self.remote

    def refresh(self) -> str | None:
        """Fetch the remote's branch (ours is left alone): a standby keeps its copy fresh, so
        that a takeover fetches only what is new. Blocking: on the pusher's thread."""
        return self._fetch(self._open())

    async def refreshing(self) -> str | None:
        """`refresh` on the pusher's thread."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, self.refresh)

    def _name_remote_head(self) -> None:
        """Rule 7: a remote on this machine (a path or file:// URL) whose HEAD names a branch
        without commits gets HEAD on ours, so ``git log`` there shows the history; a remote
        across the network keeps the default branch its server was given."""
        path = self.remote.removeprefix("file://")
        if self.remote.startswith(("file://", "/", ".")) and os.path.isdir(path):
            try:
                name_head(pygit2.Repository(path), self.ref)
            except pygit2.GitError as exc:
                log.debug("left HEAD of %s alone: %s", self.url, exc)

    def _fetch(self, repo: pygit2.Repository) -> str | None:
        """The remote's branch, fetched into a tracking ref (None: the remote has none;
        pruned, so a branch gone from the remote is gone from the tracking ref too)."""
        tracking = "refs/gavel/remote/" + self.ref.removeprefix("refs/heads/")
        try:
            self._remote(repo).fetch([f"+{self.ref}:{tracking}"], callbacks=_Callbacks(),
                                     prune=pygit2.enums.FetchPrune.PRUNE)
        except pygit2.GitError as exc:
            raise PushError(f"fetch from {self.url} failed: {exc}") from None
        ref = repo.references.get(tracking)
        return None if ref is None else str(ref.target)

    # -- the merge -----------------------------------------------------------------------
    def _merge(self, repo: pygit2.Repository, ours: str, theirs: str) -> str:
        got = merge.merge(repo, self.ref, ours, theirs, self.url)
        self.merges += 1
        self._count("merged")
        log.info("%s", got.summary, extra={"remote": self.url, "commit": got.sha[:12],
                                           "took": got.took, "kept_ours": got.kept,
                                           "ignored": got.ignored})
        if self.on_merged is not None and self._loop is not None and got.change:
            self._loop.call_soon_threadsafe(self.on_merged, got.change, got.sha)
        return got.sha


def pushes_counter(registry: CollectorRegistry) -> Counter:
    return Counter("gavel_git_pushes_total", "Pushes of the state branch, by outcome",
                   ["outcome"], registry=registry)
