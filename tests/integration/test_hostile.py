"""Hostile input end to end: garbage on the real subjects of a running cluster, a replayed
bid, specs no node could hold, and malformed specs, configs and flags given to the real
`gavel` command line (a child process, as an operator runs it).

What must hold: nothing reaches a user as a traceback; bad input from an operator exits 2
with one sentence naming the field and what was expected; garbage on the wire is counted
(`broker.rejects.counts`, shown as ``rejected`` by ``gavel nodes --json``; the worker's
`malformed` / `ignored`), logged once per kind, changes nothing — and the cluster places the
next valid submission as if nothing had happened.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest

from gavel.broker.heartbeats import TOO_LARGE
from gavel.shared import subjects
from gavel.shared.messages import (
    PROTOCOL,
    RFB,
    ApiError,
    AssignmentRequest,
    Award,
    Bid,
    BidReply,
    Cancel,
    Capacity,
    Event,
    Heartbeat,
    Shape,
)
from gavel.transport import wire
from tests.integration.clibatch import Line, run_all
from tests.integration.harness import Cluster, sleeper_spec, wait_for

pytestmark = pytest.mark.integration

_enc = msgspec.msgpack.Encoder()
GARBAGE = [b"", b"\xc1", b"\x93\x01\x02\x03", bytes(range(256)), b"\x81\xa1k" * 3000 + b"\xc0",
           b"\x8f" + b"\xa1x" * 10, b"\x00" * 200_000]


def gavel(*args: str, cwd: Path | None = None, timeout: float = 60
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gavel", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=ENV)


ENV = {**os.environ, "GAVEL_LOG_LEVEL": "WARNING"}


def gavel_all(lines: list[Line], results: Path) -> list[subprocess.CompletedProcess[str]]:
    """`gavel` once per line, all in one child process (`tests.integration.clibatch`)."""
    return run_all(lines, results, env=ENV)


def refused(proc: subprocess.CompletedProcess[str], code: int = 2) -> str:
    """The one line the command printed on its way out with `code`."""
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    return proc.stderr.strip().splitlines()[-1]


# -- the cluster under garbage ---------------------------------------------------------------

async def test_garbage_on_every_subject_is_counted_changes_nothing_and_placing_goes_on(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gavel")
    broker = await cluster.start_broker()
    agent = await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    await wait_for(lambda: agent.ready.is_set(), what="agent subscribed")
    nc = await cluster.client()
    head = broker.ledger.head()
    n = len(GARBAGE)

    wire_subjects = ["gavel.bids.node-a", "gavel.report.node-a", "gavel.assign.node-a",
                     subjects.RFB, "gavel.award.node-a", "gavel.cancel.node-a"]
    for data in GARBAGE:
        for subject in wire_subjects:
            await nc.publish(subject, data)
    # The heartbeat stream keeps a subject's newest message only, so garbage heartbeats go
    # one at a time, each read before the next, on a subject no real node publishes on.
    # The largest is refused by its size alone, before anyone decodes it.
    def heartbeats_refused() -> int:
        return sum(broker.rejects.counts.get(kind, 0)
                   for kind in ("malformed heartbeat", TOO_LARGE))

    for data in GARBAGE:
        before = heartbeats_refused()
        await nc.publish("gavel.hb.node-g", data)
        await wait_for(lambda b=before: heartbeats_refused() == b + 1,  # type: ignore[misc]
                       10, what="the garbage heartbeat read")
    forged: list[tuple[str, msgspec.Struct]] = [
        ("gavel.hb.node-x", Heartbeat(node_id="node-a")),  # impersonation
        ("gavel.hb.node-y", Heartbeat(node_id="node-y", capacity=Capacity(cpu=float("nan")))),
        ("gavel.hb.node-z", Heartbeat(node_id="node-z", port_range=[0, 70000])),
        ("gavel.hb.node-w", Heartbeat(node_id="node-w", ended=[  # another node's end
            Event(instance_id="ghost", type="exited", node_id="node-a")])),
        ("gavel.bids.node-x", BidReply(auction_id="a", node_id="node-a", answers=[])),
        ("gavel.bids.node-a", BidReply(auction_id="no-such-auction", node_id="node-a",
                                       answers=[Bid(shape=0, load=float("nan"))])),
        ("gavel.report.node-a", Event(instance_id="ghost", type="running", node_id="node-a")),
        ("gavel.report.node-x", Event(instance_id="ghost", type="running", node_id="node-a")),
        ("gavel.award.node-a", Award(auction_id="a", instance_id="evil", node_id="node-b",
                                     spec=sleeper_spec("evil"))),
        ("gavel.cancel.node-a", Cancel(instance_id="evil", node_id="node-b")),
        # a well-formed RFB for an auction the broker never opened: the agent answers it,
        # the broker counts the answer as a bid for an unknown auction
        (subjects.RFB, RFB(auction_id="forged", shapes=[Shape(cpu=0.1, memory_mb=8)],
                           deadline_s=0.1)),
    ]
    for subject, msg in forged:
        await nc.publish(subject, _enc.encode(msg))
    # node-a asks on its own inbox (the only one the broker answers it on): never left waiting
    as_a = await nats.connect(cluster.url, inbox_prefix=subjects.NODE_INBOX.format(node="node-a"))
    answer = await as_a.request("gavel.assign.node-a", b"\xc1", timeout=5)
    assert isinstance(msgspec.msgpack.decode(answer.data, type=ApiError), ApiError)
    answer = await as_a.request("gavel.assign.node-a", _enc.encode(
        AssignmentRequest(instance_id="ghost", node_id="node-b")), timeout=5)
    await as_a.close()
    assert isinstance(msgspec.msgpack.decode(answer.data, type=ApiError), ApiError)
    for data in GARBAGE:
        answer = await nc.request(subjects.API.format(verb="submit"), data, timeout=5)
        assert "malformed submit request" in msgspec.msgpack.decode(answer.data,
                                                                    type=ApiError).error
    await nc.flush()

    expected = {
        "malformed heartbeat": n - 1, TOO_LARGE: 1, "malformed bid reply": n,
        "malformed event": n,
        "assignment request without a reply subject": n, "malformed assignment request": 1,
        "malformed submit request": n,
        "heartbeat for another node": 1, "heartbeat with an impossible capacity": 1,
        "heartbeat with an impossible port range": 1, "bid for another node": 1,
        "heartbeat with ends that are not its own": 1,
        "bid for an unknown auction": 2, "event for an instance not placed on that node": 1,
        "event for another node": 1, "assignment request for another node": 1,
    }
    await wait_for(lambda: all(broker.rejects.counts.get(k) == v for k, v in expected.items()),
                   10, what=f"reject counts {expected}, have {broker.rejects.counts}")
    await wait_for(lambda: dict(agent.malformed) == {"rfb": n, "award": n, "cancel": n}, 10,
                   what=f"worker's malformed counts, have {dict(agent.malformed)}")
    assert dict(agent.ignored) == {"award for another node": 1, "cancel for another node": 1}

    # ... and nothing changed: no commit, no node from the forgeries, no auction, no instance
    assert broker.ledger.head() == head
    assert broker.liveness.known() == ["node-a"]
    assert broker.auctioneer.auctions == {} and broker.auctioneer.auctions_total == 0
    assert agent.instances() == []
    assert not (cluster.root / "workers" / "node-a" / "instances" / "evil").exists()

    # logged once per kind, however many arrived
    rejected = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    for kind in expected:
        assert sum(f"rejected {kind} on" in line for line in rejected) == 1, (kind, rejected)
    for kind in ("rfb", "award", "cancel"):
        lines = [r for r in caplog.records if r.getMessage().startswith(f"malformed {kind} on")]
        assert len(lines) == 1, kind

    # the operator sees the counts
    proc = await asyncio.to_thread(gavel, "nodes", "--json", "--nats", cluster.url)
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert {k: shown["rejected"][k] for k in expected} == expected
    assert [node["node_id"] for node in shown["nodes"]] == ["node-a"]

    # and the cluster still places a valid submission
    iid = await cluster.submit(sleeper_spec("after-garbage"))
    await wait_for(lambda: cluster.holders(iid) == ["node-a"], 10, what="placed on node-a")
    await wait_for(_running(cluster, iid), 10, what="running")


def _running(cluster: Cluster, iid: str) -> Any:
    async def check() -> bool:
        return bool((await cluster.status(iid)).state == "running")
    return check


async def test_a_bid_replayed_after_its_auction_closed_is_counted_and_changes_nothing(
        cluster: Cluster) -> None:
    broker = await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    nc = await cluster.client()
    bids: list[bytes] = []

    async def spy(msg: Any) -> None:
        bids.append(msg.data)

    await nc.subscribe(subjects.BIDS.format(node="node-a"), cb=spy)
    await wire.subscribed(nc)
    iid = await cluster.submit(sleeper_spec("replayed"))
    await wait_for(_running(cluster, iid), 10, what="placed and running")
    assert len(bids) == 1 and broker.auctioneer.auctions == {}  # its auction is closed
    head, auctions = broker.ledger.head(), broker.auctioneer.auctions_total
    before = broker.rejects.counts.get("bid for an unknown auction", 0)

    for _ in range(5):
        await nc.publish(subjects.BIDS.format(node="node-a"), bids[0])
    await nc.flush()
    await wait_for(lambda: broker.rejects.counts.get("bid for an unknown auction") == before + 5,
                   5, what="the replays counted")
    await asyncio.sleep(0.3)
    assert broker.ledger.head() == head
    assert broker.auctioneer.auctions_total == auctions and broker.auctioneer.auctions == {}
    assert cluster.holders(iid) == ["node-a"]
    assert (await cluster.status(iid)).state == "running"


async def test_a_spec_no_node_could_ever_hold_is_refused_at_submit(cluster: Cluster,
                                                                   tmp_path: Path) -> None:
    broker = await cluster.start_broker()
    await cluster.start_agent("node-a", cpu=4.0, memory_mb=4096)
    await cluster.wait_nodes(1)
    head = broker.ledger.head()
    for text, reason in (
            ("cpu = 64.0\n", "asks 64 cpu, the largest node has 4"),
            ("memory_mb = 1000000\n", "asks 1000000 MB memory, the largest node has 4096 MB"),
            ("cpu = 4.5\n", "asks 4.5 cpu, the largest node has 4")):
        spec = tmp_path / "big.toml"
        spec.write_text(f'name = "big"\ncommand = ["true"]\n{text}')
        proc = await asyncio.to_thread(gavel, "submit", str(spec), "--nats", cluster.url)
        assert refused(proc, 3) == ("gavel submit: no node could ever offer the requested "
                                    f"resources: {reason}")
    assert broker.ledger.head() == head
    assert broker.ledger.state().instances == {}


async def test_submit_wait_is_not_thrown_by_garbage_on_the_events_subject(
        cluster: Cluster, tmp_path: Path) -> None:
    await cluster.start_broker()
    await cluster.start_agent("node-a")
    await cluster.wait_nodes(1)
    nc = await cluster.client()
    spec = tmp_path / "web.toml"
    spec.write_text(f'name = "web"\ncommand = ["{sys.executable}", "-c", '
                    '"import time; time.sleep(30)"]\n')

    async def flood() -> None:
        while True:
            for data in GARBAGE[:4]:
                await nc.publish(subjects.EVENTS.format(instance="web-under-fire"), data)
            await asyncio.sleep(0.01)

    flooding = asyncio.create_task(flood())
    try:
        proc = await asyncio.to_thread(gavel, "submit", str(spec), "--wait=running",
                                       "--id", "web-under-fire", "--timeout", "20", "--nats",
                                       cluster.url)
    finally:
        flooding.cancel()
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "web-under-fire healthy on node-a"


# -- operators' mistakes: exit 2 and one sentence --------------------------------------------

SPECS = [
    ("unknown.toml", 'name = "x"\ncommand = ["true"]\ncpuu = 1\n', "unknown field `cpuu`"),
    ("type.toml", 'name = "x"\ncommand = ["true"]\ncpu = "lots"\n',
     "field 'cpu': expected `float`, got `str`"),
    ("negative.toml", 'name = "x"\ncommand = ["true"]\ncpu = -1\n',
     "field 'cpu': expected `float` > 0.0"),
    ("zero-mem.toml", 'name = "x"\ncommand = ["true"]\nmemory_mb = 0\n',
     "field 'memory_mb': expected `int` >= 1"),
    ("ports.toml", 'name = "x"\ncommand = ["true"]\nports = ["web", "web"]\n',
     "ports must have distinct names"),
    ("nan.toml", 'name = "x"\ncommand = ["true"]\ncpu = nan\n', "field 'cpu'"),
    ("empty.toml", 'name = "x"\ncommand = []\n', "names neither"),
    ("nothing.toml", 'name = "x"\n', "names neither"),
    ("image.toml", 'name = "x"\nimage = "Web:1.4"\n', "image 'Web:1.4' is not an image reference"),
    ("volume.toml", 'name = "x"\nimage = "web:1"\nvolumes = [{ path = "/data" }]\n',
     "missing required field `name`"),
    ("volume-path.toml", 'name = "x"\nimage = "web:1"\nvolumes = [{ name = "data" }]\n',
     "names the path it is mounted at"),
    ("name.toml", 'name = "Not OK"\ncommand = ["true"]\n', "field 'name': expected `str`"),
    ("dots.toml", 'name = "a..b"\ncommand = ["true"]\n', "field 'name': expected `str`"),
    ("missing.toml", 'command = ["true"]\n', "missing required field `name`"),
    ("broken.toml", 'name = "x"\ncommand = [\n', "not valid TOML"),
    ("deep.toml", 'name = "x"\ncommand = ["true"]\nlabels = ' + "[" * 5000 + "]" * 5000 + "\n",
     "nested too deeply"),
    ("binary.toml", b"\xff\xfe\x00garbage", "not valid TOML"),
    ("unknown.json", '{"name": "x", "command": ["true"], "extra": 1}', "unknown field `extra`"),
    ("type.json", '{"name": "x", "command": ["true"], "memory_mb": 1.5}',
     "field 'memory_mb': expected `int`, got `float`"),
    ("env.json", '{"name": "x", "command": ["true"], "env": {"A": 1}}',
     "field 'env[...]': expected `str`, got `int`"),
    ("ports.json", '{"name": "x", "command": ["true"], "ports": ["a", "a"]}',
     "ports must have distinct names"),
    ("truncated.json", '{"name": "x", "command": ["true"', "not valid JSON"),
    ("inf-cpu.toml", 'name = "x"\ncommand = ["true"]\ncpu = inf\n', "cpu must be a finite"),
    ("inf-timeout.toml", 'name = "x"\ncommand = ["true"]\ntimeout_s = inf\n',
     "timeout_s must be a finite number of seconds"),
    ("env-eq.toml", 'name = "x"\ncommand = ["true"]\nenv = { "A=B" = "c" }\n',
     "env name 'A=B' is not usable"),
    ("env-empty.json", '{"name": "x", "command": ["true"], "env": {"": "c"}}',
     "env name '' is not usable"),
    ("nul.json", '{"name": "x", "command": ["tr\\u0000ue"]}',
     "command arguments must not contain a NUL"),
    ("label.toml", 'name = "x"\ncommand = ["true"]\nlabels = { "" = "a" }\n',
     "label names must not be empty"),
    ("deep.json", '{"name": "x", "command": ["true"], "labels": ' + '{"a":' * 5000 + "1"
     + "}" * 5001, "field 'labels[...]': expected `str`, got `object`"),
]


@pytest.fixture(scope="module")
def submitted(tmp_path_factory: pytest.TempPathFactory
              ) -> dict[str, subprocess.CompletedProcess[str]]:
    """`gavel submit` of every malformed spec, by file name; nothing listens at the URL: a
    spec that got past validation would exit 1, not 2."""
    root = tmp_path_factory.mktemp("specs")
    for name, body, _ in SPECS:
        (root / name).write_bytes(body if isinstance(body, bytes) else body.encode())
    runs = gavel_all([Line(["submit", str(root / name), "--nats", "nats://127.0.0.1:9"], root)
                      for name, _, _ in SPECS], root / "results.json")
    return {name: proc for (name, _, _), proc in zip(SPECS, runs, strict=True)}


@pytest.mark.parametrize(("name", "says"), [(s[0], s[2]) for s in SPECS],
                         ids=[s[0] for s in SPECS])
def test_a_malformed_spec_exits_2_with_one_sentence(
        submitted: dict[str, subprocess.CompletedProcess[str]], name: str, says: str) -> None:
    proc = submitted[name]
    path = Path(proc.args[2])
    assert path.name == name
    line = refused(proc)
    assert proc.stderr.strip() == line, "one line, no more"
    assert line.startswith(f"gavel submit: {path}: ") and says in line, line


def test_a_missing_spec_file_and_a_bad_instance_id_exit_2(tmp_path: Path) -> None:
    spec = tmp_path / "ok.toml"
    spec.write_text('name = "x"\ncommand = ["true"]\n')
    bads = ("a b", "../etc", "x..y", "-rf", "x" * 129)
    missing, *ids = gavel_all(
        [Line(["submit", str(tmp_path / "nope.toml"), "--nats", "nats://127.0.0.1:9"], tmp_path)]
        + [Line(["submit", str(spec), f"--id={bad}", "--nats", "nats://127.0.0.1:9"], tmp_path)
           for bad in bads], tmp_path / "results.json")
    assert "cannot read the spec file" in refused(missing)
    for bad, proc in zip(bads, ids, strict=True):
        line = refused(proc)
        assert line.startswith(f"gavel submit: --id {bad!r}: expected letters, digits"), line


def test_a_nats_where_nothing_answers_is_one_sentence_and_exit_2(tmp_path: Path) -> None:
    spec = tmp_path / "ok.toml"
    spec.write_text('name = "x"\ncommand = ["true"]\n')
    proc = gavel("submit", str(spec), "--nats", "nats://127.0.0.1:9")
    line = refused(proc, 2)
    assert proc.stderr.strip() == line
    assert line.startswith("gavel submit: nothing answers at nats://127.0.0.1:9: ")


WORKER_FLAGS = [
    (["--node-id", "bad.id"], "argument --node-id: node id 'bad.id' must be 1-64 letters"),
    (["--node-id", "n", "--cpu", "-2"], "argument --cpu: '-2' must be greater than 0"),
    (["--node-id", "n", "--cpu", "inf"], "argument --cpu: 'inf' must be a finite number"),
    (["--node-id", "n", "--cpu", "nan"], "argument --cpu: 'nan' must be greater than 0"),
    (["--node-id", "n", "--cpu", "lots"], "argument --cpu: 'lots' is not a number"),
    (["--node-id", "n", "--memory-mb", "0"], "argument --memory-mb: '0' must be greater than 0"),
    (["--node-id", "n", "--ports", "2000-1000"], "argument --ports: port range '2000-1000'"),
    (["--node-id", "n", "--ports", "0-10"], "argument --ports"),
    (["--node-id", "n", "--strategy", "cheapest"], "argument --strategy: 'cheapest' is not one"),
    (["--node-id", "n", "--labels", "zone"], "argument --labels: label 'zone' is not of the "
     "form key=value"),
    (["--node-id", "n", "--metrics-port", "70000"], "argument --metrics-port: '70000'"),
    (["--node-id", "n", "--bogus"], "unrecognized arguments: --bogus"),
    ([], "field `node_id` is required"),
]


@pytest.fixture(scope="module")
def worker_checks(tmp_path_factory: pytest.TempPathFactory
                  ) -> list[tuple[Path, subprocess.CompletedProcess[str]]]:
    """`gavel worker FLAGS --check` for each of `WORKER_FLAGS`, each in an empty directory of
    its own: that directory, and the outcome."""
    root = tmp_path_factory.mktemp("worker-flags")
    dirs = [root / str(n) for n in range(len(WORKER_FLAGS))]
    for d in dirs:
        d.mkdir()
    runs = gavel_all([Line(["worker", *flags, "--check"], d)
                      for (flags, _), d in zip(WORKER_FLAGS, dirs, strict=True)],
                     root / "results.json")
    return list(zip(dirs, runs, strict=True))


@pytest.mark.parametrize(("n", "says"), [(n, f[1]) for n, f in enumerate(WORKER_FLAGS)],
                         ids=[" ".join(f[0]) or "none" for f in WORKER_FLAGS])
def test_a_worker_with_bad_flags_exits_2_naming_the_flag(
        worker_checks: list[tuple[Path, subprocess.CompletedProcess[str]]], n: int,
        says: str) -> None:
    cwd, proc = worker_checks[n]
    line = refused(proc)
    assert says in line, line
    assert not any(cwd.iterdir()), "nothing written"


CONFIGS = [
    ("worker", 'node_id = "n"\ncpu = -1\n', "field `cpu` expected `float` > 0.0"),
    ("worker", 'node_id = "n"\ncpu = inf\n', "field `cpu` expected a finite number"),
    ("worker", 'node_id = "n"\nfoo = 1\n', "unknown field `foo`"),
    ("worker", 'node_id = "n n"\n', "field `node_id` expected `str` matching regex"),
    ("worker", 'node_id = "n"\nports = [2000, 1000]\n', "field `ports` expected FIRST <= LAST"),
    ("worker", 'node_id = "n"\nlabels = ' + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    ("broker", "state = 3\n", "field `state` expected `str`, got `int`"),
    ("broker", 'state = "s"\n[timing]\nheartbeat = 1.0\n', "unknown field `heartbeat`"),
    ("broker", "x = [\n", "is not valid TOML"),
    ("broker", b"\xff\xfe\x00garbage", "is not valid TOML"),
]


@pytest.fixture(scope="module")
def config_checks(tmp_path_factory: pytest.TempPathFactory
                  ) -> list[list[subprocess.CompletedProcess[str]]]:
    """For each of `CONFIGS`, in a directory of its own with the file as gavel.toml: `gavel
    config check` of it, with `--kind`, and the daemon's own `--config FILE --check`."""
    root = tmp_path_factory.mktemp("configs")
    lines = []
    for n, (kind, body, _) in enumerate(CONFIGS):
        d = root / str(n)
        d.mkdir()
        path = d / "gavel.toml"
        path.write_bytes(body if isinstance(body, bytes) else body.encode())
        lines += [Line(["config", "check", str(path)], d),
                  Line(["config", "check", str(path), "--kind", kind], d),
                  Line([kind, "--config", str(path), "--check"], d)]
    runs = gavel_all(lines, root / "results.json")
    return [runs[i:i + 3] for i in range(0, len(runs), 3)]


@pytest.mark.parametrize(("n", "says"), [(n, c[2]) for n, c in enumerate(CONFIGS)],
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CONFIGS)])
def test_config_check_of_a_bad_file_exits_2_naming_the_field(
        config_checks: list[list[subprocess.CompletedProcess[str]]], n: int, says: str
        ) -> None:
    *checks, daemon = config_checks[n]
    for proc in checks:
        line = refused(proc)
        assert proc.stderr.strip() == line, "one line, no more"
        assert says in line, line
    line = refused(daemon)
    assert says in line, line


async def test_a_node_of_another_protocol_version_is_refused_by_name(cluster: Cluster,
                                                                     caplog: Any) -> None:
    """A heartbeat from a gavel speaking another wire version is refused with a kind that
    says so (not lumped in with garbage), and the node never becomes a candidate."""
    broker = await cluster.start_broker()
    nc = await cluster.client()
    future = msgspec.to_builtins(Heartbeat(node_id="node-z"))
    future["v"] = PROTOCOL + 1
    with caplog.at_level("WARNING", logger="gavel.broker"):
        await nc.publish(subjects.HEARTBEAT.format(node="node-z"),
                         msgspec.msgpack.encode(future))
        await nc.flush()
        await wait_for(lambda: broker.rejects.counts.get(
            "message of another protocol version") == 1, 15, what="the refusal counted")
    assert f"protocol version {PROTOCOL + 1}; this gavel speaks {PROTOCOL}" in caplog.text
    assert "node-z" not in broker.liveness.known()
    assert "malformed heartbeat" not in broker.rejects.counts
