"""The house's rules, read from the code: the pure core stays pure, imports run one way
(cli -> broker, worker, gateway, client, sim, bench -> transport -> shared), no import circles, one
namespace.

Every ``.py`` of every room is parsed with `ast` (never imported), so an import breaks these
rules wherever it sits: at the top, inside a function, behind ``if TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The rooms, as the `gavel` package names them (gavel/<room> links to <room>/).
ROOMS = ("shared", "transport", "broker", "worker", "gateway", "client", "cli", "sim",
         "bench")
SHARED = ROOT / "shared"

#: Modules that do I/O, spawn work or read the clock: the shells' business, never the core's.
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
#: Core modules that do calendar arithmetic (a cron expression's fire times in a time zone,
#: `gavel.shared.cron`): they may import `datetime` for its types and arithmetic, never to
#: read the clock - every clock read is still flagged in them.
CALENDAR = frozenset({"cron.py"})
#: The rooms each room may import besides itself (the one-way rule).
ALLOWED: Mapping[str, frozenset[str]] = {
    "shared": frozenset(),
    "transport": frozenset({"shared"}),
    "broker": frozenset({"shared", "transport"}),
    "worker": frozenset({"shared", "transport"}),
    "gateway": frozenset({"shared", "transport"}),
    "client": frozenset({"shared", "transport"}),
    "sim": frozenset({"shared", "transport"}),
    "bench": frozenset({"shared", "transport", "broker", "worker", "sim"}),
    "cli": frozenset({"shared", "transport", "broker", "worker", "gateway", "client", "sim",
                      "bench"}),
}
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


def imports(source: str, module: str = "gavel.x", is_package: bool = False) -> list[str]:
    """Every module `source` imports (absolute names; relative ones resolved from `module`)."""
    package = module if is_package else module.rpartition(".")[0]
    out: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            out.append(base)
            out += [f"{base}.{alias.name}" for alias in node.names]
    return out


def violations(source: str, filename: str = "<source>", calendar: bool = False) -> list[str]:
    """Every purity rule of the core `source` breaks, as ``file:line: what``; `calendar`: a
    `CALENDAR` module, which may import `datetime` (its clock reads are still flagged)."""
    found: list[str] = []
    forbidden = FORBIDDEN - {"datetime"} if calendar else FORBIDDEN

    def flag(node: ast.AST, what: str) -> None:
        found.append(f"{filename}:{getattr(node, 'lineno', 0)}: {what}")

    def check_module(node: ast.AST, module: str) -> None:
        top = module.split(".", 1)[0]
        if top in forbidden:
            flag(node, f"imports {module}")
        room = _room(module)
        if room is not None and room != "shared":
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


def _room(module: str) -> str | None:
    """The room a module name belongs to (``gavel.broker.ledger.plan`` -> broker), or None
    for anything outside gavel; the bare old names count too, so they are caught."""
    parts = module.split(".")
    if parts[0] == "gavel" and len(parts) > 1 and parts[1] in ROOMS:
        return parts[1]
    if parts[0] in ROOMS:
        return parts[0]
    return None


# -- the tree -----------------------------------------------------------------------------------
def _modules() -> dict[str, Path]:
    """Every module of every room, by its gavel.* name."""
    out: dict[str, Path] = {}
    for room in ROOMS:
        for path in sorted((ROOT / room).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            name = ".".join(("gavel", *rel.parts))
            out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the gavel modules it imports (a name is resolved to the longest module)."""
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for imported in imports(path.read_text(encoding="utf-8"), name,
                                path.name == "__init__.py"):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        edges[name] = targets
    return edges


def circles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(edges.get(root, ())))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(edges.get(w, ()))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def wrong_way(edges: Mapping[str, Iterable[str]]) -> list[str]:
    """Every import of a room that its room may not import (`ALLOWED`)."""
    out = []
    for a, targets in edges.items():
        ra = _room(a)
        for b in targets:
            rb = _room(b)
            if ra is not None and rb is not None and rb != ra and rb not in ALLOWED[ra]:
                out.append(f"{a} -> {b}")
    return sorted(out)


def test_every_room_is_found() -> None:
    # A wrong path would make every rule here vacuous; pin a few modules we know exist.
    assert {"gavel.shared.auction", "gavel.transport.wire", "gavel.broker.service",
            "gavel.broker.ledger.repository", "gavel.worker.agent", "gavel.cli.main",
            "gavel.sim.engine", "gavel.bench.run", "gavel.client.aio"} <= set(MODULES)
    for room in ROOMS:  # the gavel package names each room
        assert (ROOT / "gavel" / room).resolve() == (ROOT / room).resolve()


@pytest.mark.parametrize("path", sorted(SHARED.rglob("*.py")),
                         ids=lambda p: p.relative_to(SHARED).as_posix())
def test_shared_module_is_pure(path: Path) -> None:
    name = path.relative_to(SHARED).as_posix()
    assert violations(path.read_text(encoding="utf-8"), name, calendar=name in CALENDAR) == []


def test_imports_run_one_way() -> None:
    assert wrong_way(_graph(MODULES)) == []


def test_there_are_no_import_circles() -> None:
    assert circles(_graph(MODULES)) == []


def test_every_import_of_gavel_is_through_the_namespace() -> None:
    """Nothing imports ``shared`` or ``broker`` as a top-level name: only `gavel` is installed,
    and an import that works from the repository root would fail from site-packages."""
    bare = [f"{name}: {imported}" for name, path in MODULES.items()
            for imported in imports(path.read_text(encoding="utf-8"), name)
            if imported.split(".")[0] in ROOMS]
    tests = [f"{path}: {imported}" for path in sorted((ROOT / "tests").rglob("*.py"))
             for imported in imports(path.read_text(encoding="utf-8"))
             if imported.split(".")[0] in ROOMS]
    assert bare + tests == []


def test_the_worker_never_reaches_the_broker() -> None:
    """It runs on every host: what it imports is shared and transport, nothing else of ours."""
    graph = _graph(MODULES)
    reached: set[str] = set()
    todo = [m for m in MODULES if _room(m) == "worker"]
    while todo:
        m = todo.pop()
        if m not in reached:
            reached.add(m)
            todo += graph[m]
    assert {_room(m) for m in reached} <= {"worker", "transport", "shared"}


# -- the checkers themselves must catch what they claim to --------------------------------------


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
        "from gavel.broker.ledger import Ledger",
        "import gavel.worker.agent",
        "from gavel.sim import engine",
        "from gavel.transport import wire",
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
    assert violations(source, calendar=True)  # a calendar module reads no clock either


def test_a_calendar_module_may_import_datetime_and_nothing_else_forbidden() -> None:
    assert violations("from datetime import UTC, datetime", calendar=True) == []
    assert violations("import time", calendar=True)
    assert violations("from datetime import datetime\nt = datetime.now(UTC)", calendar=True)


@pytest.mark.parametrize(
    "source",
    [
        "import math",
        "from collections import Counter",
        "import msgspec",
        "from gavel.shared.award import order",
        "from . import award",
        "import timing",  # a name that merely starts with 'time' is not the time module
        "from gavel.shared.timing import Timing",
        "x = now - opened_at",
    ],
)
def test_checker_allows_pure_code(source: str) -> None:
    assert violations(source) == []


def test_the_circle_finder_finds_a_circle_and_only_circles() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set(), "c": {"b"}}) == []


def test_the_one_way_rule_catches_arrows_that_run_back_up() -> None:
    edges = {"gavel.worker.agent": {"gavel.broker.service", "gavel.transport.wire"},
             "gavel.transport.wire": {"gavel.cli.config"},
             "gavel.broker.api": {"gavel.worker.metrics", "gavel.broker.ledger.plan"},
             "gavel.sim.cli": {"gavel.cli.parsers"},
             "gavel.cli.main": {"gavel.sim.engine", "gavel.bench.run"}}
    assert wrong_way(edges) == ["gavel.broker.api -> gavel.worker.metrics",
                                "gavel.sim.cli -> gavel.cli.parsers",
                                "gavel.transport.wire -> gavel.cli.config",
                                "gavel.worker.agent -> gavel.broker.service"]


def test_relative_imports_are_resolved_from_their_module() -> None:
    assert "gavel.broker.ledger.state" in imports("from .state import Change",
                                                   "gavel.broker.ledger.plan")
    assert "gavel.broker.api" in imports("from ..api import Api", "gavel.broker.ledger.plan")
    assert "gavel.broker.ledger.state" in imports("from . import state",
                                                   "gavel.broker.ledger", is_package=True)
