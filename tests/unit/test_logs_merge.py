"""`gavel logs SERVICE` merges its replicas' output in the order it was written: each chunk
says by when (`LogChunk.at`, the node's mark), and lines come out oldest first, each
instance's in its own order, those after the node's last mark (0) last."""

from __future__ import annotations

import argparse
import io
import sys

import pytest

from gavel.cli.logscmd import _Printer
from gavel.shared.logstream import LogChunk


def test_lines_of_several_instances_come_out_in_the_order_they_were_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    monkeypatch.setattr(sys, "stdout", out)
    args = argparse.Namespace(json=False, streams=["stdout"])
    printer = _Printer(args, prefixed=True, merge=True)
    arrivals = [("a", b"a1\na2\n", 10.0), ("a", b"a3\n", 30.0), ("a", b"a4\n", 0.0),
                ("b", b"b1\n", 20.0), ("b", b"b2\nb3", 30.0)]  # b: all of a's, then b's
    for iid, data, at in arrivals:
        printer.chunk(LogChunk(instance_id=iid, stream="stdout", data=data, end=0, at=at))
    assert out.buffer.getvalue() == b""  # nothing until every answer is in
    printer.flush("a")
    printer.flush("b")
    printer.finish()
    assert out.buffer.getvalue().decode().splitlines() == [
        "[a] a1", "[a] a2", "[b] b1", "[a] a3", "[b] b2", "[b] b3", "[a] a4"]
