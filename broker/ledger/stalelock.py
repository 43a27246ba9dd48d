"""A lock on the state branch left by a writer that died holding it.

Rule: a broker starting finds no writer of its own alive (there is one broker, and the last
one's writer died with it), so a lock on the ref that outlives a short wait was left by a
writer killed between locking the ref and moving it: `remove_stale_lock` removes it, logged,
instead of leaving every commit to fail "locked" for good. git and libgit2 hold a ref's lock
for one write; a lock that is still there, unchanged, after `Timing.stale_lock_s` is no one's
write in flight. Only at the start, and once the broker's own writer died (`broker.ledger.
committer` rule 11), which is the start again: a lock taken while the broker's writer is
alive is someone's, waited out and retried.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

__all__ = ["remove_stale_lock"]

log = logging.getLogger("gavel.ledger")


def remove_stale_lock(repo_path: Path, ref: str, wait_s: float) -> Path | None:
    """Remove the lock file of `ref` in the repository at `repo_path` if it is still there,
    unchanged, after `wait_s` (the broker's `Timing.stale_lock_s`); the path removed, or
    None."""
    lock = repo_path / f"{ref}.lock"
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
