"""`gavel logs`: an instance's output read from its node over NATS, with the real `gavel`
command as a child process against a broker and workers in this process.

What must hold: stdout, --stderr, --all (each to its own descriptor), --tail, --since and
--follow (until the instance ends, across the node's answer windows, without a line lost or
repeated); an instance that outlives its worker keeps its output, and the next worker
rotates it; ended instances stay readable until the node's retention removes them; a node
that does not answer is one sentence naming it (exit 1); and with real credentials another
node can neither read this node's logs nor answer for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest

from gavel.broker.service import Broker, Config
from gavel.shared import subjects
from gavel.shared.api import (
    CancelReply,
    CancelRequest,
    NodesReply,
    NodesRequest,
    SubmitReply,
    SubmitRequest,
)
from gavel.shared.logstream import LogChunk, LogsDone, LogsRequest
from gavel.shared.messages import ApiError, Spec
from gavel.shared.strategies import make_strategy
from gavel.transport import identity
from gavel.transport.client import call
from gavel.transport.logclient import read
from gavel.transport.natsserver import NatsServer
from gavel.worker.agent import Agent
from gavel.worker.logfiles import LogLimits
from tests.integration.clibatch import Line, run_all
from tests.integration.harness import TIMING, Cluster, wait_for

pytestmark = pytest.mark.integration
_enc = msgspec.msgpack.Encoder()


def printer(lines: int, every: float = 0.0, err: bool = True, then_sleep: float = 0) -> list[str]:
    """A command printing numbered lines to stdout (and `e<N>` to stderr), `every` apart."""
    code = (f"import sys, time\nfor i in range({lines}):\n"
            "    print(f'line {i}', flush=True)\n"
            + ("    print(f'e{i}', file=sys.stderr, flush=True)\n" if err else "")
            + f"    time.sleep({every})\n"
            + f"time.sleep({then_sleep})\n")
    return [sys.executable, "-c", code]


async def gavel(*args: str, creds: str | None = None, timeout: float = 90
                ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GAVEL_CREDS",)}
    if creds:
        env["GAVEL_CREDS"] = creds
    return await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "gavel", *args], capture_output=True,
        text=True, timeout=timeout, env=env)


async def gavel_many(tmp: Path, *lines: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """`gavel` once per line, all in one child process (`tests.integration.clibatch`): for
    commands that only read, side by side."""
    env = {k: v for k, v in os.environ.items() if k not in ("GAVEL_CREDS",)}
    return await asyncio.to_thread(run_all, [Line(args, tmp) for args in lines],
                                   tmp / "results.json", env)


async def running(cluster: Cluster, iid: str, state: str = "running") -> None:
    async def there() -> bool:
        return bool((await cluster.status(iid)).state == state)
    await wait_for(there, 20, what=f"{iid} {state}")


def kill_orphan(cluster: Cluster, node: str, iid: str) -> None:
    """End an instance left running by a worker stopped with kill_children=False."""
    state = json.loads((cluster.root / "workers" / node / "agent.json").read_text())
    pid = state["instances"].get(iid, {}).get("pid", 0)
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def numbers(text: str, prefix: str = "line ") -> list[int]:
    return [int(x.removeprefix(prefix)) for x in text.splitlines()]


async def test_stdout_stderr_all_tail_since_and_follow(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    url = cluster.url
    await cluster.submit(Spec(name="p", command=printer(5, then_sleep=60)), "done-5")
    await running(cluster, "done-5")
    out = cluster.root / "workers" / "node-a" / "instances" / "done-5" / "stdout.log"
    await wait_for(lambda: out.exists() and out.read_text().count("\n") == 5, 10,
                   what="five lines")
    await wait_for(lambda: (out.parent / "stderr.log").read_text().count("\n") == 5, 10,
                   what="five lines on stderr")

    tmp = cluster.root
    proc, err, both, as_json = await gavel_many(
        tmp, ["logs", "done-5", "--nats", url],
        ["logs", "done-5", "--stderr", "--tail", "2", "--nats", url],
        ["logs", "done-5", "--all", "--nats", url],
        ["logs", "done-5", "--json", "--tail", "1", "--nats", url])
    assert proc.returncode == 0, proc.stderr
    assert numbers(proc.stdout) == [0, 1, 2, 3, 4] and proc.stderr == ""
    assert err.stdout.splitlines() == ["e3", "e4"]
    assert numbers(both.stdout) == [0, 1, 2, 3, 4]  # the instance's stdout to stdout,
    assert both.stderr.splitlines() == [f"e{i}" for i in range(5)]  # its stderr to stderr
    assert [json.loads(x) for x in as_json.stdout.splitlines()] == [
        {"instance_id": "done-5", "stream": "stdout", "line": "line 4"}]
    await asyncio.sleep(2 * TIMING.tick_s + 1.0)  # quiet for over a second, to the tick
    recent, hour = await gavel_many(tmp, ["logs", "done-5", "--since", "1s", "--nats", url],
                                    ["logs", "done-5", "--since", "1h", "--nats", url])
    assert recent.returncode == 0 and recent.stdout == ""
    assert numbers(hour.stdout) == [0, 1, 2, 3, 4]

    # --follow: new lines as they come, until the instance ends; exit 0.
    await cluster.submit(Spec(name="f", command=printer(30, every=0.05, err=False)), "follow-1")
    proc = await gavel("logs", "follow-1", "--follow", "--nats", url)
    assert proc.returncode == 0, proc.stderr
    assert numbers(proc.stdout) == list(range(30))
    await running(cluster, "follow-1", "succeeded")
    # Ended, and still readable until the node's retention removes its directory.
    tail, again = await gavel_many(tmp, ["logs", "follow-1", "--tail", "3", "--nats", url],
                                   ["logs", "follow-1", "--follow", "--nats", url])
    assert numbers(tail.stdout) == [27, 28, 29]
    assert again.returncode == 0 and numbers(again.stdout) == list(range(30))  # ended: returns


async def follow_process(*args: str) -> tuple[asyncio.subprocess.Process, str]:
    """`gavel logs ... --follow` started, and the first line it wrote to stderr."""
    env = {k: v for k, v in os.environ.items() if k not in ("GAVEL_CREDS",)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gavel", "logs", *args, "--follow",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    assert proc.stderr is not None
    first = await asyncio.wait_for(proc.stderr.readline(), 60)
    return proc, first.decode()


async def test_a_follow_of_an_instance_no_node_ran_yet_waits_for_it(cluster: Cluster) -> None:
    """`gavel logs ID --follow` right after the submit: the instance waits for a node (here
    none is up yet); the follow waits with it, then prints all it writes. One cancelled
    before any node ran it ends the follow with its sentence."""
    await cluster.start_broker()
    await cluster.submit(Spec(name="late", command=printer(10, every=0.05, err=False)),
                         "late-1")
    proc, said = await follow_process("late-1", "--nats", cluster.url)
    state = (await cluster.status("late-1")).state
    assert said.startswith("gavel logs: waiting for late-1 to run ("), said
    assert state not in ("running", "succeeded")  # it did wait: no node was there
    await cluster.start_agent("node-a")
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0, err
    assert numbers(out.decode()) == list(range(10))

    await cluster.stop_agent("node-a")
    await cluster.submit(Spec(name="gone", command=printer(3, err=False)), "gone-1")
    proc, said = await follow_process("gone-1", "--nats", cluster.url)
    assert said.startswith("gavel logs: waiting for gone-1 to run ("), said
    await cluster.call("cancel", CancelRequest(instance_id="gone-1"), CancelReply)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1 and out == b""
    assert err.decode().splitlines()[-1].startswith("gavel logs: gone-1 cancelled"), err


async def test_a_follow_spans_many_answer_windows_without_a_gap(cluster: Cluster) -> None:
    """The node answers each request for a short window only (the server's response
    permission in production is `WINDOW_S`); the asker asks again from the cursor."""
    await cluster.start_broker()
    await cluster.start_agent("node-a", logs_window_s=0.5)
    await cluster.wait_nodes(1)
    await cluster.submit(Spec(name="w", command=printer(80, every=0.05, err=False)), "w-1")
    nc = await cluster.client()
    got: list[bytes] = []
    done = None
    with pytest.MonkeyPatch.context() as mp:
        windows = []
        real = nc.publish

        async def counting(subject: str, payload: bytes = b"", **kw: Any) -> None:
            if subject == subjects.LOGS.format(node="node-a"):
                windows.append(subject)
            await real(subject, payload, **kw)
        mp.setattr(nc, "publish", counting)
        await running(cluster, "w-1")
        done = await read(nc, LogsRequest(node_id="node-a", instance_id="w-1", follow=True),
                          lambda c: got.append(c.data), window_s=0.5)
    assert numbers(b"".join(got).decode()) == list(range(80))
    assert len(windows) >= 3  # asked again, from the cursor, window after window
    assert done is not None and not done.running and done.ended.startswith("exited")


async def test_output_outlives_its_worker_and_the_next_worker_rotates_it(
        cluster: Cluster) -> None:
    limits = LogLimits(max_bytes=2000, files=2)
    await cluster.start_broker()
    await cluster.start_agent("node-a", log_limits=limits)
    await cluster.wait_nodes(1)
    await cluster.submit(Spec(name="long", command=printer(100_000, every=0.002, err=False)),
                         "long-1")
    await running(cluster, "long-1")
    out = cluster.root / "workers" / "node-a" / "instances" / "long-1"
    await wait_for(lambda: (out / "stdout.log.1").exists(), 20, what="a first rotation")
    pid = json.loads((cluster.root / "workers" / "node-a" / "agent.json").read_text()
                     )["instances"]["long-1"]["pid"]
    await cluster.stop_agent("node-a", kill_children=False)
    grown = (out / "stdout.log").stat().st_size
    await wait_for(lambda: (out / "stdout.log").stat().st_size > grown + 2 * 2000, 20,
                   what="the instance writing on, with no worker")
    await cluster.start_agent("node-a", log_limits=limits)  # re-adopts, rotates again
    await wait_for(lambda: (out / "stdout.log").stat().st_size < 2 * 2000 + 2000, 20,
                   what="the next worker to rotate the file")
    os.kill(pid, 0)  # the same process, through all of it
    proc = await gavel("logs", "long-1", "--nats", cluster.url)
    assert proc.returncode == 0, proc.stderr
    # Whole lines, in order, nothing twice. Not "no gap": copy-and-truncate loses what the
    # instance writes between the copy's last read and the truncate (`worker.logfiles`
    # rule 2), and this instance writes all the time; tests/unit/test_logfiles.py shows
    # every position kept when no write races the truncate.
    # A line the truncate cut leaves its head in the copy and loses its tail, so the next
    # line read follows that head ("li" + "line 711"): the whole line is the one after it.
    lines = proc.stdout.splitlines()
    joined = [x for x in lines if not x.startswith("line ")]
    assert len(joined) <= 3, joined[:5]  # only at a rotation: a few in this run
    seen = [int(x.rpartition("line ")[2]) for x in lines]
    assert seen == sorted(set(seen))
    assert seen[0] > 0  # the oldest lines were rotated away: the cap held
    await cluster.call("cancel", CancelRequest(instance_id="long-1"), CancelReply)


async def test_ended_logs_are_removed_by_the_nodes_retention(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a", log_limits=LogLimits(keep_s=0.5, keep_max=100))
    await cluster.wait_nodes(1)
    await cluster.submit(Spec(name="q", command=printer(3)), "quick-1")
    await running(cluster, "quick-1", "succeeded")
    out = cluster.root / "workers" / "node-a" / "instances" / "quick-1"
    await wait_for(lambda: not out.exists(), 30, what="the retention to remove it")
    proc = await gavel("logs", "quick-1", "--nats", cluster.url)
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("gavel logs: node node-a has no output of instance "
                                   "quick-1 (it never ran there, or its logs were removed "
                                   "after it ended)")


async def test_a_node_that_does_not_answer_is_one_sentence(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    await cluster.submit(Spec(name="s", command=printer(1, then_sleep=60)), "s-1")
    await running(cluster, "s-1")
    await cluster.stop_agent("node-a", kill_children=False)
    kill_orphan(cluster, "node-a", "s-1")
    proc = await gavel("logs", "s-1", "--nats", cluster.url)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == ["gavel logs: node node-a is not answering for the "
                                        "logs of s-1: its worker is not connected to NATS."]
    proc = await gavel("logs", "nobody", "--nats", cluster.url)
    assert proc.returncode == 4  # unknown (the README's exit codes)
    assert proc.stderr.startswith("gavel logs: no instance or service named nobody")


# -- with real credentials -------------------------------------------------------------------

async def test_only_the_node_reads_and_answers_for_its_logs(tmp_path: Path) -> None:
    ids = identity.init(tmp_path, ["node-a", "node-b"])
    server = NatsServer(store_dir=tmp_path / "js", config=ids.config,
                        log=tmp_path / "nats.log").start()
    broker = Broker(Config(nats_url=server.url, state_dir=tmp_path / "state", timing=TIMING,
                           nats_options={"nkeys_seed": str(ids.broker)}))
    agents: list[tuple[Agent, asyncio.Task[None]]] = []
    conns: list[Any] = []
    errors: dict[str, list[str]] = {}

    async def connect(who: str, seed: Path, **kw: Any) -> Any:
        async def on_error(exc: Exception) -> None:
            errors.setdefault(who, []).append(str(exc).lower())
        nc = await nats.connect(server.url, nkeys_seed=str(seed), error_cb=on_error,
                                allow_reconnect=False, **kw)
        conns.append(nc)
        return nc

    try:
        await broker.start()
        for node in ("node-a", "node-b"):
            agent = Agent(nats_url=server.url, node_id=node,
                          strategy=make_strategy("least-loaded"), labels={"n": node},
                          state_dir=tmp_path / node, timing=TIMING, cpu=2.0, memory_mb=2048,
                          nats_options={"nkeys_seed": str(ids.nodes[node])})
            agents.append((agent, asyncio.create_task(agent.run())))
        await wait_for(lambda: len(broker.liveness.eligible(broker.now())) == 2, 15,
                       what="both nodes")
        op = await connect("operator", ids.operator)
        await call(op, "submit", SubmitRequest(spec=Spec(
            name="secret", command=printer(3, then_sleep=60), labels={"n": "node-a"}),
            instance_id="on-a"), SubmitReply)
        out = tmp_path / "node-a" / "instances" / "on-a" / "stdout.log"
        await wait_for(lambda: out.exists() and out.read_text().count("\n") == 3, 20,
                       what="its output")

        # The operator reads node-a's logs, through the CLI, with its credential.
        proc = await gavel("logs", "on-a", "--nats", server.url, creds=str(ids.operator))
        assert proc.returncode == 0, proc.stderr
        assert numbers(proc.stdout) == [0, 1, 2]

        # node-b cannot listen on node-a's log subject, nor ask node-a for its logs.
        b = await connect("node-b", ids.nodes["node-b"], inbox_prefix="_INBOX_node-b")
        await b.subscribe(subjects.LOGS.format(node="node-a"))
        request = LogsRequest(node_id="node-a", instance_id="on-a")
        await b.publish(subjects.LOGS.format(node="node-a"), _enc.encode(request),
                        reply="_INBOX_node-b.steal")
        await b.flush()
        await wait_for(lambda: any('subscription to "gavel.logs.node-a"' in e
                                   for e in errors.get("node-b", [])), 10,
                       what="the server to refuse node-b the subscription")
        await wait_for(lambda: any('publish to "gavel.logs.node-a"' in e
                                   for e in errors.get("node-b", [])), 10,
                       what="the server to refuse node-b the request")

        # node-b cannot answer for node-a: the operator's inbox is not its to publish to,
        # even when it knows the subject. The operator hears node-a's answer only.
        inbox = op.new_inbox()
        heard: list[Any] = []

        async def keep(msg: Any) -> None:
            heard.append(msgspec.msgpack.decode(msg.data, type=LogChunk | LogsDone))
        await op.subscribe(inbox, cb=keep)
        # The barrier: a request sent behind the SUB, answered (an operator may not publish
        # into its own inbox, so `wire.subscribed` is not open to it).
        await call(op, "nodes", NodesRequest(), NodesReply)
        forged = LogChunk(instance_id="on-a", stream="stdout", data=b"forged\n", end=7)
        await b.publish(inbox, _enc.encode(forged))
        await b.flush()
        await op.publish(subjects.LOGS.format(node="node-a"), _enc.encode(request),
                         reply=inbox)
        await wait_for(lambda: any(isinstance(m, LogsDone) for m in heard), 10,
                       what="node-a's answer")
        await wait_for(lambda: any(f'publish to "{inbox.lower()}"' in e
                                   for e in errors.get("node-b", [])), 10,
                       what="the server to refuse node-b the operator's inbox")
        assert b"".join(m.data for m in heard if isinstance(m, LogChunk)) == \
            b"line 0\nline 1\nline 2\n"
        # node-a itself may answer requests it got, never write into an inbox otherwise.
        a = await connect("node-a", ids.nodes["node-a"], inbox_prefix="_INBOX_node-a")
        await a.publish(inbox, _enc.encode(forged))
        await a.flush()
        await wait_for(lambda: any(f'publish to "{inbox.lower()}"' in e
                                   for e in errors.get("node-a", [])), 10,
                       what="the server to refuse node-a an inbox it was not asked from")
        assert not any(isinstance(m, LogChunk) and m.data == b"forged\n" for m in heard)
        # and the real node's answers never tripped a violation: node-a's one is the forgery
        key = identity.public_key(ids.nodes["node-a"].read_text().strip())
        assert [line.rsplit(" - ", 1)[-1] for line in
                (tmp_path / "nats.log").read_text().splitlines()
                if "Violation" in line and key in line] == [f'Subject "{inbox}"']
    finally:
        for nc in conns:
            if not nc.is_closed:
                await nc.close()
        for agent, task in agents:
            await agent.stop()
            await task
        await broker.close()
        server.stop()


async def test_the_worker_daemon_rotates_as_its_flags_say(cluster: Cluster) -> None:
    """`gavel worker --instance-log-mb --instance-log-files`, a real daemon process."""
    from tests.integration.harness import gavel_process

    await cluster.start_broker()
    state = cluster.root / "w"
    proc = gavel_process(["worker", "--node-id", "node-d", "--nats", cluster.url, "--state",
                          str(state), "--cpu", "2", "--memory-mb", "1024",
                          "--instance-log-mb", "0.002", "--instance-log-files", "2"],
                         cluster.root / "worker.log")
    try:
        await cluster.wait_nodes(1, timeout=30)
        await cluster.submit(Spec(name="chatty", command=printer(20_000, every=0.001,
                                                                 err=False)), "chatty-1")
        out = state / "instances" / "chatty-1"
        await wait_for(lambda: (out / "stdout.log.1").exists(), 30, what="a rotation")
        await wait_for(lambda: (out / "stdout.log").stat().st_size <
                       (out / "stdout.log.1").stat().st_size, 30, what="the live file anew")
        assert sorted(p.name for p in out.glob("stdout.log*")) == ["stdout.log",
                                                                  "stdout.log.1"]
        got = await gavel("logs", "chatty-1", "--nats", cluster.url)
        seen = numbers(got.stdout)
        assert seen and seen == sorted(set(seen))  # whole lines, in order, nothing twice
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 30)


async def test_garbage_on_the_log_subject_is_answered_and_counted(cluster: Cluster) -> None:
    agent = await cluster.start_agent("node-a")
    await wait_for(lambda: agent.ready.is_set(), 15, what="the agent subscribed")
    nc = await cluster.client()
    subject = subjects.LOGS.format(node="node-a")

    async def ask(data: bytes) -> str:
        msg = await nc.request(subject, data, timeout=5)
        return msgspec.msgpack.decode(msg.data, type=ApiError).error

    assert (await ask(b"\xc1")).startswith("malformed logs request: ")
    assert await ask(_enc.encode(LogsRequest(node_id="node-b", instance_id="x"))) == \
        "logs request for another node dropped"
    for bad in ("../../etc", "nope"):
        assert "has no output of instance" in await ask(
            _enc.encode(LogsRequest(node_id="node-a", instance_id=bad)))
    assert agent.malformed["logs request"] == 1
    assert agent.ignored["logs request for another node"] == 1
    await nc.publish(subject, b"\xc1")  # no reply subject: counted, never served
    await nc.publish(subject, _enc.encode(LogsRequest(node_id="node-a", instance_id="x")),
                     reply="gavel.award.node-b")  # a reply outside the operators' inbox
    await nc.flush()
    await wait_for(lambda: agent.ignored["logs request without a reply subject"] == 1 and
                   agent.ignored["request with a reply subject outside the requester's "
                                 "inbox"] == 1, 10, what="the counts")
    assert agent.malformed["logs request"] == 1


async def test_a_service_name_reads_every_replica_each_line_prefixed(
        cluster: Cluster) -> None:
    """The replicas are found through the status API (`InstanceStatus.service`); the
    records are committed by hand, as a service's replicas will be by the broker."""
    from gavel.broker.ledger.repository import Change, Ledger
    from gavel.shared.records import InstanceRecord

    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.start_agent("node-b")
    await cluster.wait_nodes(2)
    ledger = Ledger(cluster.state / "state.git")
    replicas = {f"websvc-{k}": InstanceRecord(
        instance_id=f"websvc-{k}", service="websvc", version=1,
        spec=Spec(name="websvc", command=printer(2, err=False, then_sleep=60), cpu=3.0))
        for k in (1, 2)}
    ledger.apply(Change(instances=dict(replicas)), "two replicas of websvc\n",
                 ledger.state().head)
    for iid in replicas:
        await running(cluster, iid)
    def printed(iid: str) -> bool:
        files = [d / "instances" / iid / "stdout.log"
                 for d in (cluster.root / "workers").iterdir()]
        return any(f.exists() and f.read_text().count("\n") == 2 for f in files)
    for iid in replicas:
        await wait_for(lambda i=iid: printed(i), 15, what=f"{iid}'s output")
    proc = await gavel("logs", "websvc", "--nats", cluster.url)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == [f"[websvc-{k}] line {i}"
                                                for k in (1, 2) for i in (0, 1)]
    assert {(await cluster.status(i)).node_id for i in replicas} == {"node-a", "node-b"}


async def test_a_follow_learns_at_once_that_its_worker_stopped(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    await cluster.submit(Spec(name="s", command=printer(1, then_sleep=120)), "held-1")
    await running(cluster, "held-1")
    out = cluster.root / "follow.out"
    with open(out, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "gavel", "logs", "held-1", "--follow",
                                 "--nats", cluster.url], stdout=f, stderr=subprocess.PIPE)
    try:
        await wait_for(lambda: out.read_text() == "line 0\n", 20, what="the first line")
        await cluster.stop_agent("node-a", kill_children=False)
        code = await asyncio.to_thread(proc.wait, 60)
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        assert code == 1 and err == ("gavel logs: node node-a is not answering for the logs "
                                     "of held-1: its worker is not connected to NATS.\n")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_orphan(cluster, "node-a", "held-1")
