"""`gavel up --ha` as a user runs it: three clustered nats-servers, a bare state remote and
three brokers as real child processes (`gavel.cli.upha`).

What must hold: it says which broker leads, and `gavel nodes --json` names the same one;
kill -9 of that broker is said once and another takes over while `gavel up` runs on; a
placement made under the first leader is in the remote; Ctrl-C stops everything it started.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import psutil
import pygit2
import pytest

from gavel.broker.ledger.repository import Ledger
from tests.integration.harness import wait_for
from tests.integration.test_up import SLEEPER, Up, leftovers, ups  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


async def leader_of(up: Up) -> str:
    proc = await up.gavel("nodes", "--json")
    if proc.returncode != 0:
        return ""
    got: dict[str, object] = json.loads(proc.stdout)
    return str(got.get("leader", ""))


async def test_up_ha_names_its_leader_and_a_standby_takes_over_its_kill(
        tmp_path: Path, ups: list[Up]) -> None:  # noqa: F811
    state = tmp_path / "s"
    up = Up(state, "--ha", "--workers", "2", "--no-gateway")
    ups.append(up)
    await up.ready()
    m = re.search(r"3 brokers \((broker-\d) leads, epoch (\d+)\)", up.text())
    assert m is not None, up.text()
    first = m.group(1)
    assert await leader_of(up) == first
    spec = tmp_path / "sleeper.toml"
    spec.write_text('name = "sleeper"\n' + SLEEPER)
    proc = await up.gavel("submit", str(spec), "--json")
    assert proc.returncode == 0, proc.stderr
    iid = json.loads(proc.stdout)["instance_id"]

    async def placed() -> bool:
        st = await up.status(iid)
        return bool(st.get("node_id")) and st.get("state") == "running"
    await wait_for(placed, 60, every=0.2, what="the sleeper placed and running")
    remote = Ledger(state / "remote.git", "refs/heads/main")
    assert pygit2.Repository(str(state / "remote.git")).references.get("refs/heads/main")
    assert iid in remote.state().instances  # pushed before it was told

    victim = [p for p in psutil.process_iter(["cmdline"])
              if "--broker-id" in (p.info["cmdline"] or [])
              and first in (p.info["cmdline"] or []) and str(state) in " ".join(
                  p.info["cmdline"] or [])]
    assert len(victim) == 1, victim
    victim[0].send_signal(signal.SIGKILL)

    async def another() -> bool:
        assert up.proc.poll() is None, up.text()
        now = await leader_of(up)
        return now not in ("", first)
    await wait_for(another, 90, every=0.5, what="another broker to lead")
    assert f"gavel up: {first} exited with status -9" in up.text()
    assert (await up.status(iid))["state"] == "running"  # the new leader placed nothing anew
    assert await up.exit(signal.SIGINT) == 0, up.text()
    assert leftovers(state) == []
