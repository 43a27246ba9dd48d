"""The house's sizes: a function reads on one screen (under 80 lines), a module is one
concept (at most 500 lines). A function that grows past it is a composition to split into
named steps, a module past it a second concept to move out."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROOMS = ["shared", "transport", "broker", "worker", "gateway", "client", "cli", "sim", "bench"]
MAX_FUNCTION = 79
MAX_MODULE = 500


def _modules() -> list[Path]:
    return sorted(p for room in ROOMS for p in (ROOT / room).rglob("*.py"))


def _long_functions(source: str, name: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_FUNCTION:
                found.append(f"{name}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_every_function_reads_on_one_screen() -> None:
    long = [f for p in _modules()
            for f in _long_functions(p.read_text(), str(p.relative_to(ROOT)))]
    assert long == [], f"functions of {MAX_FUNCTION + 1} lines or more: {long}"


#: Modules past the size, each with the split it waits for; an entry back within the size
#: fails too, so the list only shrinks.
OVER: dict[str, str] = {}


def test_every_module_is_one_concept() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in _modules()}
    big = [f"{name} ({n} lines)" for name, n in sizes.items()
           if n > MAX_MODULE and name not in OVER]
    assert big == [], f"modules over {MAX_MODULE} lines: {big}"
    assert [name for name in OVER if sizes.get(name, 0) <= MAX_MODULE] == []


def test_the_length_check_counts_a_function_whole() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION))
    assert _long_functions(f"def f():\n{body}\n", "m") == ["m:1 f (80 lines)"]
    short = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION - 1))
    assert _long_functions(f"async def g():\n{short}\n", "m") == []
