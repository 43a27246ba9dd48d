"""Where commits are written: a separate process by default, or a thread.

Rule: libgit2 holds the GIL while it compresses and writes objects, so under load a commit
written on a thread steals the event loop's core. A single writer process gets the second
core; it receives encoded files, writes blobs, trees and the commit, and moves the ref by
compare-and-swap exactly as `Ledger.write` does (it *is* `Ledger.write_files`, in the
child). Errors (`Conflict`, `Pinned`, `LedgerError`) come back as themselves.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Mapping
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import pygit2

from broker.ledger import Ledger

__all__ = ["commit_files", "make_executor"]

_ledgers: dict[tuple[str, str], Ledger] = {}
log = logging.getLogger("gavel.broker")


def commit_files(path: str, ref: str, files: Mapping[str, bytes | None], message: str,
                 planned_on: str | None) -> str:
    """Runs in the writer: one cached `Ledger` per repository."""
    ledger = _ledgers.get((path, ref))
    if ledger is None:
        # The writer only inserts ids of objects it has just written itself: libgit2's
        # check that each exists is a lookup per entry we can skip (~15% of a commit).
        pygit2.settings.enable_strict_object_creation(False)
        ledger = _ledgers[(path, ref)] = Ledger(Path(path), ref)
    return ledger.write_files(files, message, planned_on)


def _warm() -> None:
    import pygit2  # noqa: F401 - load libgit2 before the first commit needs it


def make_executor(kind: str) -> Executor:
    if kind == "process":
        try:
            pool = ProcessPoolExecutor(max_workers=1,
                                       mp_context=multiprocessing.get_context("spawn"))
            pool.submit(_warm)
            return pool
        except OSError as exc:  # no POSIX semaphores here (a container without /dev/shm)
            log.warning("no writer process (%s); commits are written on a thread", exc)
            kind = "thread"
    if kind == "thread":
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="gavel-git")
    raise ValueError(f"writer must be 'process' or 'thread', not {kind!r}")
