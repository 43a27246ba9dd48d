"""The writer process is an optimisation, never a condition for committing: where POSIX
semaphores are missing (a container without /dev/shm) the broker writes on a thread."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from broker import gitwriter
from broker.ledger import Ledger, encode
from shared.records import NodeFile


def test_no_semaphores_means_a_thread_writer(monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture,
                                             tmp_path: Path) -> None:
    def no_shm(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(gitwriter, "ProcessPoolExecutor", no_shm)
    with caplog.at_level(logging.WARNING, logger="gavel.broker"):
        pool = gitwriter.make_executor("process")
    try:
        assert isinstance(pool, ThreadPoolExecutor)
        assert "commits are written on a thread" in caplog.text
        ledger = Ledger(tmp_path / "state.git")
        files = {"nodes/a/node.json": encode(NodeFile(node_id="a"))}
        sha = pool.submit(ledger.write_files, files, "m", None).result()
        assert Ledger(tmp_path / "state.git").state().head == sha  # a fresh reader sees it
    finally:
        pool.shutdown()


def test_unknown_writer_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="writer must be 'process' or 'thread'"):
        gitwriter.make_executor("fork")
