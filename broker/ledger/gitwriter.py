"""Where commits are written: a separate process by default, or a thread.

Rule: libgit2 holds the GIL while it compresses and writes objects, so under load a commit
written on a thread steals the event loop's core. A single writer process gets the second
core; it receives encoded files, writes blobs, trees and the commit, and moves the ref by
compare-and-swap exactly as `Ledger.write` does (it *is* `Ledger.write_files`, in the
child). Errors (`Conflict`, `Pinned`, `LedgerError`) come back as themselves. A writer
that dies in a commit leaves its outcome to the ref: the broker reads whether the branch
holds that commit (`Ledger.landed`) before it tells anyone the commit failed.

The writer dies with its broker: a broker killed outright (kill -9, the OOM killer) never
tells it to stop, and it would wait on its call queue for ever. It checks once a second
that its parent is the one that started it, and exits between commits - never in one, so no
ref lock is left behind.

The writer process runs `WRITER_NICE` steps nicer than its broker. Its work is throughput
(a commit is a batch, and the next one takes whatever came meanwhile); the broker's is
latency (the bids of an open round wait on its loop). At equal priority, each commit
handed to the writer takes the core from a loop with bids to read; a nicer writer uses the
time the loop and NATS leave, and its commits grow a little under load instead. On two busy
cores that placed a median 1.09 times as fast at one round in flight, as fast in a closed
loop, and no slower from submit to running (docs/performance.md, "The writer's priority").
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import pygit2

from gavel.broker.ledger.repository import Ledger

__all__ = ["WRITER_NICE", "commit_files", "make_executor"]

_ledgers: dict[tuple[str, str], Ledger] = {}
_committing = threading.Lock()
log = logging.getLogger("gavel.broker")

#: How much nicer than its broker the writer process runs (module rule above).
WRITER_NICE = 10


def commit_files(path: str, ref: str, files: Mapping[str, bytes | None], message: str,
                 planned_on: str | None, compact: Mapping[str, bytes] | None = None,
                 objects: str = "packs") -> str:
    """Runs in the writer: one cached `Ledger` per repository (`objects`: who writes blobs
    and trees, `Ledger` rule 9)."""
    with _committing:
        ledger = _ledgers.get((path, ref))
        if ledger is not None and ledger.objects != objects:
            ledger = None
        if ledger is None:
            # The writer only inserts ids of objects it has just written itself: libgit2's
            # check that each exists is a lookup per entry we can skip, and a noticeable
            # share of a commit (docs/performance.md).
            pygit2.settings.enable_strict_object_creation(False)
            ledger = _ledgers[(path, ref)] = Ledger(Path(path), ref, objects=objects)
        return ledger.write_files(files, message, planned_on, compact)


def _writer_started(parent: int, orphan_s: float) -> None:
    """The writer process's initializer: run `WRITER_NICE` nicer (where the system lets it:
    it only ever lowers the writer's priority) and leave when the broker that started it is
    gone (looked at every `orphan_s`, its broker's `Timing.orphan_s`)."""
    with contextlib.suppress(OSError):
        os.nice(WRITER_NICE)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(orphan_s)
        with _committing:  # the commit in hand, if any, finishes first
            os._exit(0)

    threading.Thread(target=watch, name="gavel-orphan-check", daemon=True).start()


def _warm() -> None:
    import pygit2  # noqa: F401 - load libgit2 before the first commit needs it


def make_executor(kind: str, orphan_s: float) -> Executor:
    """The writer: a process of its own that leaves once its broker is gone (it looks every
    `orphan_s`), or a thread."""
    if kind == "process":
        try:
            pool = ProcessPoolExecutor(max_workers=1,
                                       mp_context=multiprocessing.get_context("spawn"),
                                       initializer=_writer_started,
                                       initargs=(os.getpid(), orphan_s))
            pool.submit(_warm)
            return pool
        except OSError as exc:  # no POSIX semaphores here (a container without /dev/shm)
            log.warning("no writer process (%s); commits are written on a thread", exc)
            kind = "thread"
    if kind == "thread":
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="gavel-git")
    raise ValueError(f"writer must be 'process' or 'thread', not {kind!r}")
