"""Health checks (a spec's `checks`) against a real broker, real workers, real processes and
the real `gavel` command: http, tcp and exec checks passing and failing, health in status,
an unhealthy instance restarted under its policy, and ``gavel submit --wait`` on both."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from gavel.shared.messages import Event, Spec
from gavel.shared.reasons import Reason
from gavel.shared.spec import Check, Restart
from tests.integration.harness import Cluster, wait_for

pytestmark = pytest.mark.integration

PY = sys.executable
#: A back-off of an hour: an instance restarted under it stays put for the test's length.
PARKED = Restart(attempts=5, delay_s=3600.0, interval_s=7200.0)


async def gavel(*args: str) -> subprocess.CompletedProcess[str]:
    """The `gavel` command, run off the event loop the broker and workers serve on."""
    return await asyncio.to_thread(
        subprocess.run, [PY, "-m", "gavel", *args], capture_output=True, text=True,
        timeout=120, env={**os.environ, "GAVEL_LOG_LEVEL": "WARNING"})


def events(cluster: Cluster, iid: str, type_: str = "") -> list[Event]:
    assert cluster.broker is not None
    return [e for e in cluster.broker.events
            if e.instance_id == iid and (not type_ or e.type == type_)]


def http_server(gate: Path | None = None) -> list[str]:
    """A real ``python3 -m http.server`` on $PORT, started once `gate` exists (if given)."""
    wait = f"while [ ! -e '{gate}' ]; do sleep 0.02; done; " if gate else ""
    return ["sh", "-c", f"{wait}exec '{PY}' -m http.server \"$PORT\" --bind 127.0.0.1"]


def toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


async def test_a_healthy_http_service_is_checking_then_healthy(
        cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    gate = tmp_path / "go"
    spec = tmp_path / "web.toml"
    spec.write_text(f"""name = "web"
type = "service"
command = {toml_list(http_server(gate))}
ports = ["web"]

[[checks]]
type = "http"
port = "web"
path = "/"
interval_s = 0.2
failures = 100
""")
    url = cluster.url
    waiting = asyncio.create_task(gavel(
        "submit", str(spec), "--wait", "--id", "web-1", "--timeout", "90", "--json",
        "--nats", url))
    await wait_for(lambda: cluster.broker is not None
                   and "web-1" in cluster.broker.ledger.state().instances, 30, what="submitted")
    await wait_for(lambda: _health(cluster, "web-1") == ("running", "checking"), 30,
                   what="running, checking")
    table = await gavel("status", "--nats", url)
    assert table.returncode == 0, table.stderr
    head, row = table.stdout.splitlines()
    assert head.split() == ["INSTANCE", "STATE", "HEALTH", "NODE", "ATTEMPT", "RESTARTS",
                            "CPU", "MEM", "MB", "PORTS", "REASON"]
    port = f"web={(await cluster.status('web-1')).ports['web']}"
    # No cgroups on this node: nothing measured, said as "-".
    assert row.split() == ["web-1", "running", "checking", "node-a", "1", "0", "-", "-", port]
    assert not waiting.done()  # --wait waits for healthy, not merely placed or running

    gate.touch()  # the server starts listening: the check passes
    proc = await asyncio.wait_for(waiting, 90)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["instance_id"], out["state"], out["health"], out["node_id"]) == (
        "web-1", "running", "healthy", "node-a")
    kinds = [e.type for e in events(cluster, "web-1")]
    assert kinds.index("running") < kinds.index("healthy")

    table = await gavel("status", "web-1", "--nats", url)
    assert table.stdout.splitlines()[1].split() == ["web-1", "running", "healthy", "node-a",
                                                    "1", "0", "-", "-", port]
    (st,) = json.loads((await gavel("status", "web-1", "--json", "--nats", url)).stdout)
    assert (st["health"], st["check"], st["restarts"]) == ("healthy", "", 0)
    why = await gavel("why", "web-1", "--nats", url)
    assert why.stdout.splitlines()[0] == "web-1: running on node-a, healthy"
    again = await gavel("submit", str(spec), "--wait", "--timeout", "60", "--nats", url)
    assert again.returncode == 0, again.stderr
    assert " healthy on node-a (ports web=" in again.stdout.strip()


def _health(cluster: Cluster, iid: str) -> tuple[str, str]:
    assert cluster.broker is not None
    rec = cluster.broker.ledger.state().instances[iid]
    st = cluster.broker.api.views.instance_status(rec)
    return st.state, st.health


def _health_restarts(cluster: Cluster, iid: str) -> tuple[str, int]:
    assert cluster.broker is not None
    rec = cluster.broker.ledger.state().instances[iid]
    st = cluster.broker.api.views.instance_status(rec)
    return st.health, st.restarts


async def test_an_http_check_that_404s_is_unhealthy_restarted_and_wait_says_why(
        cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    spec = tmp_path / "web.toml"
    spec.write_text(f"""name = "web"
type = "service"
command = {toml_list(http_server())}
ports = ["web"]
attempts = 1
restart = {{ attempts = 1, delay_s = 0.2, interval_s = 60 }}

[[checks]]
type = "http"
port = "web"
path = "/missing"
interval_s = 0.2
grace_s = 1.5
""")
    proc = await gavel("submit", str(spec), "--wait", "--id", "web-404",
                                   "--timeout", "90", "--json", "--nats", cluster.url)
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[0]
    assert line.startswith(f"gavel submit: web-404 failed: {Reason.RESTARTS_EXHAUSTED}: "), line
    assert "unhealthy: http web/missing: HTTP 404" in line
    out = json.loads(proc.stdout)  # JSON on this outcome too
    assert out["state"] == "failed" and "HTTP 404" in out["error"]

    unhealthy = events(cluster, "web-404", "unhealthy")
    assert len(unhealthy) == 2  # the first run, and the one restarted after it
    assert {(e.reason, e.check) for e in unhealthy} == {(Reason.UNHEALTHY, "http web/missing")}
    assert any(e.detail.startswith("HTTP 404") for e in unhealthy), unhealthy
    (restarted,) = events(cluster, "web-404", "restarted")
    assert restarted.detail.startswith("unhealthy: http web/missing: ")
    assert restarted.restarts == 1 and restarted.exit_code is not None
    rec = cluster.ledger().state().instances["web-404"]
    assert rec.reason == Reason.RESTARTS_EXHAUSTED and "http web/missing" in rec.detail


async def test_tcp_checks_pass_and_fail(cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    tcp = Check(type="tcp", port="web", interval_s=0.2, failures=100)
    up = await cluster.submit(Spec(name="up", type="service", ports=["web"], checks=[tcp],
                                   command=http_server()))
    await wait_for(lambda: events(cluster, up, "healthy") != [], 30, what="tcp check passes")
    assert _health(cluster, up) == ("running", "healthy")

    spec = tmp_path / "down.toml"  # declares its port and never listens on it
    spec.write_text(f"""name = "down"
type = "service"
command = {toml_list([PY, "-c", "import time; time.sleep(600)"])}
ports = ["web"]
restart = {{ attempts = 5, delay_s = 3600, interval_s = 7200 }}

[[checks]]
type = "tcp"
port = "web"
interval_s = 0.1
failures = 2
""")
    proc = await gavel("submit", str(spec), "--wait", "--id", "down-1",
                                   "--timeout", "5", "--nats", cluster.url)
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert proc.stderr.strip() == ("gavel submit: down-1 not healthy within 5s: unhealthy: "
                                   "tcp web: connection refused")
    (bad,) = events(cluster, "down-1", "unhealthy")
    assert (bad.check, bad.detail) == ("tcp web", "connection refused")
    (restarted,) = events(cluster, "down-1", "restarted")
    assert restarted.restarts == 1 and restarted.node_id == "node-a"
    table = await gavel("status", "down-1", "--nats", cluster.url)
    assert table.stdout.splitlines()[1].split()[:6] == ["down-1", "running", "checking",
                                                        "node-a", "1", "1"]


async def test_exec_checks_pass_and_fail(cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    seen = tmp_path / "seen"
    sleeper = [PY, "-c", "import pathlib, time; pathlib.Path('ready').touch(); time.sleep(600)"]
    ok = Check(type="exec", interval_s=0.2, failures=100, command=[
        "sh", "-c", f"test -f ready && echo \"$GAVEL_INSTANCE_ID $PORT $MODE $(pwd)\" > '{seen}'"])
    good = await cluster.submit(Spec(name="good", type="service", ports=["web"],
                                     env={"MODE": "checked"}, checks=[ok], command=sleeper))
    await wait_for(lambda: events(cluster, good, "healthy") != [], 30, what="exec passes")
    iid, port, mode, cwd = seen.read_text().split()
    placement = cluster.ledger().state().placement(good)
    assert placement is not None
    assert (iid, int(port), mode) == (good, placement.ports["web"], "checked")
    assert Path(cwd) == cluster.root / "workers" / "node-a" / "instances" / good

    failing = Check(type="exec", interval_s=0.1, failures=2,
                    command=["sh", "-c", "echo not ready >&2; exit 4"])
    bad = await cluster.submit(Spec(name="bad", type="service", checks=[failing],
                                    restart=PARKED, command=sleeper))
    await wait_for(lambda: events(cluster, bad, "unhealthy") != [], 30, what="exec fails")
    (ev,) = events(cluster, bad, "unhealthy")
    assert (ev.check, ev.detail) == ("exec sh", "exit status 4: not ready")

    pidfile = tmp_path / "check-pid"
    hangs = Check(type="exec", name="hangs", interval_s=0.1, timeout_s=0.5, failures=1,
                  command=["sh", "-c", f"echo $$ > '{pidfile}'; exec sleep 600"])
    stuck = await cluster.submit(Spec(name="stuck", type="service", checks=[hangs],
                                      restart=PARKED, command=sleeper))
    await wait_for(lambda: events(cluster, stuck, "unhealthy") != [], 30, what="exec hangs")
    (ev,) = events(cluster, stuck, "unhealthy")
    assert (ev.check, ev.detail) == ("hangs", "still running after 0.5s: killed")
    pid = int(pidfile.read_text())
    await wait_for(lambda: not psutil.pid_exists(pid)
                   or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 10,
                   what="the check's process killed")


async def test_health_and_restarts_ride_in_heartbeats(cluster: Cluster) -> None:
    """A broker that restarts has heard no event of the instance: what it shows of its
    health and restarts comes from the node's heartbeats."""
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    crash_once = ["sh", "-c", "if [ ! -e crashed ]; then touch crashed; exit 1; fi; "
                  "exec sleep 600"]
    iid = await cluster.submit(Spec(
        name="steady", type="service", command=crash_once,
        restart=Restart(attempts=2, delay_s=0.2, interval_s=60.0),
        checks=[Check(type="exec", command=["true"], interval_s=0.2)]))
    await wait_for(lambda: events(cluster, iid, "healthy") != [], 30, what="healthy")
    # the event may be heard before the broker's own view has taken it in; on a busy machine
    # the first run's check can pass before its exit, and the restart checks anew
    await wait_for(lambda: _health_restarts(cluster, iid) == ("healthy", 1), 30,
                   what="healthy after its restart in status")
    status = await cluster.status(iid)
    assert (status.health, status.restarts) == ("healthy", 1)

    await cluster.stop_broker()
    await cluster.start_broker()
    await wait_for(lambda: _health(cluster, iid) == ("running", "healthy"), 30,
                   what="health heard again")
    status = await cluster.status(iid)
    assert (status.state, status.health, status.restarts) == ("running", "healthy", 1)
    assert cluster.broker is not None
    heard = list(cluster.broker.events)[cluster.broker.events.loaded:]
    assert [e for e in heard if e.instance_id == iid] == []  # nothing but heartbeats told
    assert events(cluster, iid, "healthy") != []  # this broker; the history it loaded did
