"""The `gavel` command's client verbs have one way to the API: `gavel.client` (issue 34's
"one implementation of each verb"). None of their modules asks `gavel.transport.client`
(its `call`, `connect`, `status`) itself; the API's errors come through `gavel.client` too.
Parsed with `ast`, never imported, as `test_layering` reads the code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CLI = Path(__file__).resolve().parents[2] / "cli"
#: The modules of the verbs the API serves: submit (and its waits), status, nodes, why,
#: events, cancel, drain, routes, deploy, services, scale, stop, rollback, plan, logs, exec.
VERBS = ("commands", "readouts", "services", "plancmd", "systemwait", "logs", "logscmd",
         "execcmd")


def _transport_client_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module in (
                "gavel.transport.client", "gavel.transport"):
            found += [f"{node.module}.{a.name}" for a in node.names
                      if node.module == "gavel.transport.client" or a.name == "client"]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name == "gavel.transport.client"]
    return found


@pytest.mark.parametrize("module", VERBS)
def test_a_client_verb_goes_through_gavel_client(module: str) -> None:
    assert _transport_client_imports(CLI / f"{module}.py") == []
