"""An instance's output on its node: ``stdout.log`` and ``stderr.log`` in the instance's
directory, capped in size, rotated, read back by position, and removed a while after the
instance ended.

Rules:
1. The process writes straight into its files, which the driver opened with O_APPEND: no
   pipe, no reader the instance depends on, so it outlives its worker (``kill_children=
   False``) and keeps writing while no worker runs. Rotation is copy-and-truncate, done by
   the worker while it lives (logrotate's ``copytruncate``) as soon as it hears the file
   pass its cap (`worker.logwatch`: the kernel says when a file is written), and on its
   tick where it cannot hear: the live file's
   bytes are copied to ``<stream>.log.1`` (older copies move up to ``.2`` ..), then the live
   file is truncated, and the process's next O_APPEND write lands at its new start. A
   separate shipper process per instance would survive the worker too, but it costs a
   process per instance and becomes something the instance depends on (its pipe's reader
   dying would kill it with SIGPIPE).
2. The price, said plainly: bytes the process writes between the last read of the copy and
   the truncate are lost, and counted as skipped (a writer of the worker's own waits for
   the rotation instead: `worker.logturns`); a copy chases what arrives while it is made
   only up to the cap (a writer faster than the copy would keep it chasing), and the
   rest up to the truncate is skipped too; a file may hold what is written while the worker
   hears it pass the cap (a tick's output where it cannot hear); and while no worker runs
   nothing rotates, so a live file grows until a worker is back (then, if it is past twice
   the cap, the copy keeps only the newest `max_bytes` and the rest counts as skipped).
3. Positions (`shared.logstream` rule 2) are kept in ``output.json``: per stream the position
   of the live file's first byte and of each rotated copy's, and marks (time, position)
   taken on the tick whenever the stream grew - what ``--since`` is answered from, to the
   tick (output written while no worker ran is dated when the next worker first saw it).
   At most `MARKS_MAX` marks are kept; past that the older half is thinned.
4. A stream keeps at most `files` files of `max_bytes` each, the live one included (1: the
   live file only, truncated when full). An ended instance's directory stays `keep_s` after
   it ended, and only the newest `keep_max` of them: then it is removed, its logs with it.
5. The directory may belong to the instance (`worker.isolation`), which can put links or
   FIFOs where the worker's files go: the worker opens nothing there through a link
   (``O_NOFOLLOW``), reads only regular files (what it serves as logs, or quotes in a
   failure's detail, is the instance's own output and nothing else), makes its temporary
   files anew (``O_EXCL``) and never blocks on one.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import logging
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import msgspec

from gavel.shared.logstream import CHUNK_MAX, STREAMS
from gavel.worker.logturns import turn

__all__ = ["MARKS_MAX", "META", "LogLimits", "Output", "Outputs", "open_regular"]

log = logging.getLogger("gavel.worker.logs")

META = "output.json"
MARKS_MAX = 2048
_COPY_BLOCK = 1 << 20
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class LogLimits:
    """How much output a node keeps (rule 4); the worker's config sets them."""

    max_bytes: int = 10 * 2**20
    files: int = 3
    keep_s: float = 86_400.0
    keep_max: int = 100


class _StreamMeta(msgspec.Struct):
    #: Position of the live file's first byte.
    base: int = 0
    #: Position of the first byte of ``.1``, ``.2``, ... (newest first).
    starts: list[int] = msgspec.field(default_factory=list)
    #: (time, position): everything before position was written by then.
    marks: list[tuple[float, int]] = msgspec.field(default_factory=list)


class _Meta(msgspec.Struct):
    streams: dict[str, _StreamMeta] = msgspec.field(default_factory=dict)
    #: When the instance ended (Unix time; 0: it has not, as far as this node saw) and how.
    ended_at: float = 0.0
    ended: str = ""


_dec = msgspec.json.Decoder(_Meta)
_enc = msgspec.json.Encoder()


class Output:
    """One instance's output directory."""

    def __init__(self, directory: Path, limits: LogLimits) -> None:
        self.dir = directory
        self.limits = limits
        self.meta = self._load()
        self._saved = _enc.encode(self.meta)

    # -- the files ------------------------------------------------------------------------
    def live(self, stream: str) -> Path:
        return self.dir / f"{stream}.log"

    def rotated(self, stream: str, k: int) -> Path:
        return self.dir / f"{stream}.log.{k}"

    def _stream(self, stream: str) -> _StreamMeta:
        return self.meta.streams.setdefault(stream, _StreamMeta())

    def _load(self) -> _Meta:
        try:
            meta = _dec.decode((self.dir / META).read_bytes())
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            meta = _Meta()
        for stream in STREAMS:  # files without positions (an older worker): contiguous
            if stream not in meta.streams:
                sizes = []
                k = 1
                while (size := _size(self.rotated(stream, k))) is not None:
                    sizes.append(size)
                    k += 1
                starts: list[int] = []
                pos = 0
                for size in reversed(sizes):
                    starts.insert(0, pos)
                    pos += size
                meta.streams[stream] = _StreamMeta(base=pos, starts=starts)
        return meta

    def save(self) -> None:
        """Write ``output.json`` if it changed (atomically; a lost one costs only marks)."""
        data = _enc.encode(self.meta)
        if data == self._saved:
            return
        tmp = self.dir / f".{META}.tmp"
        try:
            _write_new(tmp, data)
            os.replace(tmp, self.dir / META)
        except OSError as exc:
            log.warning("cannot write %s: %s", self.dir / META, exc)
            return
        self._saved = data

    def segments(self, stream: str) -> list[tuple[int, int, Path]]:
        """(start, end, file) of what is kept, oldest first; ends from the files' sizes."""
        m = self._stream(stream)
        out = []
        for k in range(len(m.starts), 0, -1):
            size = _size(self.rotated(stream, k))
            if size is not None:
                start = m.starts[k - 1]
                out.append((start, start + size, self.rotated(stream, k)))
        out.append((m.base, m.base + (_size(self.live(stream)) or 0), self.live(stream)))
        return out

    def end(self, stream: str) -> int:
        m = self._stream(stream)
        return m.base + (_size(self.live(stream)) or 0)

    # -- the tick: marks and rotation (rules 1-3) ----------------------------------------
    def tick(self, now: float) -> None:
        for stream in STREAMS:
            m = self._stream(stream)
            size = _size(self.live(stream))
            if size is None:
                continue
            pos = m.base + size
            if not m.marks or pos > m.marks[-1][1]:
                m.marks.append((now, pos))
                if len(m.marks) > MARKS_MAX:
                    half = len(m.marks) // 2
                    m.marks[:half] = m.marks[:half:2]
            if size > self.limits.max_bytes:
                self._rotate(stream, m)
        self.save()

    def check(self, stream: str, now: float) -> None:
        """The stream was written: rotate it now if it is past the cap (rule 1), with a
        mark for what it held."""
        size = _size(self.live(stream))
        if size is None or size <= self.limits.max_bytes:
            return
        m = self._stream(stream)
        pos = m.base + size
        if not m.marks or pos > m.marks[-1][1]:
            m.marks.append((now, pos))
        self._rotate(stream, m)
        self.save()

    def _rotate(self, stream: str, m: _StreamMeta) -> None:
        keep = self.limits.files - 1
        live = self.live(stream)
        tmp = self.dir / f".{stream}.log.rotating"
        with turn(self.dir):
            self._copy_truncate(stream, m, live, tmp, keep)

    def _copy_truncate(self, stream: str, m: _StreamMeta, live: Path, tmp: Path,
                       keep: int) -> None:
        try:
            fd = os.open(live, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            log.warning("cannot rotate %s: %s", live, exc)
            return
        try:
            size = os.fstat(fd).st_size
            # Rotated whole at the first tick past the cap (a copy may hold a tick's output
            # more than the cap); far past it, only the newest `max_bytes` (rule 2).
            start = 0 if size <= 2 * self.limits.max_bytes else size - self.limits.max_bytes
            if start:  # from the start of a line
                cut = os.pread(fd, CHUNK_MAX, start - 1).find(b"\n")
                start += cut if cut >= 0 else 0
            copied = start
            # Rule 2: what arrives while the copy is made is chased up to the cap, no more.
            most = start + max(size - start, self.limits.max_bytes)
            if keep:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
                out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                try:
                    while True:  # until no more arrives: the truncate follows at once
                        block = os.pread(fd, min(_COPY_BLOCK, most - copied), copied)
                        if not block:
                            cut = os.fstat(fd).st_size  # rule 2: the rest is skipped
                            os.ftruncate(fd, 0)
                            break
                        while block:
                            block = block[os.write(out, block):]
                        copied = os.lseek(out, 0, os.SEEK_CUR) + start
                finally:
                    os.close(out)
            else:
                cut = copied = max(copied, os.fstat(fd).st_size)
                os.ftruncate(fd, 0)
        except OSError as exc:
            log.warning("cannot rotate %s: %s", live, exc)
            with contextlib.suppress(OSError):
                tmp.unlink()
            return
        finally:
            os.close(fd)
        new_start = m.base + start
        m.base += max(copied, cut)
        if keep:
            with contextlib.suppress(FileNotFoundError):
                self.rotated(stream, keep).unlink()
            for k in range(keep - 1, 0, -1):
                with contextlib.suppress(FileNotFoundError):
                    os.replace(self.rotated(stream, k), self.rotated(stream, k + 1))
            os.replace(tmp, self.rotated(stream, 1))
            m.starts = [new_start, *m.starts][:keep]
        oldest = self.segments(stream)[0][0]
        m.marks = [mk for mk in m.marks if mk[1] > oldest] or m.marks[-1:]

    # -- reading --------------------------------------------------------------------------
    def read(self, stream: str, pos: int, limit: int = CHUNK_MAX) -> tuple[bytes, int, int]:
        """Up to `limit` bytes from `pos`: (data, the position after it, bytes skipped
        because they were rotated away). A chunk that stops short of the end stops after
        its last line end, when it has one (`shared.logstream` rule 3)."""
        skipped = 0
        for start, end, path in self.segments(stream):
            if pos >= end:
                continue
            if pos < start:
                skipped += start - pos
                pos = start
            try:
                with open_regular(path) as f:
                    f.seek(pos - start)
                    data = f.read(min(limit, end - pos))
            except OSError:
                continue
            if len(data) == limit and pos + len(data) < self.end(stream):
                cut = data.rfind(b"\n")
                if cut >= 0:
                    data = data[:cut + 1]
            return data, pos + len(data), skipped
        end = self.end(stream)
        if pos > end:  # the cursor of a file that was replaced: start again at its end
            return b"", end, 0
        return b"", pos, skipped

    def first(self, stream: str) -> int:
        return self.segments(stream)[0][0]

    def tail_start(self, stream: str, lines: int) -> int:
        """Where the last `lines` lines of the stream begin (the oldest kept, if fewer)."""
        segs = self.segments(stream)
        oldest, end = segs[0][0], self.end(stream)
        if lines <= 0:
            return end
        last, _, _ = self.read(stream, end - 1, 1) if end > oldest else (b"", 0, 0)
        hi = end - 1 if last == b"\n" else end  # the last line's own newline does not count
        need = lines
        for start, seg_end, path in reversed(segs):
            top = min(hi, seg_end)
            while top > start:
                lo = max(start, top - CHUNK_MAX)
                try:
                    with open_regular(path) as f:
                        f.seek(lo - start)
                        block = f.read(top - lo)
                except OSError:
                    break
                i = len(block)
                while (i := block.rfind(b"\n", 0, i)) >= 0:
                    need -= 1
                    if need == 0:
                        return lo + i + 1
                top = lo
            hi = start
        return oldest

    def since_start(self, stream: str, t: float) -> int:
        """Where output written at or after `t` begins, to the tick (rule 3): after the last
        mark taken before `t`, at the start of a line."""
        m = self._stream(stream)
        oldest = self.first(stream)
        pos = oldest
        for mark_t, mark_pos in m.marks:
            if mark_t < t:
                pos = max(pos, mark_pos)
        pos = min(pos, self.end(stream))
        if pos > oldest:  # start at a line: skip the rest of one a mark cut
            before, _, _ = self.read(stream, pos - 1, 1)
            if before != b"\n":
                probe = pos
                while probe < self.end(stream):
                    data, nxt, _ = self.read(stream, probe)
                    if not data:
                        break
                    i = data.find(b"\n")
                    if i >= 0:
                        return probe + i + 1
                    probe = nxt
        return pos

    def next_mark(self, stream: str, pos: int) -> tuple[float, int] | None:
        """The first mark after `pos`: by when the byte at `pos` was written, and where that
        mark's bytes end (None: written after the last mark)."""
        marks = self._stream(stream).marks
        i = bisect.bisect_right(marks, pos, key=lambda mk: mk[1])
        return marks[i] if i < len(marks) else None

    # -- the end ----------------------------------------------------------------------------
    def ended(self, at: float, how: str) -> None:
        self.meta.ended_at, self.meta.ended = at, how
        self.save()

    def restarted(self) -> None:
        """Another attempt writes here now: not ended any more."""
        self.meta.ended_at, self.meta.ended = 0.0, ""
        self.save()


class Outputs:
    """Every instance directory under ``<state_dir>/instances``: the tick, the retention
    (rule 4), and the `Output` of one instance for reading."""

    def __init__(self, root: Path, limits: LogLimits, held: Callable[[], Collection[str]],
                 clock: Callable[[], float] = time.time) -> None:
        self.root = root
        self.limits = limits
        self._held = held
        self._clock = clock
        self._open: dict[str, Output] = {}

    def held(self) -> list[str]:
        """The instances this node holds (whose output may grow)."""
        return list(self._held())

    def get(self, instance_id: str) -> Output | None:
        """The instance's output here, or None (no such directory, or an unusable id)."""
        if not _SAFE_ID.match(instance_id) or ".." in instance_id:
            return None
        out = self._open.get(instance_id)
        if out is not None and out.dir.is_dir():
            return out
        directory = self.root / instance_id
        if not directory.is_dir():
            self._open.pop(instance_id, None)
            return None
        out = self._open[instance_id] = Output(directory, self.limits)
        return out

    def tick(self) -> None:
        """Marks and rotation for every instance this node holds."""
        now = self._clock()
        for iid in list(self._held()):
            out = self.get(iid)
            if out is not None:
                out.tick(now)

    def written(self, instance_id: str, name: str) -> None:
        """The kernel says the instance wrote the file `name` (`worker.logwatch`): rotate
        it if it passed its cap (rule 1)."""
        stream = name.removesuffix(".log")
        if name.endswith(".log") and stream in STREAMS:
            out = self.get(instance_id)
            if out is not None:
                out.check(stream, self._clock())

    def ended(self, instance_id: str, how: str) -> None:
        out = self.get(instance_id)
        if out is not None:
            out.tick(self._clock())  # the last marks, and a rotation if it is due
            out.ended(self._clock(), how)

    def started(self, instance_id: str) -> None:
        out = self.get(instance_id)
        if out is not None and out.meta.ended_at:
            out.restarted()

    def sweep(self) -> list[str]:
        """Rule 4: remove the directories of instances that ended more than `keep_s` ago,
        and all but the newest `keep_max` ended ones; the ids removed."""
        try:
            entries = [p for p in self.root.iterdir() if p.is_dir() and _SAFE_ID.match(p.name)]
        except OSError:
            return []
        held = set(self._held())
        ended: list[tuple[float, str]] = []
        for path in entries:
            if path.name in held:
                continue
            out = self.get(path.name)
            at = out.meta.ended_at if out is not None and out.meta.ended_at else _newest(path)
            ended.append((at, path.name))
        ended.sort(reverse=True)
        now = self._clock()
        gone = [iid for i, (at, iid) in enumerate(ended)
                if i >= self.limits.keep_max or now - at > self.limits.keep_s]
        for iid in gone:
            if iid in set(self._held()):  # held again since the list was made
                continue
            shutil.rmtree(self.root / iid, ignore_errors=True)
            self._open.pop(iid, None)
            log.info("removed the output of ended instance %s", iid)
        return gone


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading only if it is a regular file reached without a link (rule
    5): a link the instance planted never makes the worker serve a file it may not read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{path.name} is not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _write_new(path: Path, data: bytes) -> None:
    """`data` into a new file at `path`: whatever was there (a link the instance planted in
    its own directory, rule 5) is replaced, never followed."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _size(path: Path) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _newest(path: Path) -> float:
    """The newest modification time in a directory without an end stamp."""
    newest = 0.0
    with contextlib.suppress(OSError):
        newest = path.stat().st_mtime
        for p in path.iterdir():
            with contextlib.suppress(OSError):
                newest = max(newest, p.stat().st_mtime)
    return newest
