"""The first day's wrong answers (issue 30), each reproduced against the real thing: `gavel`
child processes, a real nats-server, a broker and workers in this process.

What must hold: `gavel up`'s children import the installed gavel wherever it runs; a reader
that goes away (`| head`) ends `logs`, `events` and `services` quietly with 141; `make run`
says its timers are fast.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gavel import __version__
from gavel.cli import up
from gavel.shared.api import DeployReply, DeployRequest
from gavel.shared.messages import Spec
from gavel.shared.timing import fast_banner
from tests.integration.harness import Cluster, UpDemo, wait_for

pytestmark = pytest.mark.integration
GAVEL = [sys.executable, "-m", "gavel"]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "GAVEL_CREDS"}


def to_nobody(*args: str) -> subprocess.CompletedProcess[str]:
    """`gavel ARGS | true` where `true` is gone before the first write: stdout is a pipe
    whose reading end is already closed."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([*GAVEL, *args], stdout=w, stderr=subprocess.PIPE, text=True,
                              timeout=90, env=_env())
    finally:
        os.close(w)


def lines_of(n: int) -> list[str]:
    return [sys.executable, "-c", f"for i in range({n}): print('line', i)"]


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


async def test_a_reader_that_goes_away_ends_the_command_quietly(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    await cluster.submit(Spec(name="many", command=lines_of(20000)), "many-1")
    await cluster.call("deploy", DeployRequest(spec=Spec(
        name="svc", type="service", count=1, command=[sys.executable, "-c",
                                                      "import time; time.sleep(600)"],
        cpu=0.1, memory_mb=16)), DeployReply)

    async def done() -> bool:
        return bool((await cluster.status("many-1")).state == "succeeded")
    await wait_for(done, 30, what="the printer to finish")
    for args in (["logs", "many-1"], ["events"], ["services"]):
        proc = await asyncio.to_thread(to_nobody, *args, "--nats", cluster.url)
        assert (proc.returncode, proc.stderr) == (141, ""), (args, proc.stderr[-3000:])


def test_make_run_says_its_timers_are_fast(up_demo: UpDemo) -> None:
    """`make run` (and the demo the suite runs, under the same ``GAVEL_FAST_TIMERS=1``)
    says its clocks are not production's."""
    assert up_demo.proc.returncode == 0, up_demo.proc.stdout + up_demo.proc.stderr
    assert ("timers: fast, every clock 10x shorter than production (GAVEL_FAST_TIMERS=1: "
            "heartbeat 1s, node offline after 12s); unset it for production timers"
            ) in up_demo.proc.stdout.splitlines()
    assert fast_banner({}) == "" and fast_banner({"GAVEL_FAST_TIMERS": "0"}) == ""
