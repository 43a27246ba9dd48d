"""`worker.logfiles` on real files: a writer holding its file open with O_APPEND (as the
driver opens it for the instance) keeps writing through copy-and-truncate rotations, every
byte keeps its position, the cap and the file count hold, tail and since find their lines,
and ended instances' directories are removed by their retention."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gavel.worker.logfiles import META, LogLimits, Output, Outputs


class Writer:
    """A stream file held open with O_APPEND, as an instance holds its stdout."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.written = b""

    def lines(self, start: int, n: int, width: int = 10) -> None:
        data = b"".join(f"{i:0{width - 1}d}\n".encode() for i in range(start, start + n))
        os.write(self.fd, data)
        self.written += data

    def close(self) -> None:
        os.close(self.fd)


def read_all(out: Output, stream: str, pos: int = 0) -> tuple[bytes, int, int]:
    data, skipped = b"", 0
    while True:
        got, pos, sk = out.read(stream, pos)
        skipped += sk
        if not got:
            return data, pos, skipped
        data += got


def test_rotation_keeps_every_position_and_the_writer_keeps_writing(tmp_path: Path) -> None:
    out = Output(tmp_path, LogLimits(max_bytes=1000, files=3))
    w = Writer(tmp_path / "stdout.log")
    t = 0.0
    for round_ in range(12):
        w.lines(round_ * 60, 60)  # 600 bytes a tick: a rotation every other tick
        t += 1
        out.tick(t)
        assert out.end("stdout") == len(w.written)
    w.close()
    live = (tmp_path / "stdout.log").read_bytes()
    assert b"\0" not in live  # the O_APPEND writer went on at the truncated file's start
    assert len(live) <= 1000 + 600
    for copy in tmp_path.glob("stdout.log.*"):
        assert copy.stat().st_size <= 1000 + 600  # a tick's output past the cap at most
    assert sorted(p.name for p in tmp_path.glob("stdout.log*")) == [
        "stdout.log", "stdout.log.1", "stdout.log.2"]
    data, end, skipped = read_all(out, "stdout")
    assert end == len(w.written)
    assert skipped + len(data) == len(w.written)
    assert data == w.written[skipped:]  # what is kept is the newest, byte for byte
    # A reader's cursor from before the rotations still means the same bytes.
    first = out.first("stdout")
    got, _, _ = out.read("stdout", first + 10, 20)
    assert got == w.written[first + 10:first + 30].rsplit(b"\n", 1)[0] + b"\n"
    # output.json keeps the positions: a new Output (a restarted worker) agrees.
    again = Output(tmp_path, LogLimits(max_bytes=1000, files=3))
    assert read_all(again, "stdout") == (data, end, skipped)


def test_one_file_means_truncate_and_the_rest_is_skipped(tmp_path: Path) -> None:
    out = Output(tmp_path, LogLimits(max_bytes=100, files=1))
    w = Writer(tmp_path / "stdout.log")
    w.lines(0, 30)  # 300 bytes
    out.tick(1.0)
    assert (tmp_path / "stdout.log").stat().st_size == 0
    assert not list(tmp_path.glob("stdout.log.*"))
    w.lines(30, 2)
    data, end, skipped = read_all(out, "stdout")
    assert (data, end, skipped) == (w.written[300:], 320, 300)
    w.close()


def test_a_file_far_over_the_cap_keeps_only_its_newest_bytes(tmp_path: Path) -> None:
    """While no worker ran nothing rotated: the first tick after keeps the newest cap (once
    the file is past twice the cap)."""
    w = Writer(tmp_path / "stdout.log")
    w.lines(0, 500)  # 5,000 bytes, no worker
    out = Output(tmp_path, LogLimits(max_bytes=1000, files=2))
    out.tick(1.0)
    assert (tmp_path / "stdout.log.1").stat().st_size == 1000
    data, end, skipped = read_all(out, "stdout")
    assert end == 5000 and skipped == 4000 and data == w.written[4000:]
    w.close()


def test_tail_finds_the_last_lines_across_a_rotation(tmp_path: Path) -> None:
    out = Output(tmp_path, LogLimits(max_bytes=100, files=3))
    w = Writer(tmp_path / "stdout.log")
    w.lines(0, 12)  # 120 bytes: rotated
    out.tick(1.0)
    w.lines(12, 3)  # 30 bytes in the live file
    for n in (1, 3, 5, 12):
        start = out.tail_start("stdout", n)
        data, _, _ = read_all(out, "stdout", start)
        assert data.splitlines() == w.written.splitlines()[-n:]
    assert out.tail_start("stdout", 0) == out.end("stdout")
    assert out.tail_start("stdout", 1000) == out.first("stdout")
    w.close()


def test_since_starts_after_the_last_mark_before_it(tmp_path: Path) -> None:
    out = Output(tmp_path, LogLimits())
    w = Writer(tmp_path / "stdout.log")
    for second in range(5):
        w.lines(second * 10, 10)
        out.tick(100.0 + second)  # marks at 100 .. 104, after each second's 10 lines
    for t, first_line in ((99.0, 0), (100.5, 10), (102.0, 20), (104.0, 40), (105.0, 50)):
        data, _, _ = read_all(out, "stdout", out.since_start("stdout", t))
        lines = data.splitlines()
        assert [int(x) for x in lines[:1]] == ([first_line] if first_line < 50 else [])
    w.close()


def test_marks_are_bounded(tmp_path: Path) -> None:
    from gavel.worker import logfiles

    out = Output(tmp_path, LogLimits())
    w = Writer(tmp_path / "stdout.log")
    for i in range(logfiles.MARKS_MAX + 500):
        w.lines(i, 1)
        out.tick(float(i))
    marks = out.meta.streams["stdout"].marks
    assert len(marks) <= logfiles.MARKS_MAX
    assert marks[-1] == (float(logfiles.MARKS_MAX + 499), len(w.written))
    assert [m[0] for m in marks] == sorted(m[0] for m in marks)
    w.close()


def test_files_without_positions_are_read_as_contiguous(tmp_path: Path) -> None:
    (tmp_path / "stdout.log.2").write_bytes(b"a\n")
    (tmp_path / "stdout.log.1").write_bytes(b"b\n")
    (tmp_path / "stdout.log").write_bytes(b"c\n")
    out = Output(tmp_path, LogLimits())
    assert read_all(out, "stdout") == (b"a\nb\nc\n", 6, 0)
    assert not (tmp_path / META).exists()  # nothing is written until something changes


def test_retention_removes_ended_directories_by_age_and_count(tmp_path: Path) -> None:
    now = [1000.0]
    held = {"running"}
    outputs = Outputs(tmp_path, LogLimits(keep_s=100.0, keep_max=2), held=lambda: held,
                      clock=lambda: now[0])
    for iid in ("running", "old", "a", "b", "c"):
        Writer(tmp_path / iid / "stdout.log").close()
    outputs.ended("old", "exited (exit 0)")
    now[0] += 150  # "old" ended 150 s ago
    for iid in ("a", "b", "c"):
        outputs.ended(iid, "exited (exit 0)")
        now[0] += 1
    assert sorted(outputs.sweep()) == ["a", "old"]  # too old; beyond the newest two
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "c", "running"]
    assert outputs.get("../etc") is None and outputs.get("running") is not None


@pytest.mark.parametrize("bad", ["", ".", "..", "../x", "a/b", "x" * 200])
def test_unusable_ids_have_no_output(tmp_path: Path, bad: str) -> None:
    assert Outputs(tmp_path, LogLimits(), held=list).get(bad) is None


def test_a_copy_that_keeps_only_the_newest_bytes_starts_at_a_line(tmp_path: Path) -> None:
    w = Writer(tmp_path / "stdout.log")
    w.lines(0, 500, width=7)  # 3,500 bytes, lines of 7: 3,500 - 1,000 is mid-line
    out = Output(tmp_path, LogLimits(max_bytes=1000, files=2))
    out.tick(1.0)
    data, _, skipped = read_all(out, "stdout")
    assert data.startswith(b"000") and data == w.written[skipped:]
    assert skipped % 7 == 0 and len(data) <= 1000
    w.close()
