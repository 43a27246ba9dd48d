"""Rolling deploys and rollbacks of a service, against a real nats-server, real git and real
processes, with `gavel deploy --wait` run as the operator runs it: a rolling deploy of four
never below count - max_parallel healthy, every step a commit; a version whose process exits
non-zero is rolled back on its own (real worker health: it never runs); a broker killed with
SIGKILL mid-deploy is restarted and finishes it, without a double replica."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gavel.cli import services as cli_services
from gavel.shared import subjects
from gavel.shared.api import (
    DeployRequest,
    NodesReply,
    NodesRequest,
    ServiceReply,
    ServiceRequest,
)
from gavel.shared.messages import InstanceState as S
from gavel.shared.messages import Spec
from gavel.shared.reasons import Reason
from gavel.transport import wire
from gavel.transport.client import ClientError, call
from tests.integration.harness import Cluster, gavel_process, wait_for
from tests.integration.test_services import deploy, gavel, processes, service, status, whole

pytestmark = pytest.mark.integration

def spec_file(tmp_path: Path, spec: Spec, name: str) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_bytes(msgspec.json.encode(spec))
    return path


def service_lines(cluster: Cluster) -> list[str]:
    """Every ``service web:`` line of the state branch, oldest first."""
    out: list[str] = []
    for commit in reversed(list(cluster.ledger().history())):
        out += [line for line in commit.message.split("\n") if line.startswith("service web:")]
    return out


async def test_a_rolling_deploy_of_four_never_drops_below_count_minus_max_parallel(
        cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    for n in ("node-a", "node-b"):
        await cluster.start_agent(n)
    await cluster.wait_nodes(2)
    await deploy(cluster, service(4, max_parallel=1))

    async def v1_whole() -> bool:
        return whole(await status(cluster)) and len(processes(cluster)) == 4
    await wait_for(v1_whole, 30, what="version 1 whole and healthy")
    old = set(processes(cluster))
    healthy_seen: list[int] = []
    running_seen: list[int] = []
    done = asyncio.Event()

    async def observe() -> None:
        while not done.is_set():
            st = await status(cluster)
            healthy_seen.append(sum(r.health == "healthy" for r in st.replicas
                                    if r.state != "cancelling"))
            running_seen.append(len(processes(cluster)))
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(observe())
    v2 = spec_file(tmp_path, service(4, version="2", max_parallel=1), "web-v2")
    code, out, err = await gavel("deploy", str(v2), "--wait", "--nats", cluster.url)
    done.set()
    await watcher
    assert code == 0, err
    assert "web version 2 deployed: 4 replicas healthy" in out
    assert len(healthy_seen) > 20, "the deploy was not observed"
    assert min(healthy_seen) >= 4 - 1, healthy_seen
    assert min(running_seen) >= 4 - 1, running_seen
    st = await status(cluster)
    assert whole(st, 2) and st.healthy_version == 2
    assert st.deployment is not None and st.deployment.state == "succeeded"
    await wait_for(lambda: not set(processes(cluster)) & old, 30, what="old processes gone")
    await wait_for(lambda: all(cluster.ledger().state().instances[i].state.terminal
                               for i in old), 30, what="old replicas ended")
    state = cluster.ledger().state()
    assert {(state.instances[i].state, state.instances[i].reason) for i in old} == \
        {(S.CANCELLED, Reason.SUPERSEDED)}
    lines = service_lines(cluster)
    starts = [i for i, line in enumerate(lines) if line.startswith("service web: start ")
              and line.endswith("(version 2)")]
    stops = [i for i, line in enumerate(lines) if line.startswith("service web: stop ")]
    assert len(starts) == 4 and len(stops) == 4, lines
    for k in range(4):  # placed first: the k-th old one stops after the k-th new one started
        assert starts[k] < stops[k], lines
        assert lines[stops[k]].endswith(Reason.SUPERSEDED)
    assert lines[-1] == "service web: deployed version 2: 4 replicas healthy"
    commits = [c for c in cluster.ledger().history()
               if "service web: stop " in c.message]
    assert len(commits) == 4, "each old replica stopped in a step of its own"


V2_TOML = """
name = "web"
type = "service"
count = 2
command = ["{python}", "-c", "import sys; sys.exit(3)"]
cpu = 0.1
memory_mb = 16
env = {{ WEB_VERSION = "2" }}

[restart]
attempts = 0

[update]
min_healthy_s = 0.5
healthy_deadline_s = 120
auto_revert = true
"""


async def test_a_version_that_never_runs_is_rolled_back_automatically(
        cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    await deploy(cluster, service(2))

    async def v1_deployed() -> bool:
        st = await status(cluster)
        return whole(st) and st.healthy_version == 1
    await wait_for(v1_deployed, 30, what="version 1 deployed")
    old = set(processes(cluster))
    v2 = tmp_path / "web.toml"
    v2.write_text(V2_TOML.format(python=sys.executable))
    code, _out, err = await gavel("deploy", str(v2), "--wait", "--nats", cluster.url)
    assert code == 3, err
    assert "web version 2 was rolled back to version 1: version 2: " \
        f"{Reason.DEPLOY_UNHEALTHY} (web-" in err

    async def rolled_back() -> bool:
        st = await status(cluster)
        return whole(st, 1) and st.deployment is not None and \
            st.deployment.state == "rolled-back"
    await wait_for(rolled_back, 30, what="rolled back to version 1")
    st = await status(cluster)
    assert st.version == 1 and set(processes(cluster)) == old, "version 1 never stopped"
    failed = [r for r in cluster.ledger().state().replicas_of("web") if r.version == 2]
    assert failed and all((r.state, r.reason) == (S.FAILED, Reason.EXITED_NONZERO)
                          for r in failed)
    lines = service_lines(cluster)
    assert any(line.startswith("service web: deploy of version 2 failed: "
                               f"{Reason.DEPLOY_UNHEALTHY}") and
               line.endswith("rolling back to version 1") for line in lines), lines
    assert lines[-1] == "service web: rolled back to version 1: 2 replicas healthy"
    code, out, err = await gavel("deploy", "status", "web", "--json", "--nats", cluster.url)
    assert code == 0, err
    shown = msgspec.json.decode(out)
    assert shown["deployment"]["state"] == "rolled-back" and shown["version"] == 1


async def test_a_broker_killed_mid_deploy_resumes_it_without_a_double_replica(
        cluster: Cluster, tmp_path: Path) -> None:
    env = {"GAVEL_NATS_URL": cluster.url, "GAVEL_FAST_TIMERS": "1"}
    log = tmp_path / "broker.log"

    def broker() -> subprocess.Popen[bytes]:
        return gavel_process(["broker", "--state", str(cluster.state)], log, env=env)

    procs = [broker()]
    try:
        for n in ("node-a", "node-b"):
            await cluster.start_agent(n)
        nc = await cluster.client()

        async def up() -> bool:
            try:
                reply = await call(nc, "nodes", NodesRequest(), NodesReply, timeout=1.0)
            except ClientError:
                return False
            return sum(n.health == "healthy" for n in reply.nodes) == 2
        await wait_for(up, 30, what="broker up with two nodes")
        await deploy(cluster, service(4, max_parallel=1, min_healthy_s=1.0))

        async def settled(version: int) -> bool:
            try:
                st = (await call(nc, "service", ServiceRequest(name="web"), ServiceReply,
                                 timeout=1.0)).service
            except ClientError:
                return False
            return whole(st, version) and st.deployment is not None and \
                st.deployment.state == "succeeded" and len(processes(cluster)) == 4
        await wait_for(lambda: settled(1), 30, what="version 1 deployed")
        most = 0

        def mid_deploy() -> bool:
            nonlocal most
            reps = cluster.ledger().state().replicas_of("web")
            live = [r for r in reps if not r.state.terminal and not r.cancelling]
            most = max(most, len(live))
            superseded = [r for r in reps if r.version == 1 and r.reason == Reason.SUPERSEDED]
            return bool(superseded) and len([r for r in reps if r.version == 2]) < 4
        await deploy(cluster, service(4, version="2", max_parallel=1, min_healthy_s=1.0))
        await wait_for(mid_deploy, 30, every=0.01, what="the deploy under way")
        procs[-1].send_signal(signal.SIGKILL)
        procs[-1].wait(5)
        procs.append(broker())
        await wait_for(lambda: settled(2), 60, what="version 2 deployed after the restart")
        assert most <= 4 + 1, "never more than count + max_parallel live replicas"
        reps = cluster.ledger().state().replicas_of("web")
        new = [r for r in reps if r.version == 2]
        assert len(new) == 4 and all(not r.state.terminal for r in new), \
            "exactly four version 2 replicas: none doubled by the restart"
        running = processes(cluster)
        assert set(running) == {r.instance_id for r in new}
        await wait_for(lambda: all(r.state.terminal for r in cluster.ledger().state()
                                   .replicas_of("web") if r.version == 1), 30,
                       what="old replicas ended")
        olds = [r for r in cluster.ledger().state().replicas_of("web") if r.version == 1]
        # A stop the killed broker committed but could not send is overruled by the new one
        # after the cancel grace (the node converges onto git and stops it): still a stop.
        assert len(olds) == 4 and all(r.state is S.CANCELLED and Reason.SUPERSEDED in
                                      (r.reason, r.detail) for r in olds), olds
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()


async def test_the_cli_asks_again_with_its_key_when_a_deploy_answer_is_late_and_deploys_once(
        cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    broker = await cluster.start_broker(writer="thread")
    write = broker.ledger.write_files
    slow = {"first": True}

    def late(*args: Any) -> str:  # on the writer thread: the first commit takes a while
        if slow.pop("first", False):
            time.sleep(1.5)
        return write(*args)

    monkeypatch.setattr(broker.ledger, "write_files", late)
    monkeypatch.setattr(cli_services, "DEPLOY_TRY_S", 1.0)
    monkeypatch.setattr(cli_services, "DEPLOY_TRIES", 20)
    keys: list[str] = []
    nc = await cluster.client()

    async def heard(msg: Any) -> None:
        keys.append(msgspec.msgpack.decode(msg.data, type=DeployRequest).key)

    await nc.subscribe(subjects.API.format(verb="deploy"), cb=heard)
    await wire.subscribed(nc)
    path = spec_file(tmp_path, service(2), "web")
    args = argparse.Namespace(command="deploy", target=[str(path)], wait=False, json=False,
                              nats=cluster.url, creds=None, timeout=0.0)
    assert await cli_services.deploy(args) == 0
    printed = capsys.readouterr()
    assert printed.out == "web: version 1\n"
    assert len(keys) >= 2 and len(set(keys)) == 1 and keys[0], keys  # asked again, one key
    assert "asking again" in printed.err
    state = cluster.ledger().state()
    assert [v.version for v in state.services["web"].versions] == [1]
    assert len(state.replicas_of("web")) == 2, "one deploy's replicas, not two"
