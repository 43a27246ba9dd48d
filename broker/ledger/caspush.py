"""Pushing the branch so that the remote moves it only from the commit we built on.

Rules:
1. A push is a compare-and-swap on the remote's ref: git's receive-pack moves it from the
   value it advertised to us, under its lock, or refuses; never forced. Two pushers that
   race cannot both land, and the later one hears `Refused`.
2. A remote on a local path (a bare repository on shared storage, ``file://``) is pushed by
   the `git` command, which runs receive-pack: libgit2's own local transport writes the
   remote's ref over whatever it holds by then, so two brokers pushing at once could both
   "land", the later over the earlier. Any other remote (``git://``, ssh, https) runs
   receive-pack on its server, and libgit2 pushes there (`broker.ledger.remote`).
3. `Refused` means the remote's branch is not what we built on (someone else moved it);
   any other failure is `PushError` with the sentence git gave (unreachable, no such
   repository, no `git` command on this host).
4. A pusher that dies inside receive-pack (its host lost, its process group killed) leaves
   the ref's lock file in a remote on a local path, and git refuses every later push to
   that ref for as long as it stays. A push that is refused while such a lock is older than
   `stale_lock_s` (with HA, the lease TTL) removes it and tries once more: receive-pack
   holds a lock for moments, so one that old belongs to a pusher that is dead or was
   paused past its lease; if that one wakes, its ref update fails (its lock is gone) and
   nothing of its lands. A younger lock is left alone: a live push holds it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

from gavel.shared.redact import mask_url
from gavel.shared.timing import Timing

__all__ = ["PushError", "Refused", "clear_stale_locks", "is_local", "push_local"]

log = logging.getLogger("gavel.broker.ledger")
_TIMING = Timing()



class PushError(Exception):
    """The push did not land; the sentence says why."""


class Refused(PushError):
    """The remote's branch has moved away from what we built on: nothing was written."""


def is_local(url: str) -> bool:
    """A remote git reaches on this host's file system (rule 2): ``file://``, or a path."""
    if url.startswith("file://"):
        return True
    if "://" in url:
        return False
    head = url.split("/", 1)[0]
    return ":" not in head  # ``host:path`` is ssh's scp-like syntax


def push_local(git_dir: Path, url: str, ref: str, stale_lock_s: float | None = None,
               timeout_s: float = _TIMING.push_s) -> None:
    """Rule 2: `ref` of the repository `git_dir` to the same ref of `url`, by `git push`
    (one that takes longer than `timeout_s` has failed); rule 4 once when refused."""
    try:
        _push_local(git_dir, url, ref, timeout_s)
    except Refused:
        if stale_lock_s is None or not clear_stale_locks(url, ref, stale_lock_s):
            raise
        _push_local(git_dir, url, ref, timeout_s)


def clear_stale_locks(url: str, ref: str, older_than_s: float) -> list[str]:
    """Rule 4: the lock files of `ref` (and of HEAD and packed-refs, which receive-pack
    locks beside it) in the local remote `url` older than `older_than_s`, removed; their
    names."""
    root = Path(url.removeprefix("file://"))
    if (root / ".git").is_dir():
        root = root / ".git"
    removed = []
    for name in (f"{ref}.lock", "HEAD.lock", "packed-refs.lock"):
        path = root / name
        try:
            age = time.time() - path.stat().st_mtime
        except OSError:
            continue
        if age > older_than_s:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(name)
                log.warning("removed %s from %s: a lock %.0fs old is a dead pusher's", name,
                            mask_url(url), age)
    return removed


def _push_local(git_dir: Path, url: str, ref: str, timeout_s: float) -> None:
    git = shutil.which("git")
    if git is None:
        raise PushError(f"push to {mask_url(url)} failed: a remote on a local path is pushed "
                        "with the git command, and this host has none")
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
    env.pop("GIT_DIR", None)
    try:
        done = subprocess.run(
            [git, f"--git-dir={git_dir}", "push", "--porcelain", "--quiet", url,
             f"{ref}:{ref}"],
            capture_output=True, text=True, timeout=timeout_s, env=env,
            stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PushError(f"push to {mask_url(url)} failed: {exc}") from None
    if done.returncode == 0:
        return
    refused = [line for line in done.stdout.splitlines() if line.startswith("!")]
    if refused:
        why = refused[0].split("\t")[-1]
        raise Refused(f"the remote {mask_url(url)} refused {ref}: {why}")
    text = " ".join((done.stderr or done.stdout).split()) or f"git exited {done.returncode}"
    raise PushError(f"push to {mask_url(url)} failed: {text}")
