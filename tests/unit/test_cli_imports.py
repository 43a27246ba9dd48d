"""What a verb loads (`gavel.cli.main` rule 4): `gavel worker`, idle on every node, imports
none of the client verbs, the HTTP API, the dashboard or prometheus_client unless it serves
metrics; a client verb still finds its module where it runs."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gavel.cli.config import WorkerConfig
from gavel.cli.workerdaemon import _agent_class
from gavel.worker.agent import Agent
from gavel.worker.metrics import ObservedAgent

#: What the worker daemon never uses. prometheus_client's package import alone brings its
#: HTTP server and exposition (http.server, urllib.request, wsgiref).
NEVER_IN_A_WORKER = frozenset({
    "gavel.cli.commands", "gavel.cli.auth", "gavel.cli.plancmd", "gavel.cli.execcmd",
    "gavel.cli.logscmd", "gavel.cli.tunecmd", "gavel.cli.up", "gavel.cli.api.app",
    "gavel.cli.ui.app", "gavel.client", "gavel.client.aio", "prometheus_client",
    "gavel.worker.metrics", "gavel.cli.metrics_http", "http.server", "urllib.request",
    "wsgiref",
})

#: Runs `gavel` as `python -m gavel` does, with the agent's run replaced by a look at the
#: modules loaded by then, and writes {code, modules at the end, modules at the run} to argv[1].
_RUN = """
import json, sys
from gavel.cli.main import main
from gavel.worker.agent import Agent

out = sys.argv.pop(1)
ran = None

async def run(self):
    global ran
    ran = sorted(sys.modules)

Agent.run = run
code = main(sys.argv[1:])
json.dump({"code": code, "modules": sorted(sys.modules), "ran": ran}, open(out, "w"))
"""
#: A worker that touches nothing of the host's: no cgroups, no uids, no container engine.
_WORKER = ["worker", "--nats", "nats://127.0.0.1:9", "--node-id", "n1", "--cpu", "4",
           "--memory-mb", "4096", "--cgroups", "off", "--isolation", "off", "--engine", "off"]


def _loaded(tmp_path: Path, *argv: str) -> dict[str, Any]:
    out = tmp_path / "modules.json"
    proc = subprocess.run([sys.executable, "-c", _RUN, str(out), *argv],
                          capture_output=True, text=True, timeout=120, check=False)
    assert out.exists(), proc.stderr
    got: dict[str, Any] = json.loads(out.read_text())
    return got


def test_a_worker_loads_no_client_verb_server_or_metrics(tmp_path: Path) -> None:
    got = _loaded(tmp_path, *_WORKER, "--state", str(tmp_path / "state"))
    assert got["code"] == 0 and got["ran"] is not None  # the agent was made and run
    assert sorted(set(got["ran"]) & NEVER_IN_A_WORKER) == []


def test_a_worker_serving_metrics_counts_what_it_sends(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    got = _loaded(tmp_path, *_WORKER, "--state", str(tmp_path / "state"),
                  "--metrics-port", str(port))
    assert got["code"] == 0
    assert {"gavel.worker.metrics", "prometheus_client"} <= set(got["ran"])


def test_a_client_verb_still_loads_its_module(tmp_path: Path) -> None:
    got = _loaded(tmp_path, "status", "--nats", "nats://127.0.0.1:9")
    assert got["code"] == 2  # nothing answers there: a sentence, as ever
    assert {"gavel.cli.commands", "gavel.client"} <= set(got["modules"])


@pytest.mark.parametrize(("port", "kind"), [(None, Agent), (9101, ObservedAgent)])
def test_the_agent_is_an_observed_one_only_with_a_metrics_port(
        port: int | None, kind: type[Agent]) -> None:
    assert _agent_class(WorkerConfig(metrics_port=port)) is kind
