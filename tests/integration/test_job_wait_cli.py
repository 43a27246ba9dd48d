"""`gavel submit --wait` on a lone job, through the real CLI against a real broker and a real
worker: the command is a client of `gavel.client`'s `wait_job`, and says each end as it
always has - success on its node (exit 0), a failure naming how many failed and why (exit 3,
and with ``--json`` the instance as last seen with the error), the time passing first
(exit 3, how it stood)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from tests.integration.harness import Cluster


def spec_file(tmp: Path, name: str, command: str) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(f'name = "{name}"\ncommand = {command}\ncpu = 0.1\nattempts = 1\n'
                    'restart = { attempts = 0 }\n')
    return path


async def submit_wait(cluster: Cluster, spec: Path, iid: str,
                      *extra: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "gavel", "submit", str(spec), "--id", iid,
                         "--wait", "--nats", cluster.url, *extra],
        capture_output=True, text=True, timeout=180)


async def test_submit_wait_says_each_end_of_a_lone_job(cluster: Cluster,
                                                       tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)

    got = await submit_wait(cluster, spec_file(tmp_path, "ok", '["true"]'), "ok-1")
    assert (got.returncode, got.stdout.strip()) == (0, "ok-1 succeeded on node-a"), got.stderr

    bad = spec_file(tmp_path, "bad", '["false"]')
    got = await submit_wait(cluster, bad, "bad-1")
    assert got.returncode == 3, got.stdout + got.stderr
    assert got.stderr.startswith("gavel submit: bad-1 failed: 1 of 1 failed (first: bad-1: "), \
        got.stderr
    got = await submit_wait(cluster, bad, "bad-2", "--json")
    assert got.returncode == 3, got.stdout + got.stderr
    said = json.loads(got.stdout)
    assert said["instance_id"] == "bad-2" and said["state"] == "failed"
    assert said["exit_code"] == 3 and said["error"].startswith("gavel submit: bad-2 failed: 1 of 1")

    got = await submit_wait(cluster, spec_file(tmp_path, "slow", '["sleep", "600"]'),
                            "slow-1", "--timeout", "1")
    assert got.returncode == 3, got.stdout + got.stderr
    assert got.stderr.startswith("gavel submit: slow-1 did not end within 1s: slow-1 "), \
        got.stderr
