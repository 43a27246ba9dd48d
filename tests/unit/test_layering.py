"""shared/ is the pure core: no I/O, no clock, no shells.

Every ``.py`` under shared/ is parsed with `ast` (never imported), so a forbidden import fails
this test even where it sits behind ``if TYPE_CHECKING`` or inside a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"

#: Modules that do I/O, spawn work or read the clock: the shells' business.
FORBIDDEN = frozenset(
    {
        "asyncio",
        "nats",
        "pygit2",
        "subprocess",
        "socket",
        "psutil",
        "threading",
        "time",
        "datetime",
        "importlib",  # a dynamic import would slip past every other rule here
    }
)
#: The shells: the core must not depend on what is built around it.
SHELLS = frozenset({"broker", "worker", "sim"})
#: Clock reads, spelled as a call on a module or class attribute.
CLOCK_CALLS = frozenset(
    {
        ("time", "time"),
        ("time", "time_ns"),
        ("time", "monotonic"),
        ("time", "monotonic_ns"),
        ("time", "perf_counter"),
        ("time", "perf_counter_ns"),
        ("time", "process_time"),
        ("datetime", "now"),
        ("datetime", "utcnow"),
        ("datetime", "today"),
        ("date", "today"),
    }
)


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def violations(source: str, filename: str = "<source>") -> list[str]:
    """Every layering rule `source` breaks, as ``file:line: what``."""
    found: list[str] = []

    def flag(node: ast.AST, what: str) -> None:
        found.append(f"{filename}:{getattr(node, 'lineno', 0)}: {what}")

    def check_module(node: ast.AST, module: str) -> None:
        top = module.split(".", 1)[0]
        if top in FORBIDDEN:
            flag(node, f"imports {module}")
        if top in SHELLS:
            flag(node, f"imports the shell {module}")

    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                check_module(node, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                check_module(node, node.module)
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            parts = name.split(".")
            if len(parts) >= 2 and (parts[-2], parts[-1]) in CLOCK_CALLS:
                flag(node, f"reads the clock: {name}()")
            if name == "__import__":
                flag(node, "dynamic import: __import__()")
    return found


def _shared_files() -> list[Path]:
    return sorted(SHARED.rglob("*.py"))


def test_shared_tree_is_found() -> None:
    names = {p.relative_to(SHARED).as_posix() for p in _shared_files()}
    # A wrong path would make the layering test vacuous; pin a few modules we know exist.
    assert {"auction.py", "award.py", "messages.py", "strategies/base.py"} <= names


@pytest.mark.parametrize("path", _shared_files(), ids=lambda p: p.relative_to(SHARED).as_posix())
def test_shared_module_is_pure(path: Path) -> None:
    assert violations(path.read_text(encoding="utf-8"), str(path.relative_to(SHARED))) == []


# -- the checker itself must catch what it claims to ------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "import asyncio",
        "import nats.aio.client",
        "from nats import connect",
        "import pygit2 as git",
        "import subprocess",
        "from socket import socket",
        "import psutil",
        "import threading",
        "import time",
        "from time import monotonic",
        "import datetime",
        "from datetime import datetime",
        "import importlib",
        "def f():\n    import asyncio",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import asyncio",
        "import broker",
        "from broker.ledger import Ledger",
        "import worker.agent",
        "from sim import engine",
    ],
)
def test_checker_rejects_forbidden_import(source: str) -> None:
    assert violations(source)


@pytest.mark.parametrize(
    "source",
    [
        "t = time.time()",
        "t = time.monotonic()",
        "t = time.perf_counter()",
        "t = datetime.now()",
        "t = datetime.datetime.now()",
        "t = dt.datetime.utcnow()",
        "m = __import__('asyncio')",
    ],
)
def test_checker_rejects_clock_reads(source: str) -> None:
    assert violations(source)


@pytest.mark.parametrize(
    "source",
    [
        "import math",
        "from collections import Counter",
        "import msgspec",
        "from shared.award import pick",
        "from . import award",
        "import timing",  # a name that merely starts with 'time' is not the time module
        "from shared.timing import Timing",
        "x = now - opened_at",
    ],
)
def test_checker_allows_pure_code(source: str) -> None:
    assert violations(source) == []
