"""The command line as a new user meets it: the real `gavel` as a child process against a
running cluster (a broker and workers in this process on a real nats-server).

What must hold: ports show in `submit` and `status`; ``--json`` prints JSON on every exit,
also "unschedulable" and every error; `nodes NODE` shows one node in detail; `events` takes
``--since`` and ``--limit`` and an instance that stays unschedulable is reported once per
reason, not every round; `drain --deadline` moves what is left at the deadline and undrain
clears the node from exclusion lists; `--version`; completion scripts made from the parser;
a NATS URL that is not one, or where nothing answers, exits 2 in one sentence; `config check`
tells a worker's file by its keys.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gavel import __version__
from gavel.cli.main import build_parser
from gavel.shared.messages import Spec
from gavel.transport.natsserver import free_port
from tests.integration.clibatch import Line, run_all
from tests.integration.harness import TIMING, Cluster, sleeper_spec, wait_for

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _clean() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GAVEL_")}
    clean["GAVEL_FAST_TIMERS"] = os.environ.get("GAVEL_FAST_TIMERS", "1")
    return clean


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gavel", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env={**_clean(), **(env or {})})


def run_many(tmp: Path, *lines: tuple[list[str], dict[str, str]], at_once: bool = False
             ) -> list[subprocess.CompletedProcess[str]]:
    """`run` for each (args, env), all in one child process (`tests.integration.clibatch`;
    `at_once`: side by side)."""
    return run_all([Line(args, ROOT, env) for args, env in lines], tmp / "results.json",
                   env=_clean(), at_once=at_once)


async def gavel(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """The command in a thread, so this test's cluster keeps serving it meanwhile."""
    return await asyncio.to_thread(run, *args, **kw)


def one_line(proc: subprocess.CompletedProcess[str], code: int) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


async def gavel_many(tmp: Path, *lines: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """`run_many` in a thread, for commands that only read (nothing happens in between)."""
    return await asyncio.to_thread(run_many, tmp, *((args, {}) for args in lines))


def error_json(proc: subprocess.CompletedProcess[str], code: int) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(proc.stdout)
    assert out["exit_code"] == code and out["error"].startswith("gavel ")
    return out


def write_spec(tmp: Path, name: str, body: str) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(f'name = "{name}"\n{body}')
    return path


SLEEPER = f'command = ["{sys.executable}", "-c", "import time; time.sleep(60)"]\n'


# -- without a cluster --------------------------------------------------------------------------

def test_version() -> None:
    proc = run("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"gavel {__version__}"


def _bash_complete(script: Path, words: list[str]) -> list[str]:
    line = " ".join(f"'{w}'" for w in words)
    code = (f'source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _gavel; '
            'printf "%s\\n" "${COMPREPLY[@]}"')
    proc = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=30,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completion_is_made_from_the_parser(tmp_path: Path) -> None:
    proc = run("completion", "bash")
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / "gavel.bash"
    script.write_text(proc.stdout)
    verbs = {a for a in build_parser()._subparsers._group_actions[0].choices}  # type: ignore
    assert set(_bash_complete(script, ["gavel", ""])) == verbs
    assert _bash_complete(script, ["gavel", "sta"]) == ["status"]
    assert {"--follow", "--since", "--limit", "--json", "--nats"} <= set(
        _bash_complete(script, ["gavel", "events", "--"]))
    assert _bash_complete(script, ["gavel", "up", "--log-format", ""]) == ["text", "json"]
    assert _bash_complete(script, ["gavel", "--version"]) == ["--version"]
    assert _bash_complete(script, ["gavel", "worker", "--strategy", "bin"]) == ["binpack"]
    assert _bash_complete(script, ["gavel", "completion", ""]) == ["bash", "zsh"]
    assert _bash_complete(script, ["gavel", "auth", ""]) == ["init", "operator"]
    # A flag's value is skipped: the verb after it still counts.
    assert "--deadline" in _bash_complete(script, ["gavel", "--", "drain", "--"]) or \
        "--deadline" in _bash_complete(script, ["gavel", "drain", "n1", "--"])


def test_zsh_completion_has_the_same_tables(tmp_path: Path) -> None:
    bash, zsh = run_many(tmp_path, (["completion", "bash"], {}), (["completion", "zsh"], {}))
    assert zsh.returncode == 0 and zsh.stdout.startswith("#compdef gavel")
    assert "compdef _gavel gavel" in zsh.stdout

    def tables(text: str) -> str:
        return text[text.index("_gavel_subs()"):text.index("_gavel_walk()")]
    assert tables(zsh.stdout) == tables(bash.stdout)
    if shutil.which("zsh"):
        check = subprocess.run(["zsh", "-n"], input=zsh.stdout, capture_output=True,
                               text=True, timeout=30)
        assert check.returncode == 0, check.stderr


def test_a_nats_url_that_is_not_one_or_where_nothing_answers_exits_2(tmp_path: Path) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    not_one, nodes, status, drain = run_many(
        tmp_path, (["status", "--nats", "htp://foo:bar:baz"], {}), (["nodes", "--nats", url], {}),
        (["status", "--json", "--nats", url], {}), (["drain", "--json"], {}),
        at_once=True)  # each waits out its connect where nothing answers: at once, once
    bad = one_line(not_one, 2)
    assert bad == ("gavel status: 'htp://foo:bar:baz' is not a NATS URL: expected "
                   "nats://HOST:PORT (or tls://, ws://, wss://).")
    nothing = one_line(nodes, 2)
    assert nothing.startswith(f"gavel nodes: nothing answers at {url}: ")
    # --json: the same, as one JSON object on stdout.
    assert error_json(status, 2)["error"].startswith(f"gavel status: nothing answers at {url}")
    # argparse's own refusals too
    assert drain.returncode == 2 and "required" in error_json(drain, 2)["error"]


def test_config_check_tells_a_worker_file_by_its_keys(tmp_path: Path) -> None:
    both = tmp_path / "both.toml"
    both.write_text('ports = [1, 2]\nref = "refs/heads/main"\n')
    common = tmp_path / "common.toml"
    common.write_text("metrics_port = 9100\n")
    gateway = tmp_path / "gateway.toml"
    gateway.write_text('admin = "http://127.0.0.1:2019"\ntrust_advertised_addresses = true\n')
    bookless = tmp_path / "bookless.toml"
    bookless.write_text('admin = "http://127.0.0.1:2019"\n')
    worker, mixed, shared, gw, broker, nobook = run_many(
        tmp_path,
        (["config", "check", str(ROOT / "compose" / "worker.toml")], {"GAVEL_NODE_ID": "worker-1"}),
        (["config", "check", str(both)], {}), (["config", "check", str(common)], {}),
        (["config", "check", str(gateway)], {}),
        (["config", "check", str(common), "--kind", "broker"], {"GAVEL_STATE": str(tmp_path)}),
        (["config", "check", str(bookless)], {}))
    assert worker.returncode == 0, worker.stderr
    assert worker.stdout.startswith("# effective worker config")
    assert one_line(mixed, 2).endswith(
        "sets keys only a worker reads (ports) and keys only a broker reads (ref): give "
        "--kind worker or --kind broker.")
    assert "only keys every daemon reads" in one_line(shared, 2)
    assert gw.returncode == 0, gw.stderr
    assert gw.stdout.startswith("# effective gateway config")
    assert broker.returncode == 0
    assert "--trust-advertised-addresses must say that is meant" in one_line(nobook, 2)


# -- against a cluster ------------------------------------------------------------------------

#: Every node here answers every round at once: a bid deadline no stall of a loaded machine
#: reaches (the agents share the test's loop), so no round reads "no node answered before the
#: bid deadline" where a test counts what each round said.
PATIENT = msgspec.structs.replace(TIMING, bid_deadline_s=max(TIMING.bid_deadline_s, 20.0))


@pytest.fixture
async def two(cluster: Cluster) -> Cluster:
    await cluster.start_broker(timing=PATIENT)
    await cluster.start_agent("node-a", labels={"zone": "a"}, port_range=(31200, 31299))
    await cluster.start_agent("node-b", labels={"zone": "b"}, port_range=(31300, 31399))
    await cluster.wait_nodes(2)
    return cluster


async def test_ports_show_in_submit_and_status(two: Cluster, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "web", SLEEPER + 'ports = ["http"]\ncpu = 0.5\n')
    proc = await gavel("submit", str(spec), "--id", "web-1", "--wait=running", "--nats", two.url)
    assert proc.returncode == 0, proc.stderr
    port = (await two.status("web-1")).ports["http"]
    assert proc.stdout.strip().endswith(f"(ports http={port})")
    proc = await gavel("status", "--nats", two.url)
    header, row = proc.stdout.splitlines()[:2]
    assert "PORTS" in header.split() and f"http={port}" in row.split()


async def test_json_on_unschedulable_and_on_errors(two: Cluster, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "gpu", SLEEPER + 'labels = { gpu = "true" }\n')
    proc = await gavel("submit", str(spec), "--id", "gpu-1", "--wait", "--json",
                       "--nats", two.url)
    out = error_json(proc, 3)
    assert out["instance_id"] == "gpu-1" and out["state"] == "unschedulable"
    assert "missing label gpu=true" in out["error"]
    proc = await gavel("status", "no-such", "--json", "--nats", two.url)
    assert "no such instance: no-such" in error_json(proc, 4)["error"]


async def test_nodes_node_shows_what_runs_there_and_its_declines(
        two: Cluster, tmp_path: Path) -> None:
    await two.submit(Spec(name="s", command=sleeper_spec("s").command, cpu=0.5,
                          memory_mb=256, labels={"zone": "a"}, ports=["http"]), "on-a")
    await two.submit(Spec(name="b", command=["true"], labels={"zone": "b", "gpu": "x"}),
                     "nowhere")

    async def seen() -> bool:
        running = (await two.status("on-a")).state == "running"
        return running and (await two.status("nowhere")).state == "unschedulable"
    await wait_for(seen, 15, what="one running, one unschedulable")
    proc, as_json, unknown = await gavel_many(
        tmp_path, ["nodes", "node-a", "--nats", two.url],
        ["nodes", "node-a", "--json", "--nats", two.url], ["nodes", "node-z", "--nats", two.url])
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert text.startswith("node-a: healthy")
    assert "committed: cpu 0.5/4, memory 256/4096 MB, ports 1/100 (range 31200-31299)" in text
    port = (await two.status("on-a")).ports["http"]
    assert "measured:  cpu 0.00 of the 0.5 held, memory 0.0 of the 256 MB held" in text
    assert any(line.split()[:6] == ["on-a", "running", "1", "-", "-", f"http={port}"]
               for line in text.splitlines())
    assert any(line.split()[0] == "nowhere" and "missing label" in line
               for line in text.splitlines() if line.startswith("    "))
    detail = json.loads(as_json.stdout)["detail"]
    assert [i["instance_id"] for i in detail["instances"]] == ["on-a"]
    assert detail["declines"][0]["instance_id"] == "nowhere"
    assert one_line(unknown, 4) == "gavel nodes: no such node: node-z"


async def test_events_since_and_limit_and_unschedulable_said_once_per_reason(
        two: Cluster, tmp_path: Path) -> None:
    broker = two.broker
    assert broker is not None
    await two.submit(Spec(name="g", command=["true"], labels={"gpu": "true"}), "gpu-2")
    rounds = broker.auctioneer.auctions_total
    await wait_for(lambda: broker.auctioneer.auctions_total >= rounds + 4, 30,
                   what="four rounds for the waiting instance")

    async def events(*flags: str) -> list[dict[str, Any]]:
        proc = await gavel("events", *flags, "--json", "--nats", two.url)
        assert proc.returncode == 0, proc.stderr
        return [json.loads(line) for line in proc.stdout.splitlines()]

    said = [e for e in await events("gpu-2") if e["type"] == "unschedulable"]
    assert len(said) == 1 and said[0]["detail"] == "0/2 nodes bid: 2 missing label gpu=true"
    await two.start_agent("node-c")  # a third node: the summary changes, and is said again
    await wait_for(lambda: len(broker.liveness.eligible(broker.now())) == 3, 15,
                   what="node-c")

    async def changed() -> bool:
        evs = [e for e in await events("gpu-2") if e["type"] == "unschedulable"]
        return len(evs) == 2
    await wait_for(changed, 30, what="the new summary")
    details = [e["detail"] for e in await events("gpu-2") if e["type"] == "unschedulable"]
    assert details[1] == "0/3 nodes bid: 3 missing label gpu=true"
    assert (await two.status("gpu-2")).detail == details[1]  # the record says it too

    async def each(*flags: list[str]) -> list[list[dict[str, Any]]]:
        out = []
        for proc in await gavel_many(tmp_path, *([*f, "--json", "--nats", two.url]
                                                 for f in flags)):
            assert proc.returncode == 0, proc.stderr
            out.append([json.loads(line) for line in proc.stdout.splitlines()])
        return out

    everything, last = await each(["events", "--limit", "0"], ["events", "--limit", "1"])
    # The submission's own (who asked: `broker.api` rule 9), then the two summaries.
    assert [e["type"] for e in everything] == ["requested", "unschedulable", "unschedulable"]
    assert last == everything[-1:]
    newest = everything[-1]["at"]
    await wait_for(lambda: time.time() > newest + 2, 10, what="two quiet seconds")
    assert await each(["events", "--since", "1s"], ["events", "--since", "1h"]) == [
        [], everything]


async def test_drain_deadline_moves_what_is_left_and_undrain_clears_exclusions(
        two: Cluster) -> None:
    await two.submit(sleeper_spec("d", cpu=0.5), "drained-1")

    async def placed() -> str:
        st = await two.status("drained-1")
        return str(st.node_id) if st.state == "running" else ""
    await wait_for(placed, 15, what="running")
    first = await placed()
    other = "node-b" if first == "node-a" else "node-a"
    proc = await gavel("drain", first, "--deadline", "2s", "--nats", two.url)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{first}: draining; what still runs there at ")
    assert (await two.status("drained-1")).node_id == first  # it waits for the deadline

    async def moved() -> bool:
        st = await two.status("drained-1")
        return bool(st.node_id == other and st.state == "running")
    await wait_for(moved, 30, what="the move at the deadline")
    rec = two.ledger().state().instances["drained-1"]
    assert first in rec.excluded
    proc = await gavel("drain", first, "--undo", "--nats", two.url)
    assert proc.returncode == 0, proc.stderr
    await wait_for(lambda: first not in two.ledger().state().instances["drained-1"].excluded,
                   15, what="the exclusion cleared")
