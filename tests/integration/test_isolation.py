"""Workloads are not the node, attacked by real instances through a real worker and broker:
an instance cannot read another instance's environment, its worker's credential, the
broker's seed, the worker's state or another instance's files; it cannot write itself into
a root cgroup, and one moved out of its cgroup from outside is killed with the fixed reason;
a fork bomb stops at its pids limit; root is only for a spec that asks, on a node that allows
it; an exec check runs as its instance, seeing its private /tmp; two workers under one node
id keep their own cgroup parents, and a parent removed from outside is made again. The
attackers are shell scripts (any uid may run /bin/sh; this machine's Python lives under a
directory only root may enter). Tests that need root, or a writable cgroup hierarchy, skip
saying so."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gavel.shared.messages import InstanceState, Spec
from gavel.shared.reasons import Reason
from gavel.shared.spec import Check, Restart
from gavel.shared.strategies import make_strategy
from gavel.transport.identity import init
from gavel.worker.agent import Agent
from gavel.worker.cgroups import Enforcement, detect
from gavel.worker.isolation import Isolation, configure
from tests.integration.harness import TIMING, Cluster, UpDemo, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="isolation switches uids: it needs "
                                "a worker running as root")

#: Every root cgroup.procs an escaping process might write itself into.
ROOT_PROCS = [p for p in (Path("/sys/fs/cgroup") / c / "cgroup.procs"
                          for c in ("memory", "cpu", "pids", "unified")) if p.exists()]


def node_id() -> str:
    return f"iso-{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def world(nats_url: str) -> AsyncIterator[Cluster]:
    """A cluster whose files sit where any uid could reach them but for what the worker
    sets (a pytest directory under /tmp is root's alone, and /tmp is private to an
    isolated instance: a test there would prove nothing)."""
    root = Path(tempfile.mkdtemp(prefix="gavel-iso-", dir="/var/tmp"))
    root.chmod(0o755)
    c = Cluster(nats_url, root)
    try:
        yield c
    finally:
        await c.close()
        shutil.rmtree(root, ignore_errors=True)


def isolation(cluster: Cluster, node: str) -> Isolation:
    return configure("uids", (300_000, 365_535), allow_root=False, owner=node,
                     leases=cluster.root / "leases")


def enforced(node: str) -> Enforcement:
    got = detect("auto", node)
    if got.hierarchy is None:
        pytest.skip(got.summary)
    return got


def sh(name: str, script: str, **kw: object) -> Spec:
    return Spec(name=name, command=["/bin/sh", "-c", script], attempts=1,
                restart=Restart(attempts=0), **kw)  # type: ignore[arg-type]


async def running(cluster: Cluster, node: str, iid: str) -> int:
    agent = cluster.agents[node]

    def pid() -> int:
        return next((r.pid for r in agent.instances()
                     if r.instance_id == iid and r.state == InstanceState.RUNNING), 0)

    await wait_for(lambda: pid() > 0, 30, what=f"{iid} running")
    return pid()


async def ended(cluster: Cluster, iid: str) -> object:
    async def done() -> bool:
        st = (await cluster.status(iid)).state
        return bool(InstanceState(st).terminal)

    await wait_for(done, 30, what=f"{iid} ended")
    return await cluster.status(iid)


def output(cluster: Cluster, node: str, iid: str, stream: str = "stdout") -> str:
    return (cluster.root / "workers" / node / "instances" / iid / f"{stream}.log").read_text()


async def test_an_instance_reads_nothing_of_another_instance_its_worker_or_the_broker(
        world: Cluster) -> None:
    node = node_id()
    ids = init(world.root / "up", [node])
    ids.directory.chmod(0o755)  # even a careless auth directory: the seeds are 0600
    await world.start_broker()
    await world.start_agent(node, isolation=isolation(world, node))
    await world.wait_nodes(1)
    victim = await world.submit(sh("victim", "sleep 60", env={"SECRET": "hunter2-victim"}))
    victim_pid = await running(world, node, victim)
    state = world.root / "workers" / node
    script = (
        'for f in "/proc/$VICTIM/environ" "$CREDS" "$SEED" "$STATE/agent.json" '
        '"$STATE/instances/$VID/stdout.log"; do '
        '  if cat "$f" >> stolen 2>/dev/null; then echo "READ $f"; else echo "DENIED $f"; fi; '
        'done; '
        'if ls "$STATE" "$STATE/instances" >/dev/null 2>&1; then echo "LISTED"; '
        'else echo "DENIED listing"; fi; '
        'if kill -0 "$VICTIM" 2>/dev/null; then echo "SIGNALLED"; else echo "DENIED kill"; fi; '
        'id -u; cat stolen 2>/dev/null; true')
    thief = await world.submit(sh("thief", script, env={
        "VICTIM": str(victim_pid), "VID": victim, "CREDS": str(ids.nodes[node]),
        "SEED": str(ids.broker), "STATE": str(state)}))
    await ended(world, thief)
    out = output(world, node, thief)
    assert "READ" not in out and "LISTED" not in out and "SIGNALLED" not in out, out
    assert out.count("DENIED") == 7, out
    assert "hunter2-victim" not in out
    assert ids.broker.read_text().strip() not in out
    uid = int(out.split("DENIED kill\n", 1)[1].split()[0])
    assert uid >= 300_000  # not root, not the worker
    assert (await world.status(victim)).state == InstanceState.RUNNING
    assert (state / "instances" / victim).stat().st_mode & 0o777 == 0o700


async def test_an_instance_cannot_write_itself_into_a_root_cgroup(world: Cluster) -> None:
    node = node_id()
    await world.start_broker()
    await world.start_agent(node, cgroups=enforced(node), isolation=isolation(world, node))
    await world.wait_nodes(1)
    script = " ".join(f'if echo $$ > {p} 2>/dev/null; then echo "MOVED {p}"; '
                      f'else echo "DENIED {p}"; fi;' for p in ROOT_PROCS) + " cat /proc/self/cgroup"
    iid = await world.submit(sh("climber", script))
    st = await ended(world, iid)
    out = output(world, node, iid)
    assert "MOVED" not in out and out.count("DENIED") == len(ROOT_PROCS), out
    assert f"/{node}/{iid}" in out  # still in its own cgroup
    assert st.state == InstanceState.SUCCEEDED, (st.reason, st.detail)  # type: ignore[attr-defined]


async def test_an_instance_moved_out_of_its_cgroup_is_killed_with_the_reason(
        world: Cluster) -> None:
    node = node_id()
    await world.start_broker()
    agent = await world.start_agent(node, cgroups=enforced(node),
                                    isolation=isolation(world, node))
    await world.wait_nodes(1)
    iid = await world.submit(sh("escapee", "sleep 60 & sleep 60"))
    pid = await running(world, node, iid)
    for procs in ROOT_PROCS:  # what root could do for it, or an instance allowed root
        procs.write_text(str(pid))
    st = await ended(world, iid)
    assert st.state == InstanceState.FAILED  # type: ignore[attr-defined]
    assert st.reason == Reason.ESCAPED_CGROUP  # type: ignore[attr-defined]
    await wait_for(lambda: not Path(f"/proc/{pid}").exists()
                   or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] in "ZX",
                   10, what="the escaped process killed")
    assert agent.escapes == 1  # counted (the worker's gavel_worker_cgroup_escapes_total)


async def test_a_fork_bomb_stops_at_its_pids_limit(world: Cluster) -> None:
    node = node_id()
    enforcement = enforced(node)
    assert enforcement.hierarchy is not None
    if not enforcement.hierarchy.limits_pids:
        pytest.skip("this host's cgroups have no pids controller")
    await world.start_broker()
    await world.start_agent(node, cgroups=enforcement, isolation=isolation(world, node))
    await world.wait_nodes(1)
    # the subshell forks until the kernel refuses (dash then gives up); the shell goes on
    # without forking again and replaces itself with a sleep
    script = ('( i=0; while [ $i -lt 40 ]; do i=$((i+1)); sleep 30 & echo "started $i"; '
              'done ); echo "bomb stopped"; exec sleep 30')
    iid = await world.submit(sh("bomb", script, pids=8))
    await running(world, node, iid)
    await wait_for(lambda: "bomb stopped" in output(world, node, iid), 30,
                   what="the bomb stopped")
    started = [int(line.split()[1]) for line in output(world, node, iid).splitlines()
               if line.startswith("started")]
    assert max(started) < 8  # the shell and its subshell are two of the 8
    assert "fork" in output(world, node, iid, "stderr").lower()
    pids_dir = enforcement.hierarchy.parents["pids"] / iid
    assert (pids_dir / "pids.max").read_text().strip() == "8"
    assert int((pids_dir / "pids.current").read_text()) <= 8


async def test_a_starting_worker_takes_back_its_stale_uid_leases(world: Cluster) -> None:
    """A lease of an instance the worker does not hold (it crashed before it could give it
    back) is removed at its start; another worker's lease on the host is left alone."""
    node = node_id()
    leases = world.root / "leases"
    leases.mkdir(mode=0o700, parents=True, exist_ok=True)
    (leases / "300001").write_text(f"{node}/gone-1")
    (leases / "300002").write_text("another-node/alive-1")
    await world.start_broker()
    await world.start_agent(node, isolation=isolation(world, node))
    await world.wait_nodes(1)
    assert not (leases / "300001").exists()
    assert (leases / "300002").read_text() == "another-node/alive-1"


async def declined_for_root(cluster: Cluster, iid: str) -> object:
    """Until `iid` waits unschedulable, every node having declined it for root at bid time
    (`shared.feasibility`): never placed, so never started and failed."""
    async def declined() -> bool:
        st = await cluster.status(iid)
        return st.state == InstanceState.UNSCHEDULABLE and Reason.ROOT_REFUSED in st.reason

    await wait_for(declined, 30, what=f"{iid} declined for root")
    st = await cluster.status(iid)
    assert not cluster.holders(iid), cluster.holders(iid)
    return st


async def test_root_only_on_a_node_that_allows_it(world: Cluster) -> None:
    node, allowing = node_id(), node_id()
    await world.start_broker()
    await world.start_agent(node, isolation=isolation(world, node))
    await world.wait_nodes(1)
    iid = await world.submit(sh("wants-root", "id -u", root=True))
    await declined_for_root(world, iid)
    await world.stop_agent(node)
    allowed = configure("uids", (300_000, 365_535), allow_root=True, owner=allowing,
                        leases=world.root / "leases")
    await world.start_agent(allowing, isolation=allowed)
    for waited in (iid, await world.submit(sh("root-ok", "id -u", root=True))):
        st = await ended(world, waited)
        assert st.state == InstanceState.SUCCEEDED  # type: ignore[attr-defined]
        assert output(world, allowing, waited).strip() == "0"


async def test_an_exec_check_runs_as_the_instance_beside_its_private_tmp(
        world: Cluster) -> None:
    node = node_id()
    await world.start_broker()
    await world.start_agent(node, cgroups=enforced(node), isolation=isolation(world, node))
    await world.wait_nodes(1)
    # healthy only if the check sees the instance's own /tmp, runs as its uid and in its
    # directory (joining the instance's mount namespace moves a process to its root)
    check = Check(type="exec", command=["/bin/sh", "-c", 'test "$(cat /tmp/me)" = "$(id -u)" '
                                        '&& test "$(pwd)" = "$HOME"'],
                  interval_s=0.2, timeout_s=5.0)
    iid = await world.submit(sh("checked", 'id -u > /tmp/me; echo "$HOME"; exec sleep 60',
                                type="service", checks=[check]))
    await running(world, node, iid)
    home = world.root / "workers" / node / "instances" / iid
    await wait_for(lambda: output(world, node, iid).strip() == str(home), 10,
                   what="its own directory as HOME")
    await wait_for(lambda: any(r.instance_id == iid and r.health == "healthy"
                               for r in world.agents[node].instances()), 30, what="healthy")
    assert not Path("/tmp/me").exists()  # the instance wrote into its own /tmp, not the host's


async def test_an_instance_whose_directory_is_under_tmp_keeps_it_beside_its_private_tmp(
        nats_url: str) -> None:
    """A worker whose state is under /tmp: the private /tmp would hide the instance's own
    directory - its HOME, where its checks start - so it is bound back at its path."""
    root = Path(tempfile.mkdtemp(prefix="gavel-iso-", dir="/tmp"))
    root.chmod(0o755)
    world = Cluster(nats_url, root)
    try:
        node = node_id()
        await world.start_broker()
        agent = await world.start_agent(node, cgroups=enforced(node),
                                        isolation=isolation(world, node))
        if not agent.isolation.private_tmp:
            pytest.skip("no private /tmp here (needs root and mount namespaces)")
        await world.wait_nodes(1)
        check = Check(type="exec", command=["/bin/sh", "-c", 'test "$(pwd)" = "$HOME" '
                                            '&& test -f "$HOME/mine" && test -f /tmp/me'],
                      interval_s=0.2, timeout_s=5.0)
        iid = await world.submit(sh("under-tmp", 'touch "$HOME/mine" /tmp/me; pwd; '
                                    'exec sleep 60', type="service", checks=[check]))
        await running(world, node, iid)
        home = root / "workers" / node / "instances" / iid
        await wait_for(lambda: output(world, node, iid).strip() == str(home), 10,
                       what="its own directory, by its path")
        await wait_for(lambda: any(r.instance_id == iid and r.health == "healthy"
                                   for r in world.agents[node].instances()), 30,
                       what="healthy: its check found its directory and its /tmp")
        assert (home / "mine").exists() and not Path("/tmp/me").exists()
    finally:
        await world.close()
        shutil.rmtree(root, ignore_errors=True)


def test_two_workers_under_one_node_id_keep_their_own_cgroup_parents(tmp_path: Path) -> None:
    node = node_id()
    one = detect("auto", node, state_dir=tmp_path / "one").hierarchy
    two = detect("auto", node, state_dir=tmp_path / "two").hierarchy
    if one is None or two is None:
        pytest.skip("no writable cgroup hierarchy here")
    assert one.parents["memory"] != two.parents["memory"]
    one.close()  # the first worker stops, with nothing running: its parent goes
    assert not one.parents["memory"].exists()
    assert two.parents["memory"].exists()
    for parent in {*two.parents.values()}:  # removed from outside: made again at the next start
        parent.rmdir()
    cg = two.create("i1", cpu=0.1, memory_mb=32, pids=16)
    with cg.entry() as enter:
        proc = subprocess.Popen(["/bin/sh", "-c", "cat /proc/self/cgroup"], preexec_fn=enter,
                                stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=30)
    assert f"/gavel/{node}/{two.parents['memory'].name}/i1" in out
    cg.remove()
    two.close()
    assert not (two.parents["memory"].parent).exists()  # the node's, left empty, goes too


async def test_stopping_one_of_two_workers_under_one_node_id_leaves_the_other_starting(
        world: Cluster) -> None:
    node = node_id()
    await world.start_broker()
    agents, tasks = [], []
    for name in ("one", "two"):  # as two test workers on one host, or a mistaken deploy
        state = world.root / name
        cgroups = detect("auto", node, state_dir=state)
        if cgroups.hierarchy is None:
            pytest.skip(cgroups.summary)
        agent = Agent(nats_url=world.url, node_id=node, strategy=make_strategy("least-loaded"),
                      labels={}, state_dir=state, timing=TIMING, cpu=4.0, memory_mb=4096,
                      cgroups=cgroups, isolation=isolation(world, f"{node}-{name}"))
        agents.append(agent)
        tasks.append(asyncio.create_task(agent.run()))
    await world.wait_nodes(1)
    one, two = agents
    assert one.enforcement.hierarchy is not None and two.enforcement.hierarchy is not None
    await one.stop()  # nothing runs under it: its parent goes, and only its own
    await tasks[0]
    assert not one.enforcement.hierarchy.parents["memory"].exists()
    parent = two.enforcement.hierarchy.parents["memory"]
    assert parent.exists()
    try:
        iid = await world.submit(sh("after", "exec sleep 60"))

        def pid() -> int:
            return next((r.pid for r in two.instances()
                         if r.instance_id == iid and r.state == InstanceState.RUNNING), 0)

        await wait_for(lambda: pid() > 0, 30, what="the other worker started it")
        assert (parent / iid).is_dir()
        assert f"/{parent.name}/{iid}" in Path(f"/proc/{pid()}/cgroup").read_text()
    finally:
        await two.stop()
        await tasks[1]


def test_gavel_up_demo_runs_its_workloads_isolated(up_demo: UpDemo) -> None:
    """`make run`'s shape: the demo's workloads run, each as a uid of its own."""
    proc = up_demo.proc
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "/web -> 200 hello from web-" in proc.stdout
    logs = "".join(p.read_text() for p in (up_demo.state / "logs").glob("node-*.log"))
    assert logs.count("isolation: each instance runs as its own uid in 200000-265535") == 2
    dirs = list((up_demo.state / "workers").glob("*/instances/*"))
    # a container (where an engine answers) is isolated by the engine, not by a uid of the
    # node's (docs/containers.md): its directory holds only the worker's copy of its output
    for d in [d for d in dirs if d.name.startswith("hello-container-")]:
        assert (d.stat().st_uid, d.stat().st_mode & 0o777) == (0, 0o700), d
        dirs.remove(d)
    assert dirs
    for d in dirs:
        st = d.stat()
        assert 200_000 <= st.st_uid <= 265_535 and st.st_mode & 0o777 == 0o700, d
    assert len({d.stat().st_uid for d in dirs}) == len(dirs)
    # nothing else of the cluster's is an instance's to read: logs, the repository, seeds
    for name in ("logs", "state.git", "auth"):
        assert (up_demo.state / name).stat().st_mode & 0o777 == 0o700, name
    assert up_demo.state.stat().st_mode & 0o777 == 0o711


async def test_a_link_planted_for_the_workers_log_is_never_followed(world: Cluster) -> None:
    """The instance owns its directory, so it can put a link where the worker (root) opens
    stderr.log: the restart refuses to start rather than write root's file, and the failure
    quotes nothing of it."""
    node = node_id()
    secret = world.root / "root-only"
    secret.write_text("TOPSECRET\n")
    secret.chmod(0o600)
    await world.start_broker()
    await world.start_agent(node, isolation=isolation(world, node))
    await world.wait_nodes(1)
    script = f'echo oops >&2; rm -f stderr.log; ln -s {secret} stderr.log; exit 3'
    iid = await world.submit(Spec(name="planter", command=["/bin/sh", "-c", script],
                                  attempts=1, restart=Restart(attempts=2, delay_s=0.0)))
    st = await ended(world, iid)
    assert st.state == InstanceState.FAILED  # type: ignore[attr-defined]
    assert st.reason == Reason.DRIVER_FAILED, st  # type: ignore[attr-defined]
    assert "TOPSECRET" not in st.detail  # type: ignore[attr-defined]
    assert secret.read_text() == "TOPSECRET\n"  # root's file untouched


SYSTEM_PYTHON = "/usr/bin/python3"


async def test_a_worker_that_is_not_root_runs_instances_as_itself_and_says_so(
        world: Cluster) -> None:
    """A developer's laptop: the worker cannot switch uids, so its instances run as its own
    user, and it says so once at start. The worker runs as nobody, on the system's Python
    (this one is under a directory nobody may enter) with this tree on its path."""
    if shutil.which("setpriv") is None or not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip("needs setpriv and a system python3 to run a worker as another user")
    node = node_id()
    state = world.root / "nobody-worker"
    state.mkdir()
    os.chown(state, 65534, 65534)
    repo = Path(__file__).resolve().parents[2]
    site = next((repo / ".venv" / "lib").glob("python3*/site-packages"))
    log = world.root / "worker.log"
    await world.start_broker()
    env = {**os.environ, "PYTHONPATH": f"{repo}:{site}", "GAVEL_ISOLATION": "uids"}
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
             SYSTEM_PYTHON, "-m", "gavel", "worker", "--node-id", node, "--nats", world.url,
             "--state", str(state), "--cgroups", "off"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True)
    try:
        await world.wait_nodes(1, timeout=60)
        iid = await world.submit(sh("mine", "id -u"))
        st = await ended(world, iid)
        assert st.state == InstanceState.SUCCEEDED, st  # type: ignore[attr-defined]
        assert (state / "instances" / iid / "stdout.log").read_text().strip() == "65534"
        said = log.read_text()
        assert said.count("isolation: the worker is not root and cannot switch uids") == 1
        refused = await world.submit(sh("wants-root", "id -u", root=True))
        await declined_for_root(world, refused)
    finally:
        proc.terminate()
        proc.wait(30)
