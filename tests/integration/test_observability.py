"""Run it like production: `gavel broker` and `gavel worker` as processes configured by a file,
environment and flags; Prometheus metrics scraped over HTTP; JSON logs free of secrets."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gavel.shared.api import StatusReply, StatusRequest, SubmitReply, SubmitRequest
from gavel.transport.client import call
from gavel.transport.natsserver import free_port
from tests.integration.harness import gavel_process, wait_for, writer_spec

pytestmark = pytest.mark.integration
SECRET = "s3cr3t-do-not-log-0xC0FFEE"


def scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """name -> {labels: value} for every sample the endpoint serves."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def up(port: int) -> bool:
    try:
        scrape(port)
        return True
    except OSError:
        return False


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    running: list[subprocess.Popen[bytes]] = []
    yield running
    for p in running:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in running:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def json_lines(path: Path) -> list[dict[str, Any]]:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return [json.loads(line) for line in lines]  # every line is one JSON object


async def test_metrics_and_json_logs_without_secrets(
        nats_url: str, tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    broker_port, worker_port = free_port(), free_port()
    (tmp_path / "secrets.toml").write_text(f'SECRET_API_TOKEN = "{SECRET}"\n')
    (tmp_path / "broker.toml").write_text(
        f'state = "{tmp_path / "state"}"\nsecrets = "{tmp_path / "secrets.toml"}"\n'
        f'metrics_port = {broker_port}\nlog_format = "text"\n')
    (tmp_path / "worker.toml").write_text(
        'node_id = "w1"\nstrategy = "binpack"\ncpu = 4.0\nmemory_mb = 4096\n'
        'ports = [31000, 31099]\n')
    broker_log, worker_log = tmp_path / "broker.log", tmp_path / "worker.log"
    # file < env < flags: the file says text, the flag says json.
    procs.append(gavel_process(["broker", "--config", str(tmp_path / "broker.toml"),
                                "--log-format", "json"], broker_log,
                               {"GAVEL_NATS_URL": nats_url}))
    procs.append(gavel_process(["worker", "--config", str(tmp_path / "worker.toml"),
                                "--state", str(tmp_path / "w1")], worker_log,
                               {"GAVEL_NATS_URL": nats_url, "GAVEL_LOG_FORMAT": "json",
                                "GAVEL_METRICS_PORT": str(worker_port)}))
    await wait_for(lambda: up(broker_port) and up(worker_port), 20, what="metrics endpoints")
    out = tmp_path / "out"
    nc = await nats.connect(nats_url)
    try:
        async def healthy() -> bool:
            m = scrape(broker_port)
            return m.get("gavel_nodes", {}).get((("health", "healthy"),), 0) >= 1
        await wait_for(healthy, 20, what="the worker to heartbeat")
        spec = writer_spec("secretive", out, cpu=1.0, memory_mb=128,
                           secrets=["SECRET_API_TOKEN"])
        iid = (await call(nc, "submit", SubmitRequest(spec=spec), SubmitReply)).instance_id

        async def ran() -> bool:
            st = await call(nc, "status", StatusRequest(instance_id=iid), StatusReply)
            return st.instances[0].node_id == "w1" and (out / iid).exists()
        await wait_for(ran, 20, what="the placement to run")
    finally:
        await nc.close()
    assert SECRET in (out / iid).read_text()  # the instance got its secret...

    b = scrape(broker_port)
    assert b["gavel_placements_total"][()] >= 1
    assert b["gavel_bid_round_seconds_count"][()] >= 1
    assert b["gavel_auctions_total"][(("outcome", "awarded"),)] >= 1
    assert b["gavel_kv_puts_total"][()] >= 1  # w1's node.json, mirrored for it
    assert b["gavel_kv_puts_coalesced_total"][()] >= 0
    assert b["gavel_events_dropped_total"][()] == 0  # broker.events rule 3
    w = scrape(worker_port)
    assert w["gavel_worker_rfbs_answered_total"][()] >= 1
    assert w["gavel_worker_bids_total"][()] >= 1
    assert w["gavel_worker_heartbeats_total"][()] >= 1
    assert w["gavel_worker_capacity_cpu"][()] == 4.0

    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        assert p.wait(15) == 0
    # ...and no log line, of the broker or the worker, ever held it.
    assert SECRET not in broker_log.read_text() and SECRET not in worker_log.read_text()
    blines, wlines = json_lines(broker_log), json_lines(worker_log)
    assert all({"ts", "level", "logger", "msg"} <= set(x) for x in blines + wlines)
    placed = [x for x in blines if x["msg"].startswith(f"placed {iid}")]
    assert len(placed) == 1
    assert placed[0]["instance"] == iid and placed[0]["winner"] == "w1"
    assert placed[0]["bids"] == 1 and placed[0]["round_s"] >= 0


async def test_gavel_up_serves_the_broker_metrics(tmp_path: Path,
                                                  procs: list[subprocess.Popen[bytes]]) -> None:
    port = free_port()
    procs.append(gavel_process(["up", "--state", str(tmp_path / "up"), "--workers", "2",
                                "--metrics-port", str(port), "--log-format", "json"],
                               tmp_path / "up.log"))

    def healthy() -> bool:
        try:
            m = scrape(port)
        except OSError:
            return False
        return m.get("gavel_nodes", {}).get((("health", "healthy"),), 0) == 2
    await wait_for(healthy, 30, what="`gavel up` to serve the broker's metrics")
    procs[0].send_signal(signal.SIGTERM)
    assert procs[0].wait(30) == 0
    assert all(json_lines(tmp_path / "up" / "logs" / f"{name}.log")
               for name in ("broker", "node-1", "node-2"))
