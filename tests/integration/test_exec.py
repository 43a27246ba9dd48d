"""`gavel exec`: a command inside a running instance, streamed over NATS from its node, against
a real broker, worker and nats-server, and a real Docker Engine where one answers.

What must hold: in a process instance the command runs as the instance's uid, in its
directory, its environment less its secret values, its cgroup and its mount namespace (its
private /tmp); stdin reaches it, stdout and stderr come back apart, its exit status is the
command's; each session is an ``exec`` event naming who ran what and how it ended; the
session's time limit kills the command; an instance the node does not run is one sentence;
in a container instance the command runs inside the container.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gavel.client import Client
from gavel.shared.api import EventsReply, EventsRequest
from gavel.shared.execstream import Ended, ExecOutput, ExecStart
from gavel.shared.messages import InstanceState
from gavel.shared.spec import Restart, Spec
from gavel.transport.execclient import new_session, run
from gavel.worker.cgroups import Enforcement, detect
from gavel.worker.isolation import Isolation, configure
from tests.integration.harness import Cluster, wait_for

pytestmark = pytest.mark.integration

ROOT = os.geteuid() == 0


@pytest.fixture
async def world(nats_url: str) -> AsyncIterator[Cluster]:
    """A cluster under /var/tmp: /tmp is private to an isolated instance."""
    root = Path(tempfile.mkdtemp(prefix="gavel-exec-", dir="/var/tmp"))
    root.chmod(0o755)
    c = Cluster(nats_url, root)
    try:
        yield c
    finally:
        await c.close()
        shutil.rmtree(root, ignore_errors=True)


def node_id() -> str:
    return f"ex-{uuid.uuid4().hex[:10]}"


def isolated(cluster: Cluster, node: str) -> dict[str, object]:
    """Uids, and cgroups where the host has them, as production gives them (root only)."""
    if not ROOT:
        return {}
    iso: Isolation = configure("uids", (400_000, 465_535), allow_root=False, owner=node,
                               leases=cluster.root / "leases")
    got: Enforcement = detect("auto", node)
    return {"isolation": iso, **({"cgroups": got} if got.hierarchy is not None else {})}


async def running_pid(cluster: Cluster, node: str, iid: str) -> int:
    agent = cluster.agents[node]

    def pid() -> int:
        return next((r.pid for r in agent.instances()
                     if r.instance_id == iid and r.state == InstanceState.RUNNING), 0)
    await wait_for(lambda: pid() > 0, 30, what=f"{iid} running")
    return pid()


async def exec_events(cluster: Cluster, iid: str, n: int) -> list[object]:
    async def got() -> list[object]:
        reply = await cluster.call("events", EventsRequest(instance_id=iid, limit=0),
                                   EventsReply)
        return [e for e in reply.events if e.type == "exec"]
    await wait_for(lambda: _len(got(), n), 15, what=f"{n} exec events")
    return await got()


async def _len(events: object, n: int) -> bool:
    return len(await events) >= n  # type: ignore[arg-type]


async def test_a_command_runs_as_the_instance_with_its_streams_and_exit_status(
        world: Cluster) -> None:
    node = node_id()
    await world.start_broker(secrets={"SECRET_TOKEN": "hunter2-exec"})
    await world.start_agent(node, **isolated(world, node))  # type: ignore[arg-type]
    await world.wait_nodes(1)
    iid = await world.submit(Spec(
        name="target", command=["/bin/sh", "-c", "echo mine > /tmp/mine; exec sleep 120"],
        env={"GREETING": "bonjour"}, secrets=["SECRET_TOKEN"], attempts=1,
        restart=Restart(attempts=0)))
    pid = await running_pid(world, node, iid)
    inst_dir = world.root / "workers" / node / "instances" / iid
    await wait_for(lambda: Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep"), 10,
                   what="the instance's sleep")
    script = ("id -u; pwd; echo \"G=$GREETING\"; echo \"S=${SECRET_TOKEN:-none}\"; "
              "cat /tmp/mine; cat /proc/self/cgroup; readlink /proc/self/ns/mnt; "
              "read line; echo \"got $line\"; echo oops >&2; exit 7")
    env = {k: v for k, v in os.environ.items() if k != "GAVEL_CREDS"}
    proc = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "gavel", "exec", iid, "--nats", world.url,
                         "--", "/bin/sh", "-c", script],
        input="typed by the operator\n", capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 7, proc.stderr
    lines = proc.stdout.splitlines()
    status = Path(f"/proc/{pid}/status").read_text()
    uid = next(ln.split()[1] for ln in status.splitlines() if ln.startswith("Uid:"))
    assert lines[0] == uid
    if ROOT:
        assert int(uid) >= 400_000  # the instance's own uid, not the worker's
    assert lines[1] == str(inst_dir)
    assert "G=bonjour" in lines and "S=none" in lines  # its env, less its secret values
    assert "hunter2-exec" not in proc.stdout
    assert "got typed by the operator" in lines
    assert proc.stderr == "oops\n"
    if ROOT:
        assert "mine" in lines  # its private /tmp: its mount namespace
        assert os.readlink(f"/proc/{pid}/ns/mnt") in lines
        cgroups = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        if any(iid in c for c in cgroups):
            assert all(c in lines for c in cgroups if iid in c)  # its cgroup
    (event,) = await exec_events(world, iid, 1)
    assert event.exit_code == 7 and event.node_id == node  # type: ignore[attr-defined]
    assert event.detail.startswith("operator ran /bin/sh -c")  # type: ignore[attr-defined]
    assert event.reason == ""  # type: ignore[attr-defined]


async def test_the_time_limit_kills_the_command_and_says_so(world: Cluster) -> None:
    node = node_id()
    await world.start_broker()
    await world.start_agent(node, **isolated(world, node))  # type: ignore[arg-type]
    await world.wait_nodes(1)
    iid = await world.submit(Spec(name="t", command=["sleep", "120"], attempts=1))
    await running_pid(world, node, iid)
    out: list[ExecOutput] = []
    start = ExecStart(node_id=node, instance_id=iid, session=new_session(),
                      command=["/bin/sh", "-c", "echo started; exec sleep 100"], timeout_s=1.0)
    ended = await asyncio.wait_for(run(await world.client(), start, out.append), 30)
    assert ended.reason == Ended.TIMEOUT and ended.exit_code is None
    assert b"".join(o.data for o in out) == b"started\n"
    (event,) = await exec_events(world, iid, 1)
    assert event.reason == Ended.TIMEOUT  # type: ignore[attr-defined]

    agent = world.agents[node]
    agent.execs.output_max = 100_000  # the output limit, as production's but smaller
    flood = ExecStart(node_id=node, instance_id=iid, session=new_session(),
                      command=["/bin/sh", "-c", "yes; sleep 100"])
    out.clear()
    ended = await asyncio.wait_for(run(await world.client(), flood, out.append), 30)
    assert ended.reason == Ended.OUTPUT and ended.exit_code is None
    assert sum(len(o.data) for o in out) <= 100_000

    hung = ExecStart(node_id=node, instance_id=iid, session=new_session(),
                     command=["/bin/sh", "-c", "echo ready; exec sleep 100"])
    out.clear()
    session = asyncio.ensure_future(run(await world.client(), hung, out.append))
    await wait_for(lambda: bool(out), 15, what="the command started")
    session.cancel()  # Ctrl-C: the operator hangs up
    events = await exec_events(world, iid, 3)
    assert [e.reason for e in events][-2:] == [Ended.OUTPUT, Ended.HUNG_UP]  # type: ignore[attr-defined]

    nowhere = ExecStart(node_id=node, instance_id="no-such-instance", session=new_session(),
                        command=["true"])
    refused = await asyncio.wait_for(run(await world.client(), nowhere, out.append), 30)
    assert refused.reason == Ended.NOT_HELD and refused.exit_code is None


async def test_output_past_the_window_waits_for_acknowledgements_and_all_arrives(
        world: Cluster) -> None:
    node = node_id()
    await world.start_broker()
    await world.start_agent(node)
    await world.wait_nodes(1)
    iid = await world.submit(Spec(name="w", command=["sleep", "120"], attempts=1))
    await running_pid(world, node, iid)
    out: list[ExecOutput] = []
    code = "import sys\nfor i in range(3000): sys.stdout.write(f'{i}\\n'); sys.stdout.flush()"
    client = Client(await world.client())  # the typed client's exec: the CLI's own path
    ended = await asyncio.wait_for(client.exec(iid, [sys.executable, "-c", code],
                                               on_output=out.append), 60)
    assert ended.exit_code == 0 and ended.reason == ""
    assert [o.seq for o in out] == list(range(1, len(out) + 1))
    text = b"".join(o.data for o in out).decode()
    assert text.split() == [str(i) for i in range(3000)]
    env = {k: v for k, v in os.environ.items() if k != "GAVEL_CREDS"}
    unknown = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "gavel", "exec", "no-such", "--nats", world.url,
                         "--", "true"], capture_output=True, text=True, timeout=60, env=env)
    assert unknown.returncode == 4, unknown.stderr


async def test_a_terminal_is_the_command_s_controlling_terminal(world: Cluster) -> None:
    node = node_id()
    await world.start_broker()
    await world.start_agent(node, **isolated(world, node))  # type: ignore[arg-type]
    await world.wait_nodes(1)
    iid = await world.submit(Spec(name="tt", command=["sleep", "120"], attempts=1))
    await running_pid(world, node, iid)
    out: list[ExecOutput] = []

    async def typed() -> AsyncIterator[bytes]:
        yield b"echo typed-$((6*7))\n"
        yield b"exit 5\n"
    start = ExecStart(node_id=node, instance_id=iid, session=new_session(), tty=True,
                      rows=33, cols=77, command=["/bin/sh", "-c", "tty; stty size; exec sh"])
    ended = await asyncio.wait_for(run(await world.client(), start, out.append,
                                       stdin=typed()), 30)
    text = b"".join(o.data for o in out).decode()
    assert ended.exit_code == 5, text
    assert "/dev/pts/" in text and "33 77" in text and "typed-42" in text
    assert {o.stream for o in out} == {"stdout"}  # one stream with a terminal


async def test_a_command_runs_inside_a_container_instance(world: Cluster, docker: Any) -> None:
    from gavel.worker.engine import connect
    from tests.integration.dockerkit import image

    tag = image(docker, "v1")
    node = node_id()
    engine = connect("auto", node_id=node, home=str((world.root / "workers" / node).resolve()))
    assert engine is not None, "the engine answered the fixture but not the worker"
    try:
        await world.start_broker()
        await world.start_agent(node, engine=engine)
        await world.wait_nodes(1)
        iid = await world.submit(Spec(
            name="c", image=tag, env={"GREETING": "hallo"}, memory_mb=32, attempts=1,
            command=["sleep", "120"]))
        await running_pid(world, node, iid)
        out: list[ExecOutput] = []

        async def typed() -> AsyncIterator[bytes]:
            yield b"from the operator\n"
        script = ("tr '\\0' ' ' < /proc/1/cmdline; echo; echo \"G=$GREETING\"; read l; "
                  "echo \"got $l\"; echo e >&2; exit 3")
        start = ExecStart(node_id=node, instance_id=iid, session=new_session(),
                          command=["/bin/busybox", "sh", "-c", script])
        nc = await world.client()

        ended = await asyncio.wait_for(run(nc, start, out.append, stdin=typed()), 60)
        assert ended.exit_code == 3, ended
        stdout = b"".join(o.data for o in out if o.stream == "stdout").decode()
        assert stdout.splitlines() == ["/bin/busybox sleep 120 ", "G=hallo",
                                       "got from the operator"]  # its pid 1: the container's
        assert b"".join(o.data for o in out if o.stream == "stderr") == b"e\n"
        events = await exec_events(world, iid, 1)
        assert events[-1].exit_code == 3  # type: ignore[attr-defined]
        out.clear()  # and with a terminal: the engine's tty, one stream
        shell = ExecStart(node_id=node, instance_id=iid, session=new_session(), tty=True,
                          command=["/bin/busybox", "sh", "-c", "tty; exit 4"])
        ended = await asyncio.wait_for(run(nc, shell, out.append), 60)
        assert ended.exit_code == 4
        assert b"/dev/pts/" in b"".join(o.data for o in out)
        assert {o.stream for o in out} == {"stdout"}
    finally:
        await world.close()
        engine.close()
