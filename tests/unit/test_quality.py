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
