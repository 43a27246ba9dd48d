"""The first day's wrong answers (issue 30), each reproduced against the real thing: `gavel`
child processes, a real nats-server, a broker and workers in this process.

What must hold: `gavel up`'s children import the installed gavel wherever it runs; a reader
that goes away (`| head`) ends `logs`, `events` and `services` quietly with 141, stdout
buffered as a user's is, and `events --follow` shows what it lists before it follows; `make run`
says its timers are fast; a job's `count` makes that many instances; what no node could run
is refused at submit with a sentence (exit 2; from the API, an error naming it); every verb
exits with the README's table of codes (an unknown name 4, a broker's no 3, no broker 1,
nothing at the NATS URL 2); `deploy --wait` of a stopped service says deployed only once its
replicas are healthy; `logs SERVICE` reads its current replicas, `--history` every one it
had, oldest first; an instance restarted in place says why its last run ended, in its event
and in `status`; a writer faster than any tick is rotated as it writes, its files kept near
their cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gavel import __version__
from gavel.cli.commands import EXIT_CODES
from gavel.cli.supervise import Supervisor
from gavel.shared import subjects
from gavel.shared.api import (
    DeployReply,
    DeployRequest,
    ServiceReply,
    ServiceRequest,
    StatusReply,
    StatusRequest,
    StopServiceRequest,
)
from gavel.shared.logstream import LogChunk, LogsRequest
from gavel.shared.messages import ApiError, Spec
from gavel.shared.reasons import Reason
from gavel.shared.spec import Restart
from gavel.shared.timing import fast_banner
from gavel.transport.logclient import read
from gavel.transport.natsserver import free_port
from gavel.worker.logfiles import LogLimits, Outputs
from gavel.worker.logserver import tick as logs_tick
from tests.integration.clibatch import Line, run_all
from tests.integration.harness import Cluster, UpDemo, wait_for

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
GAVEL = [sys.executable, "-m", "gavel"]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "GAVEL_CREDS"}


def buffered() -> dict[str, str]:
    """A user's environment: stdout buffered as Python buffers a pipe (the suite may run
    with PYTHONUNBUFFERED, which would make every print a write of its own)."""
    return {k: v for k, v in _env().items() if k != "PYTHONUNBUFFERED"}


def to_nobody(*args: str) -> subprocess.CompletedProcess[str]:
    """`gavel ARGS | true` where `true` is gone before the first write: stdout is a pipe
    whose reading end is already closed."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([*GAVEL, *args], stdout=w, stderr=subprocess.PIPE, text=True,
                              timeout=90, env=buffered())
    finally:
        os.close(w)


def lines_of(n: int) -> list[str]:
    return [sys.executable, "-c", f"for i in range({n}): print('line', i)"]


def test_up_children_import_the_installed_gavel_whatever_the_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shadow = tmp_path / "gavel"  # a clone's parent holds a folder named gavel
    shadow.mkdir()
    (shadow / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "child.log"
    child = Supervisor(dict(os.environ)).spawn("version", ["--version"], log)
    assert child.proc.wait(60) == 0, log.read_text()
    assert log.read_text().strip() == f"gavel {__version__}"


async def test_a_reader_that_goes_away_ends_the_command_quietly(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    await cluster.submit(Spec(name="many", command=lines_of(20000)), "many-1")
    await cluster.call("deploy", DeployRequest(spec=Spec(
        name="svc", type="service", count=1, command=[sys.executable, "-c",
                                                      "import time; time.sleep(600)"],
        cpu=0.1, memory_mb=16)), DeployReply)

    async def done() -> bool:
        return bool((await cluster.status("many-1")).state == "succeeded")
    await wait_for(done, 30, what="the printer to finish")
    for args in (["logs", "many-1"], ["events"], ["services"]):
        proc = await asyncio.to_thread(to_nobody, *args, "--nats", cluster.url)
        assert (proc.returncode, proc.stderr) == (141, ""), (args, proc.stderr[-3000:])


async def test_events_follow_shows_its_listing_at_once_and_ends_quietly_when_the_reader_goes(
        cluster: Cluster) -> None:
    """`gavel events --follow | head -3` showed nothing until a new event filled the pipe's
    buffer: what it lists is written before it follows, and a reader gone while it follows
    ends it at the next event, quietly with 141."""
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    await cluster.submit(Spec(name="one", command=lines_of(1)), "one-1")

    async def ended(iid: str) -> bool:
        return bool((await cluster.status(iid)).state == "succeeded")
    await wait_for(lambda: ended("one-1"), 30, what="one-1 to succeed")
    proc = subprocess.Popen([*GAVEL, "events", "--follow", "--nats", cluster.url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=buffered())
    try:
        assert proc.stdout is not None and proc.stderr is not None
        first = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        assert b" one-1 " in first, first
        proc.stdout.close()  # the reader has what it wanted
        await cluster.submit(Spec(name="two", command=lines_of(1)), "two-1")
        code = await asyncio.to_thread(proc.wait, 60)
        assert (code, proc.stderr.read()) == (141, b"")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_make_run_says_its_timers_are_fast(up_demo: UpDemo) -> None:
    """`make run` (and the demo the suite runs, under the same ``GAVEL_FAST_TIMERS=1``)
    says its clocks are not production's."""
    assert up_demo.proc.returncode == 0, up_demo.proc.stdout + up_demo.proc.stderr
    assert ("timers: fast, every clock 10x shorter than production (GAVEL_FAST_TIMERS=1: "
            "heartbeat 1s, node offline after 12s); unset it for production timers"
            ) in up_demo.proc.stdout.splitlines()
    assert fast_banner({}) == "" and fast_banner({"GAVEL_FAST_TIMERS": "0"}) == ""


async def test_a_jobs_count_makes_that_many_instances(cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    spec = tmp_path / "six.toml"
    spec.write_text(f'name = "six"\ncount = 6\ncommand = {json.dumps(lines_of(1))}\n')
    proc = await asyncio.to_thread(subprocess.run, [*GAVEL, "submit", str(spec), "--id", "six",
                                                    "--wait=running", "--nats", cluster.url],
                                   capture_output=True, text=True, timeout=90, env=_env())
    assert proc.returncode == 0, proc.stderr
    ids = [f"six-{k}" for k in range(1, 7)]
    assert [line.split()[0] for line in proc.stdout.splitlines()] == ids
    reply = await cluster.call("status", StatusRequest(), StatusReply)
    assert sorted(i.instance_id for i in reply.instances) == ids


def test_what_no_node_could_run_is_refused_at_submit(tmp_path: Path) -> None:
    cases = {
        "argv": ('command = ["echo", "' + "x" * 900_000 + '"]\n', "over the kernel's limit for one "
                 "argument (131071 bytes): exec would refuse it (E2BIG)"),
        "label": ('command = ["true"]\n[labels]\n"zone\\n" = "a"\n',
                  "holds a control character"),
        "cpu": ('command = ["true"]\ncpu = 5e-324\n', "below the finest a node divides"),
        "long": ('command = ["true"]\ncount = 10\n', "with the count's suffix -10 the ids "
                 "are 129 characters, over the 128 an instance id may have"),
    }
    lines = []
    for name, (body, _) in cases.items():
        (tmp_path / f"{name}.toml").write_text(f'name = "{name}"\n{body}')
        lines.append(Line(["submit", str(tmp_path / f"{name}.toml"), "--id", "a" * 126,
                           "--nats", "nats://127.0.0.1:1"], tmp_path))
    for proc, (name, (_, words)) in zip(run_all(lines, tmp_path / "out.json"), cases.items(),
                                        strict=True):
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (name, proc.stderr)
        assert words in proc.stderr and len(proc.stderr.splitlines()) == 1, (name, proc.stderr)


async def test_the_broker_refuses_what_no_node_could_run(cluster: Cluster) -> None:
    """A client that is not the CLI is told the same by the broker, not accepted."""
    await cluster.start_broker()
    nc = await cluster.client()
    raw = msgspec.msgpack.encode({"kind": "submit", "spec": {
        "name": "big", "command": ["echo", "x" * 900_000]}})
    msg = await nc.request(subjects.API.format(verb="submit"), raw, timeout=10)
    reply = msgspec.msgpack.decode(msg.data, type=ApiError)
    assert "over the kernel's limit for one argument" in reply.error


def test_the_docs_show_the_exit_codes_every_verb_uses() -> None:
    """docs/api.md's table says what each exit status means; the README names each one."""
    api = (ROOT / "docs" / "api.md").read_text()
    rows = [line.split(" | ", 1) for line in api.splitlines()
            if line.startswith("| ") and line.split(" | ")[0][2:].isdigit()]
    table = {int(code[2:]): text.removesuffix(" |").replace("\\|", "|") for code, text in rows}
    assert table == EXIT_CODES
    readme = (ROOT / "README.md").read_text()
    said = readme[readme.index("Every verb exits "):].split(")).", 1)[0]
    assert all(f"{code} (" in said for code in EXIT_CODES), said


def _one_sentence(proc: subprocess.CompletedProcess[str], code: int, words: str) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert (proc.returncode, len(proc.stderr.splitlines())) == (code, 1), (
        proc.args, proc.returncode, proc.stderr)
    assert words in proc.stderr, (proc.args, proc.stderr)


async def test_every_verb_exits_with_the_same_code_for_the_same_outcome(
        cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    huge = tmp_path / "huge.toml"
    huge.write_text('name = "huge"\ncommand = ["true"]\ncpu = 64.0\n')
    nats = ["--nats", cluster.url]
    unknown = [["status", "nope"], ["why", "nope"], ["events", "nope"], ["cancel", "nope"],
               ["logs", "nope"], ["nodes", "nope"], ["drain", "nope"],
               ["deploy", "status", "nope"], ["scale", "nope", "2"], ["stop", "nope"],
               ["rollback", "nope"]]
    lines = [Line([*args, *nats], tmp_path) for args in [*unknown, ["submit", str(huge)]]]
    lines.append(Line(["status", "nope", "--json", *nats], tmp_path))
    *each, never, as_json = await asyncio.to_thread(run_all, lines, tmp_path / "out.json")
    for proc in each:
        _one_sentence(proc, 4, "no ")
    _one_sentence(never, 3, "no node could ever offer the requested resources")
    assert json.loads(as_json.stdout)["exit_code"] == 4
    await cluster.stop_broker()  # NATS answers, no broker does: 1, for every verb alike
    gone = [Line([*args, *nats], tmp_path) for args in (["status"], ["services"],
                                                          ["events", "nope"], ["tune"])]
    # each asks again for `interest_s` before it says so: side by side, the test waits once
    for proc in await asyncio.to_thread(run_all, gone, tmp_path / "gone.json", at_once=True):
        _one_sentence(proc, 1, "no broker is answering")


def test_every_verb_exits_2_when_nothing_answers_at_the_nats_url(tmp_path: Path) -> None:
    """Where no NATS answers, every verb says so with 2 (the README's table), not one 2 and
    another 1; `nodes` and `status` are checked in test_first_use."""
    url = f"nats://127.0.0.1:{free_port()}"
    spec = tmp_path / "s.toml"
    spec.write_text('name = "s"\ncommand = ["true"]\n')
    verbs = [["events", "nope"], ["logs", "nope"], ["cancel", "nope"], ["submit", str(spec)],
             ["scale", "nope", "2"], ["rollback", "nope"], ["tune", "--auto"]]
    # Each waits out its connect's retries (seconds): side by side, the test waits once.
    procs = run_all([Line([*args, "--nats", url], tmp_path) for args in verbs],
                    tmp_path / "out.json", at_once=True)
    for proc in procs:
        _one_sentence(proc, 2, f"nothing answers at {url}")


async def test_deploy_wait_after_stop_waits_for_healthy_replicas(cluster: Cluster,
                                                                 tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    go = tmp_path / "go"  # the replicas' check passes while this file exists
    spec = tmp_path / "web.toml"
    spec.write_text(
        'name = "web"\ntype = "service"\ncount = 2\ncpu = 0.1\nmemory_mb = 16\n'
        f'command = {json.dumps([sys.executable, "-c", "import time; time.sleep(600)"])}\n'
        f'[update]\nmin_healthy_s = 0.1\n[[checks]]\ntype = "exec"\ninterval_s = 0.2\n'
        f'failures = 100\ncommand = ["test", "-f", "{go}"]\n')

    async def deploy_wait() -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(
            subprocess.run, [*GAVEL, "deploy", str(spec), "--wait", "--nats", cluster.url],
            capture_output=True, text=True, timeout=120, env=_env())

    async def service() -> Any:
        return (await cluster.call("service", ServiceRequest(name="web"), ServiceReply)).service

    go.touch()
    first = await deploy_wait()
    assert first.returncode == 0, first.stderr
    await cluster.call("stop", StopServiceRequest(name="web"), ServiceReply)

    async def none_left() -> bool:
        return not [r for r in (await service()).replicas if r.state in ("running",
                                                                         "cancelling")]
    await wait_for(none_left, 30, what="every replica stopped")
    go.unlink()
    again = asyncio.ensure_future(deploy_wait())

    async def checking() -> bool:
        return len([r for r in (await service()).replicas if r.state == "running"]) == 2
    await wait_for(checking, 30, what="two replicas running, not yet healthy")
    assert not again.done(), (await again).stdout  # it said deployed while none was healthy
    go.touch()
    proc = await again
    assert proc.returncode == 0, proc.stderr
    healthy = [r for r in (await service()).replicas if r.health == "healthy"]
    assert len(healthy) == 2, proc.stdout


async def test_logs_of_a_service_read_its_current_replicas_or_with_history_every_one(
        cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)

    def talker(version: str) -> Spec:
        code = (f"import time\nfor k in range(3): print('{version} line', k, flush=True)\n"
                "time.sleep(600)")
        return Spec(name="talk", type="service", count=1, command=[sys.executable, "-c", code],
                    cpu=0.1, memory_mb=16, env={"V": version})

    async def current() -> list[str]:
        st = (await cluster.call("service", ServiceRequest(name="talk"), ServiceReply)).service
        return [r.instance_id for r in st.replicas if r.state == "running"]

    async def dated(iid: str) -> bool:
        """All three lines are out and the node has dated them (its tick's mark)."""
        got: list[LogChunk] = []
        await read(await cluster.client(), LogsRequest(node_id="node-a", instance_id=iid),
                   got.append)
        return b"line 2" in b"".join(c.data for c in got) and all(c.at for c in got)

    versions = []
    for version in ("v1", "v2"):
        await cluster.call("deploy", DeployRequest(spec=talker(version)), DeployReply)

        async def up(version: str = version) -> bool:
            ids = await current()
            st = (await cluster.call("service", ServiceRequest(name="talk"),
                                     ServiceReply)).service
            return len(ids) == 1 and st.version == len(versions) + 1 and all(
                r.version == st.version for r in st.replicas if r.state == "running") \
                and await dated(ids[0])
        await wait_for(up, 60, what=f"{version}'s replica running, its output dated")
        versions.append((await current())[0])
    old, new = versions

    async def old_gone() -> bool:
        return (await cluster.status(old)).state == "cancelled"
    await wait_for(old_gone, 60, what="the v1 replica cancelled")
    lines = [Line(["logs", "talk", "--nats", cluster.url], tmp_path),
             Line(["logs", "talk", "--history", "--nats", cluster.url], tmp_path)]
    now, history = await asyncio.to_thread(run_all, lines, tmp_path / "out.json")
    assert now.returncode == 0, now.stderr
    assert now.stdout.splitlines() == [f"v2 line {k}" for k in range(3)]
    assert history.returncode == 0, history.stderr
    assert history.stdout.splitlines() == [f"[{old}] v1 line {k}" for k in range(3)] + [
        f"[{new}] v2 line {k}" for k in range(3)]


async def test_an_instance_restarted_in_place_says_why_its_last_run_ended(
        cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    spec = Spec(name="crash", command=[sys.executable, "-c", "import sys; sys.exit(3)"],
                restart=Restart(attempts=2, delay_s=600.0))  # then a long back-off
    iid = await cluster.submit(spec, "crash-1")

    async def restarted() -> bool:
        return bool((await cluster.status(iid)).restarts == 1)
    await wait_for(restarted, 30, what="the first restart in place")
    st = await cluster.status(iid)
    assert (st.reason, st.restarts) == (Reason.EXITED_NONZERO, 1)
    assert st.detail.startswith("exit status 3; restart 1 of 2 within ")
    lines = [Line(["status", "--nats", cluster.url], tmp_path),
             Line(["events", iid, "--json", "--nats", cluster.url], tmp_path)]
    table, events = await asyncio.to_thread(run_all, lines, tmp_path / "out.json")
    (row,) = [line for line in table.stdout.splitlines() if line.startswith(iid)]
    assert row.endswith(Reason.EXITED_NONZERO), row
    (ev,) = [json.loads(e) for e in events.stdout.splitlines()
             if json.loads(e)["type"] == "restarted"]
    assert (ev["reason"], ev["exit_code"]) == (Reason.EXITED_NONZERO, 3)


FAST_WRITER = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
line = b"x" * 99 + b"\\n"
block = line * 640  # 64 KB a write, as fast as the disk takes it
for _ in range(int(sys.argv[2]) // len(block)):
    os.write(fd, block)
"""


async def test_a_fast_writer_is_rotated_as_it_writes_not_on_a_tick(tmp_path: Path) -> None:
    """The tick is an hour here: only rotation on write can keep the files near their cap
    while 200 MB arrive as fast as one process can write them."""
    cap, total = 1 << 20, 200 << 20
    (tmp_path / "w").mkdir()
    outputs = Outputs(tmp_path, LogLimits(max_bytes=cap, files=3), held=lambda: ["w"])
    loop = asyncio.create_task(logs_tick(outputs, 3600.0))
    live = tmp_path / "w" / "stdout.log"
    try:
        await asyncio.sleep(0)  # the loop's first tick: the directory is watched
        writer = await asyncio.create_subprocess_exec(sys.executable, "-c", FAST_WRITER,
                                                      str(live), str(total))
        assert await writer.wait() == 0
        await wait_for(lambda: live.stat().st_size <= cap, 30, what="the last rotation")
        kept = sorted((tmp_path / "w").glob("stdout.log*"))
        sizes = {p.name: p.stat().st_size for p in kept}
        assert set(sizes) <= {"stdout.log", "stdout.log.1", "stdout.log.2"}, sizes
        assert all(size <= 2 * cap for size in sizes.values()), sizes
        out = outputs.get("w")  # positions never run ahead of what was written
        assert out is not None and 0 < out.end("stdout") <= total
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
