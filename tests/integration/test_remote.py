"""Pushing the state repository: coalesced, retried, merged on non-fast-forward, never forced.

Remotes are a bare repository over file:// and, where `git daemon` exists, a git:// server
on loopback started by the test.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pygit2
import pytest

from gavel.broker.ledger.remote import Pusher, PushError
from gavel.broker.ledger.repository import Change, Ledger, encode
from gavel.broker.metrics import Metrics
from gavel.shared.messages import Spec
from gavel.shared.records import Assignment, InstanceRecord, NodeFile, instance_path
from gavel.transport.natsserver import free_port

pytestmark = pytest.mark.integration
SIG = pygit2.Signature("someone else", "else@example.com")
REF = "refs/heads/main"


def record(iid: str, node: str = "") -> InstanceRecord:
    return InstanceRecord(instance_id=iid, spec=Spec(name=iid, command=["true"]), node_id=node)


def place(ledger: Ledger, iid: str, node: str) -> str:
    st = ledger.state()
    nf = st.nodes.get(node) or NodeFile(node_id=node)
    nf = msgspec.structs.replace(nf, instances={
        **nf.instances, iid: Assignment(instance_id=iid, auction_id="a", cpu=record(iid).spec.cpu,
                            memory_mb=record(iid).spec.memory_mb)})
    return ledger.apply(Change(instances={iid: record(iid, node)}, nodes={node: nf}),
                        f"place {iid} on {node}\n", st.head)


def someone_else_commits(remote: pygit2.Repository, files: dict[str, bytes | None],
                         message: str = "edit by someone else") -> str:
    """A commit written straight into the remote's branch, as another pusher would."""
    head = remote.references[REF].target
    index = pygit2.Index()
    index.read_tree(remote[head].peel(pygit2.Tree))
    for path, data in files.items():
        if data is None:
            index.remove(path)
        else:
            index.add(pygit2.IndexEntry(path, remote.create_blob(data),
                                        pygit2.enums.FileMode.BLOB))
    tree = index.write_tree(remote)
    return str(remote.create_commit(REF, SIG, SIG, message, tree, [head]))


def first_parents(repo: pygit2.Repository, sha: str) -> list[str]:
    return [str(c.id) for c in repo.walk(pygit2.Oid(hex=sha))]


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Ledger, pygit2.Repository, str]:
    ledger = Ledger(tmp_path / "state" / "state.git")
    remote = pygit2.init_repository(str(tmp_path / "remote.git"), bare=True,
                                    initial_head="main")
    return ledger, remote, f"file://{tmp_path / 'remote.git'}"


def test_push_lands_the_branch(setup: tuple[Ledger, pygit2.Repository, str]) -> None:
    ledger, remote, url = setup
    sha = place(ledger, "i1", "n1")
    pusher = Pusher(ledger.path, REF, url)
    assert pusher.sync() == sha
    assert str(remote.references[REF].target) == sha
    sha2 = place(ledger, "i2", "n1")
    assert pusher.sync() == sha2 and pusher.merges == 0


def test_someone_else_pushed_we_merge_on_top_never_force(
        setup: tuple[Ledger, pygit2.Repository, str]) -> None:
    ledger, remote, url = setup
    place(ledger, "i1", "n1")
    pusher = Pusher(ledger.path, REF, url)
    pusher.sync()
    # They add an instance, edit n1's node.json, and add a README; we place i2 on n1 too.
    theirs_nf = NodeFile(node_id="n1", draining=True)
    theirs = someone_else_commits(remote, {
        "instances/theirs.json": encode(record("theirs")),
        "nodes/n1/node.json": encode(theirs_nf),
        "README.md": b"the deployment\n",
    })
    ours = place(ledger, "i2", "n1")
    pushed = pusher.sync()
    assert pushed is not None and pusher.merges == 1
    remote_head = str(remote.references[REF].target)
    assert remote_head == pushed == ledger.head()
    merge = remote[remote_head].peel(pygit2.Commit)
    assert [str(p) for p in merge.parent_ids] == [ours, theirs]  # both histories, ours first
    history = first_parents(remote, remote_head)
    assert theirs in history and ours in history  # nothing of theirs was overwritten
    st = ledger.state()
    assert "theirs" in st.instances  # they changed it, we did not: taken
    assert set(st.nodes["n1"].instances) == {"i1", "i2"}  # both changed n1: ours wins
    assert not st.nodes["n1"].draining
    assert "Gavel-Merge-Kept-Ours: nodes/n1/node.json" in merge.message
    assert "Gavel-Merge-Took: instances/theirs.json" in merge.message


def test_their_broken_file_is_left_out(setup: tuple[Ledger, pygit2.Repository, str]) -> None:
    ledger, remote, url = setup
    place(ledger, "i1", "n1")
    pusher = Pusher(ledger.path, REF, url)
    pusher.sync()
    someone_else_commits(remote, {"instances/bad.json": b"{not json",
                                  "instances/good.json": encode(record("good")),
                                  instance_path("sharded"): b"{broken too",
                                  instance_path("fine"): encode(record("fine"))})
    place(ledger, "i2", "n2")
    pusher.sync()
    st = ledger.state()  # reads fine: the broken files never entered our tree
    assert {"good", "fine"} <= set(st.instances)
    assert "bad" not in st.instances and "sharded" not in st.instances
    head = remote[remote.references[REF].target].peel(pygit2.Commit)
    assert "Gavel-Merge-Ignored: instances/bad.json" in head.message
    assert f"Gavel-Merge-Ignored: {instance_path('sharded')}" in head.message  # checked too


def test_unreachable_remote_is_an_error_not_a_merge(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "state.git")
    place(ledger, "i1", "n1")
    pusher = Pusher(ledger.path, REF, f"file://{tmp_path / 'missing.git'}")
    with pytest.raises(PushError, match="failed"):
        pusher.sync()
    assert pusher.merges == 0


async def test_notifies_coalesce_and_failures_back_off(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "state.git")
    remote_path = tmp_path / "later.git"
    pusher = Pusher(ledger.path, REF, f"file://{remote_path}", backoff_s=0.01,
                    max_backoff_s=0.05)
    place(ledger, "i0", "n1")
    task = asyncio.create_task(pusher.run())
    try:
        while pusher.failures < 3:  # the remote does not exist yet: retried with back-off
            await asyncio.sleep(0.01)
        assert pusher.pushes == 0
        pygit2.init_repository(str(remote_path), bare=True, initial_head="main")
        await asyncio.wait_for(pusher.flush(), 30)
        assert pusher.pushes == 1
        for i in range(10):  # ten commits before the pusher gets to run: one push
            place(ledger, f"i{i + 1}", "n1")
            pusher.notify()
        await asyncio.wait_for(pusher.flush(), 30)
        assert pusher.pushes == 2
        remote = pygit2.Repository(str(remote_path))
        assert str(remote.references[REF].target) == ledger.head()
    finally:
        await pusher.close(task, timeout=1)


# -- a git server on loopback -----------------------------------------------------------------
@pytest.fixture
def git_daemon(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    git = shutil.which("git")
    if git is None or subprocess.run([git, "daemon", "-h"], capture_output=True).returncode \
            not in (0, 129):
        pytest.skip("git daemon is not available on this host")
    base = tmp_path / "served"
    base.mkdir()
    port = free_port()
    proc = subprocess.Popen(
        [git, "daemon", "--export-all", "--enable=receive-pack", f"--base-path={base}",
         "--listen=127.0.0.1", f"--port={port}", "--reuseaddr", str(base)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.skip("git daemon did not start on loopback")
                time.sleep(0.05)
        yield base, port
    finally:
        proc.terminate()
        proc.wait(5)


def test_push_and_merge_over_git_daemon(tmp_path: Path, git_daemon: tuple[Path, int]) -> None:
    base, port = git_daemon
    remote = pygit2.init_repository(str(base / "state.git"), bare=True, initial_head="main")
    ledger = Ledger(tmp_path / "state.git")
    place(ledger, "i1", "n1")
    pusher = Pusher(ledger.path, REF, f"git://127.0.0.1:{port}/state.git")
    assert pusher.sync() == str(remote.references[REF].target)
    theirs = someone_else_commits(remote, {"instances/theirs.json": encode(record("theirs"))})
    ours = place(ledger, "i2", "n1")
    pushed = pusher.sync()
    assert pushed == str(remote.references[REF].target) and pusher.merges == 1
    parents = [str(p) for p in remote[pushed].peel(pygit2.Commit).parent_ids]
    assert parents == [ours, theirs]
    assert "theirs" in ledger.state().instances


async def test_broker_pushes_after_commits_and_takes_their_instances(
        nats_url: str, tmp_path: Path) -> None:
    """`gavel broker --push`: placements reach the remote; an instance someone committed
    to the remote comes back in the merge and is auctioned like any other."""
    from tests.integration.harness import Cluster, sleeper_spec, wait_for

    remote = pygit2.init_repository(str(tmp_path / "remote.git"), bare=True,
                                    initial_head="main")
    cluster = Cluster(nats_url, tmp_path)
    metrics = Metrics()
    broker = await cluster.start_broker(metrics=metrics, pusher=lambda ledger, wake: Pusher(
        ledger.path, ledger.ref, f"file://{tmp_path / 'remote.git'}",
        on_merged=lambda change, sha: wake(), registry=metrics.registry, backoff_s=0.01))
    pusher = broker.pusher
    assert pusher is not None
    task = asyncio.create_task(pusher.run())
    try:
        await cluster.start_agent("n1")
        await cluster.wait_nodes(1)
        first = await cluster.submit(sleeper_spec("first", cpu=0.5))
        await wait_for(lambda: cluster.holders(first) == ["n1"], what="first placed")

        async def in_step() -> bool:  # the broker may commit again (a report) after a flush
            await asyncio.wait_for(pusher.flush(), 30)
            return str(remote.references[REF].target) == broker.ledger.head()
        await wait_for(in_step, 30, what="the remote to hold the broker's head")
        gitops = InstanceRecord(instance_id="gitops", spec=sleeper_spec("gitops", cpu=0.5))
        someone_else_commits(remote, {"instances/gitops.json": encode(gitops)})
        second = await cluster.submit(sleeper_spec("second", cpu=0.5))
        await wait_for(lambda: cluster.holders(second) == ["n1"], what="second placed")
        await wait_for(lambda: any(e.instance_id == "gitops" and e.type == "placed"
                                   for e in broker.events), 20,
                       what="their instance merged in and placed")
        await wait_for(in_step, 30, what="the remote to hold the broker's head again")
        assert pusher.merges >= 1
        samples = {s.labels["outcome"]: s.value
                   for m in broker.metrics.registry.collect()
                   if m.name == "gavel_git_pushes" for s in m.samples
                   if s.name.endswith("_total")}
        assert samples["merged"] >= 1 and samples["pushed"] >= 2
    finally:
        await pusher.close(task, timeout=1)
        await cluster.close()
