"""The code stays ruff-clean and mypy-strict-clean: checked in the suite, not by habit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_ruff_is_clean() -> None:
    pytest.importorskip("ruff")
    got = _run("ruff", "check", ".")  # the tree once: gavel/ holds links, not copies
    assert got.returncode == 0, got.stdout + got.stderr


def test_mypy_strict_is_clean() -> None:
    pytest.importorskip("mypy")
    got = _run("mypy")  # packages and strictness come from pyproject.toml
    assert got.returncode == 0, got.stdout + got.stderr


def test_every_dependency_is_locked() -> None:
    """`make test` installs with ``-c constraints.txt``: a dependency added to pyproject.toml
    without re-locking would be resolved afresh on every CI machine."""
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    locked = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            locked[re.sub(r"[-_.]+", "-", name).lower()] = version
    for req in wanted:
        if "sys_platform == 'win32'" in req:
            continue
        name = re.sub(r"[-_.]+", "-", re.split(r"[<>=!;\[ ]", req, maxsplit=1)[0]).lower()
        assert name in locked, f"{name} is not in constraints.txt: run `make lock`"
    assert locked["nats-py"].startswith("2.16."), "nats-py outside what wire.py is tested on"
