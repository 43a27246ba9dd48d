"""Image specs through the real Docker Engine: a real nats-server, real git, real containers
of images built here FROM scratch with the static busybox (`tests.integration.dockerkit`).

Each test skips with a sentence where no engine answers; nothing pulls an image, and every
published port is on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import urllib.request
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest

from gavel.shared.api import (
    CancelReply,
    CancelRequest,
    SubmitReply,
    SubmitRequest,
    WhyReply,
    WhyRequest,
)
from gavel.shared.messages import InstanceState, Spec
from gavel.shared.reasons import Reason
from gavel.shared.spec import Check, Restart, Route, Update, Volume
from gavel.transport.client import call
from gavel.transport.natsserver import NatsServer, free_port
from gavel.worker.agent import Agent
from gavel.worker.engine import HOME, INSTANCE, Engine, connect
from gavel.worker.kernellog import readable as kernel_log_readable
from gavel.worker.logfiles import LogLimits
from tests.integration.dockerkit import PREFIX, image
from tests.integration.harness import (
    TIMING,
    Cluster,
    Daemons,
    UpDemo,
    free_range,
    healthy_nodes,
    wait_for,
)
from tests.integration.test_gateway import Gateway, start_caddy
from tests.integration.test_logs import gavel
from tests.integration.test_services import deploy, status, whole

pytestmark = pytest.mark.integration

#: A container's long run that ends on SIGTERM, as a service does: `sleep` as PID 1 ignores
#: it, and each stop (a teardown, a cancel, a fence) waits out the kill grace for it. The
#: timeout test keeps the bare `sleep`: the SIGKILL after the grace is what it checks.
LONG = ["sh", "-c", "trap 'exit 0' TERM; sleep 600 & wait"]


async def start(cluster: Cluster, engines: list[Engine], node: str, **kw: Any) -> Agent:
    """A worker with the engine (its containers labelled with its own state directory)."""
    home = str((cluster.root / "workers" / node).resolve())
    engine = connect("auto", node_id=node, home=home)
    assert engine is not None, "the engine answered the fixture but not the worker"
    engines.append(engine)
    return await cluster.start_agent(node, engine=engine, **kw)


def containers(docker: Any, cluster: Cluster, iid: str = "", all_: bool = False) -> list[str]:
    """The ids of this test's containers (of one instance), by the labels its workers gave
    them (the engine's list alone: a container may go between a list and an inspect)."""
    home = str((cluster.root / "workers").resolve()) + "/"
    found = docker.api.containers(all=all_, filters={"label": [f"{INSTANCE}={iid}" if iid
                                                               else INSTANCE]})
    return [c["Id"] for c in found if (c.get("Labels") or {}).get(HOME, "").startswith(home)]


def instance_dir(cluster: Cluster, node: str, iid: str) -> Path:
    return cluster.root / "workers" / node / "instances" / iid


async def ended(cluster: Cluster, iid: str, timeout: float = 60) -> Any:
    async def done() -> bool:
        return InstanceState((await cluster.status(iid)).state).terminal
    await wait_for(done, timeout, what=f"{iid} to end")
    return await cluster.status(iid)


async def test_a_container_job_runs_with_its_output_in_the_logs_and_no_secret_in_inspect(
        cluster: Cluster, engines: list[Engine], docker: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    """The image's ENTRYPOINT is kept and `command` replaces its CMD; stdout and stderr land
    in the instance's log files; a secret is the file /run/secrets/<name>, never in the
    container's environment or its inspect output, never in an image made of the container,
    never in the instance's logs or the broker's and worker's own, never in git."""
    caplog.set_level(logging.DEBUG)
    tag = image(docker, "v1")
    secret = "s3cret-" + hashlib.sha256(str(cluster.root).encode()).hexdigest()[:16]
    want = hashlib.sha256(secret.encode()).hexdigest()
    await cluster.start_broker(secrets={"token": secret})
    await start(cluster, engines, "n1")
    await cluster.wait_nodes(1)
    script = ('echo "out $GREETING port=$PORT"; echo err >&2; '
              'test "$(sha256sum < /run/secrets/token | cut -d" " -f1)" = "$WANT" || exit 7; '
              'test -z "$token" || exit 8; sleep 1')
    spec = Spec(name="cjob", image=tag, command=["sh", "-c", script], ports=["http"],
                env={"GREETING": "hello", "WANT": want}, secrets=["token"], memory_mb=32)
    iid = await cluster.submit(spec)

    async def one_running() -> bool:
        return len(containers(docker, cluster, iid)) == 1
    await wait_for(one_running, 60, what="its container to run")
    (cid,) = containers(docker, cluster, iid)
    inspected = json.dumps(docker.api.inspect_container(cid))
    assert secret not in inspected
    assert "/run/secrets" in inspected
    assert secret.encode() not in _committed(docker, cid)
    host = docker.api.inspect_container(cid)["HostConfig"]
    assert host["Memory"] == 32 * 2**20 and host["PidsLimit"] == spec.pids
    assert host["NanoCpus"] == round(spec.cpu * 1e9)
    assert "no-new-privileges" in host["SecurityOpt"] and host["CapDrop"] == ["ALL"]
    bindings = [b["HostIp"] for bs in host["PortBindings"].values() for b in bs]
    assert bindings and "0.0.0.0" not in bindings and "" not in bindings
    st = await ended(cluster, iid)
    assert st.state == "succeeded", st
    d = instance_dir(cluster, "n1", iid)
    out = (d / "stdout.log").read_text()
    assert out.startswith("out hello port=") and (d / "stderr.log").read_text() == "err\n"
    logs = await gavel("logs", iid, "--all", "--nats", cluster.url)  # as an operator reads
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout == out and logs.stderr == "err\n"
    for f in d.iterdir():
        assert secret.encode() not in f.read_bytes(), f
    repo = cluster.ledger().repo
    for oid in repo.odb:
        assert secret.encode() not in repo.odb.read(oid)[1]
    assert caplog.records and secret not in caplog.text
    await wait_for(lambda: not containers(docker, cluster, iid, all_=True), 30,
                   what="the ended instance's container to be removed")


def _committed(docker: Any, cid: str) -> bytes:
    """The image `docker commit` makes of the container, as `docker save` writes it."""
    made = docker.api.commit(cid, repository=f"{PREFIX}-committed", tag=cid[:12])
    try:
        return b"".join(docker.api.get_image(made["Id"]))
    finally:
        docker.api.remove_image(made["Id"], force=True)


async def test_a_container_over_its_memory_is_killed_with_the_same_reason_as_a_process(
        cluster: Cluster, engines: list[Engine], docker: Any) -> None:
    await _hog_ends_for_its_memory(cluster, engines, docker)


async def _hog_ends_for_its_memory(cluster: Cluster, engines: list[Engine],
                                   docker: Any) -> None:
    """A container that asks 64 MB of a 16 MB limit at once fails with the process's
    reason for it."""
    tag = image(docker, "v1")
    await cluster.start_broker()
    await start(cluster, engines, "n1")
    await cluster.wait_nodes(1)
    iid = await cluster.submit(Spec(
        name="hog", image=tag, memory_mb=16, restart=Restart(attempts=0),
        command=["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"]))
    st = await ended(cluster, iid)
    assert (st.state, st.reason) == ("failed", Reason.MEMORY_EXCEEDED), st


async def test_a_memory_kill_the_engine_missed_is_read_from_the_kernels_log(
        cluster: Cluster, engines: list[Engine], docker: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine misses an OOM kill in a run's first milliseconds (containerd issues 8180,
    8893): here it is made to miss every one, and the kernel's log still says why."""
    from docker import APIClient

    if not kernel_log_readable():
        pytest.skip("the kernel's log cannot be read here (/dev/kmsg needs CAP_SYSLOG)")
    inspect = APIClient.inspect_container

    def missed(self: Any, container: str) -> Any:
        got = inspect(self, container)
        got["State"]["OOMKilled"] = False
        return got

    monkeypatch.setattr(APIClient, "inspect_container", missed)
    await _hog_ends_for_its_memory(cluster, engines, docker)


async def test_a_node_without_an_engine_declines_an_image_spec(
        cluster: Cluster, engines: list[Engine], docker: Any) -> None:
    await cluster.start_broker()
    await cluster.start_agent("plain")  # no engine given: image specs are not for it
    await cluster.wait_nodes(1)
    iid = await cluster.submit(Spec(name="img", image=image(docker, "v1")))

    async def refused() -> bool:
        st = await cluster.status(iid)
        return Reason.NO_ENGINE in (st.detail or "") + (st.reason or "")
    await wait_for(refused, 30, what="the decline to reach the instance's status")


async def test_a_containerised_service_of_three_is_checked_routed_and_rolled_to_a_new_tag(
        cluster: Cluster, engines: list[Engine], docker: Any, tmp_path: Path) -> None:
    """Three replicas of an http service in containers, http and tcp checks against the
    published port and an exec check inside the container, a route through a real Caddy by `gavel
    gateway`; then a deploy of a new image tag replaces every replica, healthy-gated."""
    v1, v2 = image(docker, "web1", "version one"), image(docker, "web2", "version two")
    await cluster.start_broker()
    start_port = 31000
    for n in ("c1", "c2"):  # one host: the two nodes' port ranges apart
        first, last = free_range(start_port)
        start_port = last + 1
        await start(cluster, engines, n, port_range=(first, last), advertise="127.0.0.1")
    await cluster.wait_nodes(2)
    caddy = start_caddy(tmp_path)
    gateway = None
    try:
        listen = free_port()
        gateway = await Gateway(cluster.url, caddy, listen, tmp_path / "gw.log").start()

        def web(tag: str) -> Spec:
            return Spec(name="web", type="service", count=3, image=tag, ports=["http"],
                        memory_mb=32, restart=Restart(attempts=0),
                        routes=[Route(path="/", port="http")],
                        checks=[Check(type="http", port="http", path="/index.html",
                                      interval_s=0.2, timeout_s=1.0, failures=2),
                                Check(type="tcp", port="http", interval_s=0.5,
                                      timeout_s=1.0),
                                # docker exec runs the command as given: no ENTRYPOINT first
                                Check(type="exec", command=["/bin/busybox", "test", "-f",
                                                            "/www/index.html"],
                                      interval_s=0.5, timeout_s=2.0)],
                        update=Update(min_healthy_s=0.3))

        async def serving(version: int, page: str) -> bool:
            st = await status(cluster)
            if not whole(st, version):
                return False
            pages = [await _get(f"http://127.0.0.1:{p}/") for p in _ports(cluster, st)]
            return pages == [page] * 3 and await _get(f"http://127.0.0.1:{listen}/") == page

        await deploy(cluster, web(v1))
        await wait_for(lambda: serving(1, "version one"), 90,
                       what="three healthy v1 replicas, routed")
        await deploy(cluster, web(v2))
        await wait_for(lambda: serving(2, "version two"), 120,
                       what="three healthy v2 replicas, routed")
        await wait_for(lambda: len(containers(docker, cluster)) == 3, 60,
                       what="the old version's containers to go")
    finally:
        if gateway is not None:
            gateway.stop()
        caddy.stop()


def _ports(cluster: Cluster, st: Any) -> list[int]:
    live = {r.instance_id for r in st.replicas if r.state == "running"}
    return [r.ports["http"] for agent in cluster.agents.values() for r in agent.instances()
            if r.instance_id in live]


async def _get(url: str) -> str:
    """The body at `url` ("" for none), fetched in a thread: the broker shares this loop."""
    def fetch() -> str:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return str(r.read().decode())
        except OSError:
            return ""
    return await asyncio.to_thread(fetch)


async def test_a_host_volume_keeps_its_data_across_redeploys_restarts_and_placements(
        cluster: Cluster, engines: list[Engine], docker: Any, tmp_path: Path) -> None:
    """Each run appends its version to the volume: a redeploy, a restart in place and, past
    the restart policy, a new placement all find what the runs before them wrote, and only
    the node holding the volume ever runs the service."""
    tag = image(docker, "v1")
    data = tmp_path / "vol-data"
    data.mkdir()
    await cluster.start_broker()
    await start(cluster, engines, "holder", volumes={"data": str(data)})
    await start(cluster, engines, "other")
    await cluster.wait_nodes(2)

    def svc(version: str) -> Spec:
        return Spec(name="web", type="service", count=1, image=tag, ports=["http"],
                    volumes=[Volume(name="data", path="/data")], env={"V": version},
                    command=["sh", "-c", 'echo "$V" >> /data/runs; '
                             'trap "exit 0" TERM; sleep 600 & wait'],
                    restart=Restart(attempts=1, delay_s=0.0, interval_s=600.0),
                    update=Update(min_healthy_s=0.2))

    def runs(text: str) -> bool:
        return (data / "runs").exists() and (data / "runs").read_text() == text

    await deploy(cluster, svc("1"))
    await wait_for(lambda: runs("1\n"), 60, what="the first version to write")
    await deploy(cluster, svc("2"))
    await wait_for(lambda: runs("1\n2\n"), 90,
                   what="the second version to append to the first one's data")
    alone: list[str] = []

    def one_replica_of_v2() -> bool:  # the rolling deploy's first version is gone
        alone[:] = containers(docker, cluster)
        try:
            return len(alone) == 1 and "V=2" in docker.api.inspect_container(
                alone[0])["Config"]["Env"]
        except Exception:  # gone between the list and the inspect
            return False

    for after, what in (("1\n2\n2\n", "a restart in place"),
                        ("1\n2\n2\n2\n", "a new placement, the restart spent")):
        await wait_for(one_replica_of_v2, 60, what="one running replica, of the second version")
        docker.api.kill(alone[0])
        await wait_for(lambda a=after: runs(a), 90, what=f"{what} to append to the data")
    assert not cluster.agents["other"].instances(), "only the node holding the volume bids"


async def test_a_worker_killed_with_sigkill_readopts_its_container_without_a_second_copy(
        nats_server: NatsServer, tmp_path: Path, docker: Any) -> None:
    """`gavel worker` as a child process, killed with SIGKILL: its container runs on; the
    next worker on its state directory re-adopts that container (the same one, no second
    copy), and a cancel then stops it through the engine."""
    tag = image(docker, "v1")
    d = Daemons(nats_server.url, tmp_path)
    nc = await nats.connect(nats_server.url)
    home = str((tmp_path / "workers" / "k1").resolve())

    def mine(iid: str) -> list[str]:
        return [c["Id"] for c in docker.api.containers(filters={"label": [f"{INSTANCE}={iid}"]})
                if (c.get("Labels") or {}).get(HOME) == home]
    try:
        d.broker()
        d.worker("k1")
        await wait_for(lambda: _healthy(nc, "k1"), 60, what="the worker healthy")
        reply = await call(nc, "submit", SubmitRequest(spec=Spec(
            name="long", image=tag, command=LONG)), SubmitReply, timeout=10.0)
        iid = reply.instance_id
        await wait_for(lambda: len(mine(iid)) == 1, 60, what="its container to run")
        (before,) = mine(iid)
        d.kill(d.workers["k1"])  # SIGKILL: the container is no child of it, and runs on
        assert mine(iid) == [before]
        d.worker("k1")
        await wait_for(lambda: _readopted(tmp_path / "k1.log", iid), 60,
                       what="the new worker to re-adopt it")
        await wait_for(lambda: _healthy(nc, "k1"), 60, what="the new worker healthy")
        assert mine(iid) == [before], "a second copy started"
        await call(nc, "cancel", CancelRequest(instance_id=iid), CancelReply, timeout=10.0)
        await wait_for(lambda: not mine(iid), 60, what="the cancel to stop its container")
    finally:
        await nc.close()
        d.close()


async def _healthy(nc: Any, node: str) -> bool:
    return node in await healthy_nodes(nc)


def _readopted(log: Path, iid: str) -> bool:
    return f"re-adopted instance {iid}" in log.read_text(errors="replace")


async def left_running(cluster: Cluster, engines: list[Engine], docker: Any,
                        tag: str) -> tuple[str, str]:
    """A container of a worker stopped as a killed one is (it runs on): its instance, its id."""
    await cluster.start_broker()
    await start(cluster, engines, "n1")
    await cluster.wait_nodes(1)
    iid = await cluster.submit(Spec(name="long", image=tag, command=LONG))
    await wait_for(lambda: len(containers(docker, cluster, iid)) == 1, 60,
                   what="its container to run")
    (before,) = containers(docker, cluster, iid)
    await cluster.stop_agent("n1", kill_children=False)
    return iid, before


async def test_a_worker_restarted_readopts_its_container_without_a_second_copy(
        cluster: Cluster, engines: list[Engine], docker: Any) -> None:
    tag = image(docker, "v1")
    iid, before = await left_running(cluster, engines, docker, tag)
    # one that no instance of this node owns (a worker killed between create and record),
    # and an exited one of the instance's own attempt (a run the worker no longer needs)
    ghost = docker.containers.run(tag, LONG, detach=True,
                                  labels=engines[-1].labels("ghost-1", 1))
    attempt = (await cluster.status(iid)).attempt
    spent = docker.containers.run(tag, ["true"], detach=True,
                                  labels=engines[-1].labels(iid, attempt))
    assert spent.wait()["StatusCode"] == 0
    await start(cluster, engines, "n1")
    for gone in (ghost.id, spent.id):
        await wait_for(lambda g=gone: not docker.api.containers(all=True, filters={"id": g}),
                       30, what="a container no held instance needs to be removed")
    await wait_for(lambda: any(r.instance_id == iid and r.state == "running"
                               for r in cluster.agents["n1"].instances()), 30,
                   what="the instance re-adopted")
    await asyncio.sleep(0)
    assert containers(docker, cluster, iid) == [before]
    assert cluster.holders(iid) == ["n1"]


async def test_a_container_past_its_timeout_is_stopped_with_the_reason(
        cluster: Cluster, engines: list[Engine], docker: Any) -> None:
    """`timeout_s` holds for a container: stopped (SIGTERM, then SIGKILL after the grace: a
    `sleep` as PID 1 ignores SIGTERM) and failed with the fixed reason."""
    tag = image(docker, "v1")
    await cluster.start_broker()
    await start(cluster, engines, "n1")
    await cluster.wait_nodes(1)
    iid = await cluster.submit(Spec(name="slow", image=tag, command=["sleep", "600"],
                                    timeout_s=1.0))
    st = await ended(cluster, iid)
    assert (st.state, st.reason) == ("failed", Reason.TIMEOUT), st
    await wait_for(lambda: not containers(docker, cluster, iid, all_=True), 30,
                   what="its container to be removed")


async def test_a_process_gets_its_host_volume_and_only_a_node_holding_it_bids(
        cluster: Cluster, tmp_path: Path) -> None:
    """No engine needed: a process is told its volume's host path in GAVEL_VOLUME_<NAME>."""
    data = tmp_path / "shared-data"
    data.mkdir()
    await cluster.start_broker()
    await cluster.start_agent("without")
    await cluster.start_agent("with", volumes={"shared-data": str(data)})
    await cluster.wait_nodes(2)
    iid = await cluster.submit(Spec(
        name="writer", volumes=[Volume(name="shared-data")],
        command=["/bin/sh", "-c", 'echo "$GAVEL_NODE_ID" > "$GAVEL_VOLUME_SHARED_DATA/who"']))
    st = await ended(cluster, iid)
    assert st.state == "succeeded" and (data / "who").read_text() == "with\n", st
    why = await cluster.call("why", WhyRequest(instance_id=iid), WhyReply)
    declines = {(d.node_id, d.reason, d.detail) for a in why.auctions for d in a.declines}
    assert ("without", Reason.MISSING_VOLUME, "shared-data") in declines


async def test_a_node_back_after_offline_fences_the_container_git_moved_away(
        cluster: Cluster, engines: list[Engine], docker: Any) -> None:
    """node-a falls silent with its container running; the broker moves the instance to
    node-b; node-a comes back, re-adopts its container, sees node.json, and stops and removes
    it without a report: one copy runs, node-b's."""
    tag = image(docker, "v1")
    broker = await cluster.start_broker(timing=msgspec.structs.replace(
        TIMING, offline_s=max(TIMING.unreachable_s, TIMING.offline_s / 2)))
    await start(cluster, engines, "node-a")
    await cluster.wait_nodes(1)
    iid = await cluster.submit(Spec(name="moved", image=tag, command=LONG))
    await wait_for(lambda: len(containers(docker, cluster, iid)) == 1, 60, what="on node-a")
    (old,) = containers(docker, cluster, iid)
    await start(cluster, engines, "node-b")
    await cluster.wait_nodes(2)
    await cluster.stop_agent("node-a", kill_children=False)  # silent, its container lives on
    await wait_for(lambda: broker.liveness.health("node-a", broker.now()) == "offline",
                   TIMING.offline_s * 2, what="node-a offline")
    await wait_for(lambda: len(containers(docker, cluster, iid)) == 2, 60,
                   what="re-placed on node-b beside the old copy nobody stopped yet")
    await start(cluster, engines, "node-a")  # same state dir: adopts, then sees node.json
    await wait_for(lambda: old not in containers(docker, cluster, iid, all_=True), 60,
                   what="the moved copy fenced and removed")
    assert len(containers(docker, cluster, iid)) == 1 and cluster.holders(iid) == ["node-b"]
    status = await cluster.status(iid)
    assert (status.state, status.node_id, status.attempt) == ("running", "node-b", 2)


async def test_an_image_that_cannot_be_pulled_fails_the_attempt_with_the_registrys_sentence(
        cluster: Cluster, engines: list[Engine], docker: Any) -> None:
    """The image's registry is a closed port on loopback (nothing leaves the machine): the
    pull fails, the attempt ends with the engine's sentence, and the broker re-auctions it
    without that node, elsewhere, until the attempts run out."""
    await cluster.start_broker()
    await start(cluster, engines, "n1")
    await start(cluster, engines, "n2")
    await cluster.wait_nodes(2)
    iid = await cluster.submit(Spec(name="nowhere", image=f"127.0.0.1:{free_port()}/none:1",
                                    attempts=2))
    st = await ended(cluster, iid)
    assert st.state == "failed", st
    assert "is not on this node and cannot be pulled" in st.detail, st
    why = await cluster.call("why", WhyRequest(instance_id=iid), WhyReply)
    assert sorted(a.winner for a in why.auctions if a.winner) == ["n1", "n2"], why.auctions


async def test_an_exec_check_past_its_timeout_does_not_outlive_it(
        cluster: Cluster, engines: list[Engine], docker: Any) -> None:
    """The engine cannot end an exec: the driver kills one the probe gave up on, so however
    many probes time out, at most the one under way runs in the container."""
    tag = image(docker, "v1")
    await cluster.start_broker()
    await start(cluster, engines, "n1")
    await cluster.wait_nodes(1)
    iid = await cluster.submit(Spec(
        name="hung", image=tag, command=LONG,
        checks=[Check(type="exec", command=["/bin/busybox", "sleep", "100"], interval_s=0.3,
                      timeout_s=0.3, failures=100)]))
    await wait_for(lambda: len(containers(docker, cluster, iid)) == 1, 60, what="running")
    (cid,) = containers(docker, cluster, iid)
    since = int(time.time()) - 60

    def probes() -> int:  # the engine's record of every exec made in the container
        until = int(time.time()) + 1
        return sum(1 for _ in docker.api.events(since=since, until=until, decode=True,
                                                filters={"container": cid,
                                                         "event": "exec_create"}))
    await wait_for(lambda: probes() >= 5, 60, what="five probes")
    hung = [p for p in docker.api.top(cid)["Processes"] if p[-1].endswith("sleep 100")]
    assert len(hung) <= 1, hung


async def test_a_failing_container_is_restarted_in_place_as_its_policy_says(
        cluster: Cluster, engines: list[Engine], docker: Any) -> None:
    """Each run is a new container from the image (the old one removed first); past the
    policy the instance fails with the fixed reason and its stderr's tail."""
    tag = image(docker, "v1")
    await cluster.start_broker()
    await start(cluster, engines, "n1")
    await cluster.wait_nodes(1)
    iid = await cluster.submit(Spec(
        name="flaky", image=tag, attempts=1, command=["sh", "-c", "echo boom >&2; exit 3"],
        restart=Restart(attempts=2, delay_s=0.0, interval_s=600.0)))
    st = await ended(cluster, iid)
    assert (st.state, st.reason) == ("failed", Reason.RESTARTS_EXHAUSTED), st
    assert "exit status 3, after 2 restarts" in st.detail and "boom" in st.detail, st.detail
    d = instance_dir(cluster, "n1", iid)
    assert (d / "stderr.log").read_text() == "boom\n" * 3  # three runs, one log
    await wait_for(lambda: not containers(docker, cluster, iid, all_=True), 30,
                   what="every run's container removed")


def test_the_demo_places_a_container_where_an_engine_answers(up_demo: UpDemo,
                                                             docker: Any) -> None:
    assert up_demo.proc.returncode == 0, up_demo.proc.stdout + up_demo.proc.stderr
    lines = up_demo.proc.stdout.splitlines()
    assert "a container: image gavel-demo-busybox:1, placed as hello-container above" in lines
    assert any(line.strip().startswith("hello-container-") and " -> node-" in line
               for line in lines), up_demo.proc.stdout


async def test_a_container_the_engine_refuses_fails_to_start_with_its_sentence(
        cluster: Cluster, engines: list[Engine], docker: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    """A memory limit below the engine's minimum (6 MB): the engine refuses to create it, the
    attempt ends as *driver failed to start* with the engine's own sentence on one line, and
    the worker logs no traceback."""
    tag = image(docker, "v1")
    await cluster.start_broker()
    await start(cluster, engines, "n1")
    await cluster.wait_nodes(1)
    iid = await cluster.submit(Spec(name="tiny", image=tag, attempts=1, memory_mb=4,
                                    command=["true"]))
    st = await ended(cluster, iid)
    assert (st.state, st.reason) == ("failed", Reason.DRIVER_FAILED), st
    assert "memory" in st.detail.lower() and "\n" not in st.detail, st
    assert "Traceback" not in caplog.text
    assert not containers(docker, cluster, iid, all_=True)


async def test_a_containers_output_is_capped_and_rotated_as_a_processs(
        cluster: Cluster, engines: list[Engine], docker: Any) -> None:
    """The same caps and rotation as a process's (`worker.logfiles`), and `gavel logs` reads
    what is kept in order, up to the last line."""
    limits = LogLimits(max_bytes=2000, files=2)
    tag = image(docker, "v1")
    await cluster.start_broker()
    await start(cluster, engines, "n1", log_limits=limits)
    await cluster.wait_nodes(1)
    iid = await cluster.submit(Spec(name="chatty", image=tag, command=[
        "sh", "-c", 'i=0; while [ $i -lt 3000 ]; do echo "line $i"; i=$((i+1)); done; '
                    'trap "exit 0" TERM; sleep 600 & wait']))
    d = instance_dir(cluster, "n1", iid)
    await wait_for(lambda: (d / "stdout.log.1").exists(), 60, what="a first rotation")

    async def to_the_end() -> list[str]:
        proc = await gavel("logs", iid, "--nats", cluster.url)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.splitlines()
    lines: list[str] = []

    async def ended_with_the_last() -> bool:
        lines[:] = await to_the_end()
        return bool(lines) and lines[-1] == "line 2999"
    await wait_for(ended_with_the_last, 60, what="the last line through gavel logs")
    assert not (d / f"stdout.log.{limits.files + 1}").exists()
    seen = [int(x.rpartition("line ")[2]) for x in lines if x.startswith("line ")]
    assert seen == sorted(set(seen)) and seen[0] > 0, "in order, the oldest rotated away"
