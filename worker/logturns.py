"""Turns between a writer inside the worker and the rotation of the files it writes.

Rules:
1. A process writes its output files itself, and rotation's copy-and-truncate loses what it
   writes between the copy's last read and the truncate (`worker.logfiles` rule 2: the price
   of a writer nobody can pause). A writer the worker runs itself - the thread that writes a
   container's output (`worker.containers` rule 5) - can be paused: while it writes an
   instance's directory it holds that directory's turn (`writing`), taking the lock for each
   write, and the rotation takes the same lock from its copy through its truncate (`turn`).
   The copy then reaches the end of the file and the truncate cuts nothing unread: such a
   writer loses no byte to rotation.
2. A directory has at most one such writer at a time; the turn is dropped with it. Where no
   writer of the worker's is registered, `turn` holds nothing and rotation is as before.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

__all__ = ["turn", "writing"]

_turns: dict[Path, threading.Lock] = {}
_guard = threading.Lock()


@contextlib.contextmanager
def writing(directory: Path) -> Iterator[threading.Lock]:
    """Rule 1: while inside, the caller writes `directory`'s output files, each write under
    the lock it is given."""
    lock = threading.Lock()
    with _guard:
        _turns[directory] = lock
    try:
        yield lock
    finally:
        with _guard:
            if _turns.get(directory) is lock:
                del _turns[directory]


def turn(directory: Path) -> contextlib.AbstractContextManager[object]:
    """Rule 1: what the rotation of `directory`'s files holds from copy to truncate."""
    with _guard:
        lock = _turns.get(directory)
    return lock if lock is not None else contextlib.nullcontext()
