"""The `gavel` command's client verbs have one way to the API: `gavel.client` (issue 34's
"one implementation of each verb"). None of their modules asks `gavel.transport.client`
(its `call`, `connect`, `status`) or the event, log and exec clients beside it itself; the
API's errors come through `gavel.client` too.
Parsed with `ast`, never imported, as `test_layering` reads the code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CLI = Path(__file__).resolve().parents[2] / "cli"
#: The modules of the verbs the API serves: submit (and its waits), status, nodes, why,
#: events, cancel, drain, routes, deploy, services, scale, stop, rollback, plan, tune, logs,
#: exec; and the other operator clients of the command: `gavel up` (and its demo) and the
#: dashboard and the HTTP API.
VERBS = ("commands", "readouts", "services", "plancmd", "tunecmd", "systemwait", "logs",
         "logscmd", "execcmd", "up", "updemo", "ui/app", "ui/feed", "ui/logs", "api/app",
         "api/routes")


def _transport_client_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module in (
                "gavel.transport.client", "gavel.transport", "gavel.transport.eventstream",
                "gavel.transport.logclient", "gavel.transport.execclient"):
            found += [f"{node.module}.{a.name}" for a in node.names
                      if node.module != "gavel.transport"
                      or a.name in ("client", "eventstream", "logclient", "execclient")]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name in (
                "gavel.transport.client", "gavel.transport.eventstream",
                "gavel.transport.logclient", "gavel.transport.execclient")]
    return found


@pytest.mark.parametrize("module", VERBS)
def test_a_client_verb_goes_through_gavel_client(module: str) -> None:
    assert _transport_client_imports(CLI / f"{module}.py") == []


def _own_subscriptions(path: Path) -> list[str]:
    """Calls of a NATS subscription's methods: a wait loop of the command's own."""
    return [f"{path.name}:{node.lineno} .{node.func.attr}"
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("subscribe", "next_msg")]


@pytest.mark.parametrize("module", VERBS)
def test_a_client_verb_waits_through_gavel_client(module: str) -> None:
    """`submit --wait` (each kind), `deploy --wait`: the client's waits, none of the
    command's own (`gavel.client.runwait`, `jobwait`, `deploywait`)."""
    assert _own_subscriptions(CLI / f"{module}.py") == []
