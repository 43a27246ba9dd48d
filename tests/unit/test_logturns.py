"""`worker.logturns`: a writer inside the worker (a container's output thread) and the
rotation take turns, so rotation's copy-and-truncate loses none of what it writes - a race
a process writing its own files cannot be spared (`worker.logfiles` rule 2)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

from gavel.worker.logfiles import LogLimits, Output
from gavel.worker.logturns import turn, writing

LINES = 60_000


CAP = 64 << 10


def _write(directory: Path, started: threading.Event) -> None:
    with open(directory / "stdout.log", "ab", buffering=0) as out, writing(directory) as lock:
        started.set()
        for i in range(LINES):
            with lock:
                out.write(b"line %d\n" % i)
            while os.fstat(out.fileno()).st_size > CAP * 3 // 2:  # a descheduled rotation
                time.sleep(0.001)  # must not let the file pass twice the cap (rule 2's cut)


def test_a_writer_of_the_workers_loses_no_line_to_rotation(tmp_path: Path) -> None:
    """Rotated as fast as one thread can while another writes: every rotated copy read as it
    is made, then the live file - every line is there once, in order."""
    d = tmp_path / "i"
    d.mkdir()
    out = Output(d, LogLimits(max_bytes=CAP, files=2))
    started = threading.Event()
    writer = threading.Thread(target=_write, args=(d, started))
    writer.start()
    started.wait()
    kept: list[bytes] = []
    while True:
        alive = writer.is_alive()
        before = out.meta.streams.get("stdout")
        base = before.base if before is not None else 0
        out.check("stdout", 0.0)
        if out.meta.streams.get("stdout") is not None and out.meta.streams["stdout"].base != base:
            kept.append((d / "stdout.log.1").read_bytes())
        if not alive:
            break
    writer.join()
    kept.append((d / "stdout.log").read_bytes())
    assert b"".join(kept).splitlines() == [b"line %d" % i for i in range(LINES)]


def test_without_a_writer_the_turn_holds_nothing(tmp_path: Path) -> None:
    with turn(tmp_path), writing(tmp_path) as lock:
        assert lock.acquire(blocking=False)  # the rotation held no lock of the writer's
        lock.release()
    with writing(tmp_path) as lock, turn(tmp_path):
        assert not lock.acquire(blocking=False)  # the rotation holds the writer's turn
    assert isinstance(turn(tmp_path), contextlib.nullcontext)  # its turn went with it
