"""Hearing an instance's output grow as it is written: Linux inotify on each instance's
directory, so a log file is rotated when it passes its cap (`worker.logfiles` rule 1), not
at the next tick.

Rules:
1. One inotify descriptor per worker, one watch (``IN_MODIFY``) per directory of an
   instance the node holds: the kernel names the file written in each event, and coalesces
   a run of identical unread events into one, so a writer's rate never becomes as many
   wake-ups. `Watch.sync` adds and drops watches as instances come and go (on the tick).
2. Where inotify is not to be had (not Linux, or the per-user watch limit is reached) the
   tick alone rotates, as before: `Watch.open` returns None, `sync` skips a directory it
   cannot watch.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import struct
from collections.abc import Collection
from pathlib import Path

__all__ = ["Watch"]

log = logging.getLogger("gavel.worker.logs")

_IN_MODIFY = 0x00000002
_IN_IGNORED = 0x00008000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name
_READ_MAX = 64 * 1024


class Watch:
    """Rule 1: which instance's which file was written since the last `events`."""

    def __init__(self, fd: int, libc: ctypes.CDLL, root: Path) -> None:
        self.fd = fd
        self._libc = libc
        self.root = root
        self._by_wd: dict[int, str] = {}
        self._by_id: dict[str, int] = {}

    @classmethod
    def open(cls, root: Path) -> Watch | None:
        """A watch over the instance directories under `root`, or None (rule 2)."""
        name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(name or "libc.so.6", use_errno=True)
            fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        except (OSError, AttributeError):
            return None
        if fd < 0:
            log.warning("no inotify (%s): logs rotate on the tick only",
                        os.strerror(ctypes.get_errno()))
            return None
        return cls(fd, libc, root)

    def sync(self, held: Collection[str]) -> None:
        """Watch the directories of the instances in `held`, and only those (rule 1)."""
        for iid in [i for i in self._by_id if i not in held]:
            wd = self._by_id.pop(iid)
            self._by_wd.pop(wd, None)
            self._libc.inotify_rm_watch(self.fd, wd)
        for iid in held:
            if iid in self._by_id:
                continue
            path = self.root / iid
            if not path.is_dir():
                continue
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), _IN_MODIFY)
            if wd < 0:  # rule 2: the tick still rotates it
                continue
            self._by_id[iid] = wd
            self._by_wd[wd] = iid

    def events(self) -> set[tuple[str, str]]:
        """(instance, file name) of every file written since the last call."""
        out: set[tuple[str, str]] = set()
        while True:
            try:
                data = os.read(self.fd, _READ_MAX)
            except (BlockingIOError, InterruptedError):
                return out
            if not data:
                return out
            at = 0
            while at + _EVENT.size <= len(data):
                wd, mask, _cookie, size = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size:at + _EVENT.size + size].rstrip(b"\0")
                at += _EVENT.size + size
                iid = self._by_wd.get(wd)
                if mask & _IN_IGNORED:  # the directory went: its watch with it
                    if iid is not None:
                        self._by_wd.pop(wd, None)
                        self._by_id.pop(iid, None)
                    continue
                if iid is not None and name:
                    out.add((iid, os.fsdecode(name)))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
