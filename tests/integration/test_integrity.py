"""One instance, one node: a node.json committed by someone else that lists an instance the
broker placed on another node - straight into the broker's state.git, or pushed to its
``--push`` remote and merged in - never makes a second worker run it. The broker keeps its
own placement, commits the correction naming both node files, and logs it at ERROR.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec
import pygit2
import pytest

from gavel.broker.ledger.remote import Pusher
from gavel.broker.ledger.state import encode
from gavel.shared import subjects
from gavel.shared.messages import Spec
from gavel.shared.records import NodeFile, node_path
from gavel.worker.agent import Agent
from gavel.worker.localstate import load
from tests.integration.harness import TIMING, Cluster, wait_for

pytestmark = pytest.mark.integration
SIG = pygit2.Signature("someone by hand", "hand@example.com")
REF = "refs/heads/main"


def marked_spec(name: str, out: Path, **kw: object) -> Spec:
    """A process that leaves ``out/<node>`` behind on every node that ever starts it, then
    sleeps."""
    code = (f"import os, pathlib, time; d = pathlib.Path({str(out)!r}); "
            "d.mkdir(exist_ok=True); (d / os.environ['GAVEL_NODE_ID']).touch(); time.sleep(120)")
    return Spec(name=name, command=[sys.executable, "-c", code], **kw)  # type: ignore[arg-type]


def raw_holders(repo_path: Path, iid: str, ref: str = REF) -> list[str]:
    """Every node whose node.json at `ref` lists the instance, read from git itself."""
    repo = pygit2.Repository(str(repo_path))
    tree = repo.revparse_single(ref).peel(pygit2.Tree)
    if "nodes" not in tree:
        return []
    out = []
    for entry in tree / "nodes":
        sub = repo[entry.id]
        if isinstance(sub, pygit2.Tree) and "node.json" in sub:
            nf = msgspec.json.decode(sub["node.json"].data, type=NodeFile)  # type: ignore[attr-defined]
            if iid in nf.instances:
                out.append(str(entry.name))
    return sorted(out)


def copy_placement(repo: pygit2.Repository, iid: str, src: str, dst: str,
                   ref: str = REF) -> str:
    """A commit by hand on `ref`: `dst`'s node.json also lists `iid`, copied from `src`'s."""
    head = repo.references[ref].target
    tree = repo[head].peel(pygit2.Tree)
    placed = msgspec.json.decode((tree / node_path(src)).data, type=NodeFile)  # type: ignore[attr-defined]
    try:
        theirs = msgspec.json.decode((tree / node_path(dst)).data, type=NodeFile)  # type: ignore[attr-defined]
    except KeyError:
        theirs = NodeFile(node_id=dst)
    theirs = msgspec.structs.replace(
        theirs, instances={**theirs.instances, iid: placed.instances[iid]})
    index = pygit2.Index()
    index.read_tree(tree)
    index.add(pygit2.IndexEntry(node_path(dst), repo.create_blob(encode(theirs)),
                                pygit2.enums.FileMode.BLOB))
    return str(repo.create_commit(ref, SIG, SIG, f"run {iid} on {dst} too\n",
                                  index.write_tree(repo), [head]))


class Never:
    """Watches one node for an instance, from now until `stop`: its worker's agent.json,
    what it holds and the node.json it converges onto (the KV mirror), every few
    milliseconds."""

    def __init__(self, agent: Agent, iid: str) -> None:
        self.agent, self.iid = agent, iid
        self.seen: list[str] = []
        self._task = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        path = self.agent.state_dir / "agent.json"
        while True:
            saved = load(path) if path.exists() else None
            if saved is not None and self.iid in saved.instances:
                self.seen.append("agent.json")
            if any(r.instance_id == self.iid for r in self.agent.instances()):
                self.seen.append("held")
            shown = self.agent.converger.node
            if shown is not None and self.iid in shown.instances:
                self.seen.append("listed in its node.json from KV")
            await asyncio.sleep(0.01)

    def stop(self) -> list[str]:
        self._task.cancel()
        return self.seen


async def kv_instances(cluster: Cluster, node: str) -> set[str]:
    kv = await (await cluster.client()).jetstream().key_value(subjects.NODES_BUCKET)
    return set(msgspec.json.decode((await kv.get(node)).value, type=NodeFile).instances)


def correction(repo_path: Path, iid: str, a: str, b: str) -> Callable[[], bool]:
    def found() -> bool:
        repo = pygit2.Repository(str(repo_path))
        for commit in repo.walk(repo.references[REF].target):
            if iid in commit.message and node_path(a) in commit.message \
                    and node_path(b) in commit.message and commit.author.name == "gavel-broker":
                return True
        return False
    return found


async def _placed_on_node_3(cluster: Cluster, out: Path) -> tuple[Agent, str]:
    n3 = await cluster.start_agent("node-3", cpu=1.0)  # other-1 (0.6 cpu) fits only node-1
    await cluster.wait_nodes(1)
    iid = await cluster.submit(marked_spec("web", out, cpu=0.5), "web-1")
    await wait_for(lambda: (out / "node-3").exists(), 15, what="web-1 running on node-3")
    await cluster.start_agent("node-1")
    await cluster.wait_nodes(2)
    return n3, iid


async def _and_then(cluster: Cluster, watch: Never, iid: str, other_out: Path,
                    caplog: pytest.LogCaptureFixture, out: Path) -> None:
    """What must hold once the duplicate is in git: node-1 takes other work (its node.json
    is written and mirrored again) but never web-1, and the correction is on the branch."""
    repo_path = cluster.state / "state.git"
    other = await cluster.submit(marked_spec("other", other_out, cpu=0.6), "other-1")
    await wait_for(lambda: (other_out / "node-1").exists(), 15, what="other-1 running on node-1")
    await wait_for(correction(repo_path, iid, "node-1", "node-3"), 15,
                   what="the correction commit naming both node files")
    await wait_for(lambda: raw_holders(repo_path, iid) == ["node-3"], 15,
                   what="git lists web-1 on node-3 only")
    async def mirrored() -> bool:  # the newest node.json of node-1 is in KV
        return other in await kv_instances(cluster, "node-1")
    await wait_for(mirrored, 15, what="node-1's node.json with other-1 in KV")
    assert iid not in await kv_instances(cluster, "node-1")
    # node-1 converges on what it was shown for a few heartbeats more: it never takes web-1
    await asyncio.sleep(TIMING.heartbeat_s * 3)
    assert watch.stop() == [], "node-1 was shown or held web-1"
    assert not (out / "node-1").exists(), "node-1 started web-1's process"
    assert (out / "node-3").exists()
    assert cluster.broker is not None
    assert cluster.broker.ledger.state().placement_of(iid) == "node-3"
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and iid in r.getMessage()
              and node_path("node-1") in r.getMessage() and node_path("node-3") in r.getMessage()]
    assert errors, "no ERROR line names the instance and both node files"


async def test_a_hand_commit_that_lists_a_placed_instance_on_a_second_node_is_undone(
        cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gavel")
    await cluster.start_broker()
    out, other_out = tmp_path / "web", tmp_path / "other"
    _n3, iid = await _placed_on_node_3(cluster, out)
    watch = Never(cluster.agents["node-1"], iid)
    copy_placement(pygit2.Repository(str(cluster.state / "state.git")), iid, "node-3", "node-1")
    assert raw_holders(cluster.state / "state.git", iid) == ["node-1", "node-3"]
    await _and_then(cluster, watch, iid, other_out, caplog, out)


async def test_the_same_duplicate_pushed_to_the_remote_is_undone_after_the_merge(
        cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gavel")
    remote = pygit2.init_repository(str(tmp_path / "remote.git"), bare=True,
                                    initial_head="main")
    broker = await cluster.start_broker(pusher=lambda ledger, wake: Pusher(
        ledger.path, ledger.ref, f"file://{tmp_path / 'remote.git'}",
        on_merged=lambda change, sha: wake(), backoff_s=0.01))
    pusher = broker.pusher
    assert pusher is not None
    pushing = asyncio.create_task(pusher.run())
    try:
        out, other_out = tmp_path / "web", tmp_path / "other"
        _n3, iid = await _placed_on_node_3(cluster, out)
        await asyncio.wait_for(pusher.flush(), 30)
        assert str(remote.references[REF].target) == broker.ledger.head()
        watch = Never(cluster.agents["node-1"], iid)
        copy_placement(remote, iid, "node-3", "node-1")  # someone pushes the duplicate
        # The next commit's push is refused; the pusher fetches theirs and merges it in.
        await cluster.submit(marked_spec("elsewhere", tmp_path / "none", cpu=0.1,
                                         labels={"zone": "nowhere"}), "waits-1")
        await wait_for(lambda: pusher.merges >= 1, 20, what="their commit merged in")
        await _and_then(cluster, watch, iid, other_out, caplog, out)
        await asyncio.wait_for(pusher.flush(), 30)
        assert raw_holders(tmp_path / "remote.git", iid) == ["node-3"]  # pushed back
    finally:
        await pusher.close(pushing, timeout=1)
