"""Process-level choices of the broker: the writer process is an optimisation, never a
condition for committing (where POSIX semaphores are missing - a container without
/dev/shm - the broker writes on a thread), and GC tuning belongs to the process owner."""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gavel.broker.ledger import gitwriter
from gavel.broker.ledger.repository import Ledger, encode
from gavel.shared.records import NodeFile
from gavel.shared.timing import Timing


def test_no_semaphores_means_a_thread_writer(monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture,
                                             tmp_path: Path) -> None:
    def no_shm(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(gitwriter, "ProcessPoolExecutor", no_shm)
    with caplog.at_level(logging.WARNING, logger="gavel.broker"):
        pool = gitwriter.make_executor("process", Timing().orphan_s)
    try:
        assert isinstance(pool, ThreadPoolExecutor)
        assert "commits are written on a thread" in caplog.text
        ledger = Ledger(tmp_path / "state.git")
        files = {"nodes/a/node.json": encode(NodeFile(node_id="a"))}
        sha = pool.submit(ledger.write_files, files, "m", None).result()
        assert Ledger(tmp_path / "state.git").state().head == sha  # a fresh reader sees it
    finally:
        pool.shutdown()


def test_the_writer_process_runs_nicer_than_its_broker() -> None:
    """`broker.ledger.gitwriter`: the writer's commits are throughput, the broker's loop
    latency; the writer process takes the CPU its broker leaves (`WRITER_NICE` steps nicer,
    as far as the system's lowest priority), and the broker's own priority is untouched."""
    mine = os.nice(0)
    pool = gitwriter.make_executor("process", Timing().orphan_s)
    try:
        assert pool.submit(os.nice, 0).result(timeout=60) == min(19, mine + gitwriter.WRITER_NICE)
    finally:
        pool.shutdown()
    assert os.nice(0) == mine
    assert gitwriter.WRITER_NICE > 0


def test_unknown_writer_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="writer must be 'process' or 'thread'"):
        gitwriter.make_executor("fork", Timing().orphan_s)


def test_tune_gc_is_the_process_owners_choice(tmp_path: Path) -> None:
    """`tune_gc` sets what it says in a process of its own; building a Broker (the library)
    leaves the interpreter's collector alone."""
    import subprocess
    import sys

    code = ("import gc; from gavel.broker.service import Broker, Config, tune_gc; "
            "from pathlib import Path; before = gc.get_threshold(); "
            f"Broker(Config(nats_url='nats://127.0.0.1:1', state_dir=Path({str(tmp_path)!r}), "
            "writer='thread')); assert gc.get_threshold() == before, before; "
            "tune_gc(); print(gc.get_threshold(), gc.get_freeze_count() > 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "(50000, 20, 10) True"


def test_the_writer_process_leaves_when_its_broker_is_killed(tmp_path: Path) -> None:
    """A broker killed outright never stops its writer; the writer notices and exits."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    code = ("import os, sys; from gavel.broker.ledger import gitwriter; "
            "from gavel.broker.ledger.state import encode; "
            "from gavel.shared.records import NodeFile; "
            "pool = gitwriter.make_executor('process', 1.0); "
            f"pool.submit(gitwriter.commit_files, {str(tmp_path / 'state.git')!r}, "
            "'refs/heads/main', {'nodes/a/node.json': encode(NodeFile(node_id='a'))}, 'm', "
            "None).result(); "
            "print(pool.submit(os.getpid).result(), flush=True); "
            "os.kill(os.getpid(), 9)")
    out = tmp_path / "out"  # a file, not a pipe: a writer left behind would hold a pipe open
    with out.open("w") as f:
        proc = subprocess.run([sys.executable, "-c", code], stdout=f, stderr=subprocess.STDOUT,
                              timeout=60, check=False)
    assert proc.returncode == -signal.SIGKILL, out.read_text()
    writer = int(out.read_text().strip())

    def gone() -> bool:
        try:
            return bool(psutil.Process(writer).status() == psutil.STATUS_ZOMBIE)
        except psutil.NoSuchProcess:
            return True

    deadline = time.monotonic() + 15
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.1)
    if not gone():
        os.kill(writer, signal.SIGKILL)
        raise AssertionError("the writer outlived its broker")
