"""The first day's wrong answers (issue 30), each reproduced against the real thing: `gavel`
child processes, a real nats-server, a broker and workers in this process.

What must hold: `gavel up`'s children import the installed gavel wherever it runs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gavel import __version__
from gavel.cli import up

pytestmark = pytest.mark.integration


def test_up_children_import_the_installed_gavel_whatever_the_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shadow = tmp_path / "gavel"  # a clone's parent holds a folder named gavel
    shadow.mkdir()
    (shadow / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "child.log"
    child = up._spawn("version", ["--version"], log, dict(os.environ))
    assert child.proc.wait(60) == 0, log.read_text()
    assert log.read_text().strip() == f"gavel {__version__}"
