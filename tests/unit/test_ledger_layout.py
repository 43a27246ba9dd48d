"""Instance records live in 256 shards, so a commit rewrites only the shards it touches; a
record an operator put flat by hand is read, and moved into its shard by the broker's next
write of it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pygit2
import pytest

from gavel.broker.ledger.repository import Change, Ledger, encode
from gavel.shared.messages import InstanceState, Spec
from gavel.shared.records import InstanceRecord, flat_instance_path, instance_path

SPEC = Spec(name="s", command=["true"])


def rec(iid: str, state: InstanceState = InstanceState.QUEUED) -> InstanceRecord:
    return InstanceRecord(instance_id=iid, spec=SPEC, state=state)


def paths(ledger: Ledger) -> set[str]:
    tree = ledger.repo[ledger.head()].peel(pygit2.Tree)
    out: set[str] = set()

    def walk(t: pygit2.Tree, prefix: str) -> None:
        for e in t:
            obj = ledger.repo[e.id]
            if isinstance(obj, pygit2.Tree):
                walk(obj, f"{prefix}{e.name}/")
            else:
                out.add(f"{prefix}{e.name}")
    walk(tree, "")
    return out


def test_the_shard_is_two_hex_digits_of_the_ids_sha1() -> None:
    assert instance_path("web-1") == "instances/ba/web-1.json"  # sha1("web-1") = ba92...
    assert flat_instance_path("web-1") == "instances/web-1.json"
    shards = {instance_path(f"i{k}").split("/")[1] for k in range(5000)}
    assert len(shards) == 256  # spread over all of them


def test_a_commit_rewrites_only_the_shards_it_touches(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "state.git")
    head = ledger.write(Change(instances={f"i{k}": rec(f"i{k}") for k in range(3000)}),
                        "many", None)
    ledger.adopt(Change(), head, head)
    before = ledger.repo[head].peel(pygit2.Tree)
    after_sha = ledger.write(Change(instances={"i7": rec("i7", InstanceState.CANCELLED)}),
                             "one", head)
    after = ledger.repo[after_sha].peel(pygit2.Tree)
    old = ledger.repo[before["instances"].id]
    new = ledger.repo[after["instances"].id]
    assert isinstance(old, pygit2.Tree) and isinstance(new, pygit2.Tree)
    assert len(new) == 256  # the instances/ tree lists shards, not 3,000 records
    changed = [e.name for e in new if old[e.name].id != e.id]
    assert changed == [instance_path("i7").split("/")[1]]
    state = Ledger(tmp_path / "state.git").state()
    assert len(state.instances) == 3000 and not state.flat
    assert state.instances["i7"].state is InstanceState.CANCELLED


def test_a_hand_made_flat_record_is_read_and_moved_into_its_shard(tmp_path: Path) -> None:
    # An operator commits instances/web-1.json by hand (GitOps), next to a sharded record.
    head = Ledger(tmp_path / "state.git").write_files(
        {flat_instance_path("web-1"): encode(rec("web-1")),
         instance_path("api-1"): encode(rec("api-1"))}, "by hand", None)
    ledger = Ledger(tmp_path / "state.git")  # the broker, starting on that repository
    state = ledger.state()
    assert set(state.instances) == {"web-1", "api-1"}
    assert state.flat == {"web-1": "instances/web-1.json"}
    assert state.instances["web-1"].state is InstanceState.QUEUED
    change = Change(instances={"web-1": rec("web-1", InstanceState.CANCELLED)})
    sha = ledger.write(change, "cancel", head)
    ledger.adopt(change, head, sha)
    assert not ledger.state().flat
    assert {p for p in paths(ledger) if p.startswith("instances/")} == {
        instance_path("web-1"), instance_path("api-1")}  # moved: the flat file is gone
    fresh = Ledger(tmp_path / "state.git").state()
    assert fresh.instances["web-1"].state is InstanceState.CANCELLED and not fresh.flat


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_sharded_commits_pass_git_fsck(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "state.git")
    head = None
    for k in range(3):
        head = ledger.write(Change(instances={f"i{k}-{j}": rec(f"i{k}-{j}") for j in range(50)}),
                            f"c{k}", head)
    out = subprocess.run(["git", "--git-dir", str(tmp_path / "state.git"), "fsck", "--strict",
                          "--full"], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_files_that_are_not_what_their_path_says_are_ignored_and_left_alone(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from gavel.shared.records import NodeFile, node_path

    wrong_shard = "instances/00/stray.json" if instance_path("stray")[10:12] != "00" \
        else "instances/01/stray.json"
    hand = {
        "instances/bad.json": b'{"instance_id": "bad", "spec": {"name": "x"}}\n',
        instance_path("mine"): encode(rec("other")),  # names another instance
        instance_path("good"): encode(rec("good")),
        wrong_shard: encode(rec("stray")),
        node_path("n1"): b"not json",
        node_path("n2"): encode(NodeFile(node_id="n3")),  # names another node
        node_path("n4"): encode(NodeFile(node_id="n4", draining=True)),
    }
    head = Ledger(tmp_path / "state.git").write_files(hand, "by hand", None)
    ledger = Ledger(tmp_path / "state.git")
    with caplog.at_level("ERROR", logger="gavel.ledger"):
        state = ledger.state()
    assert set(state.instances) == {"good", "stray"} and set(state.nodes) == {"n4"}
    assert set(state.unreadable) == {"instances/bad.json", instance_path("mine"),
                                     node_path("n1"), node_path("n2")}
    assert "names neither" in state.unreadable["instances/bad.json"]
    assert state.unreadable[instance_path("mine")] == "it names instance 'other'"
    assert state.unreadable[node_path("n2")] == "it names node 'n3'"
    assert state.unusable_nodes == {"n1", "n2"}
    assert state.flat == {"stray": wrong_shard}  # moved to its shard at the next write
    assert f"{node_path('n1')} is not a usable gavel file" in caplog.text
    # The broker's next write touches none of them (and moves the stray record home).
    change = Change(instances={"stray": rec("stray", InstanceState.CANCELLED)})
    ledger.write(change, "cancel stray", head)
    now = Ledger(tmp_path / "state.git")
    files = paths(now)
    assert {"instances/bad.json", instance_path("mine"), node_path("n1"),
            node_path("n2")} <= files
    assert instance_path("stray") in files and wrong_shard not in files
    blob = now.repo.revparse_single(f"main:{node_path('n1')}")
    assert blob.data == b"not json"  # type: ignore[attr-defined]
