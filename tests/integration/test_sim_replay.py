"""`gavel sim --replay` on a real bare git repository whose commits carry auction trailers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import msgspec
import pygit2
import pytest

from gavel.cli.sim import add_arguments, run
from gavel.shared.award import NodeBid, NodeDecline
from gavel.shared.messages import Spec
from gavel.shared.reasons import Reason
from gavel.shared.records import (
    Assignment,
    AuctionRecord,
    InstanceRecord,
    NodeFile,
    auction_trailer,
    flat_instance_path,
    instance_path,
)

_SIG = pygit2.Signature("test", "test@gavel.local", 1_700_000_000, 0)


def _spec(name: str, cpu: float, memory_mb: int) -> Spec:
    return Spec(name=name, command=["sleep", "1"], cpu=cpu, memory_mb=memory_mb)


def _tree(repo: pygit2.Repository, files: dict[str, bytes]) -> pygit2.Oid:
    """A tree with nested directories from flat paths."""
    dirs: dict[str, dict[str, bytes]] = {}
    top: dict[str, bytes] = {}
    for path, data in files.items():
        head, _, rest = path.partition("/")
        if rest:
            dirs.setdefault(head, {})[rest] = data
        else:
            top[head] = data
    builder = repo.TreeBuilder()
    for name, data in top.items():
        builder.insert(name, repo.create_blob(data), pygit2.GIT_FILEMODE_BLOB)
    for name, sub in dirs.items():
        builder.insert(name, _tree(repo, sub), pygit2.GIT_FILEMODE_TREE)
    return builder.write()


def _build_state(root: Path) -> Path:
    """Three auctions over three nodes, committed the way the broker writes them."""
    repo = pygit2.init_repository(str(root / "state.git"), bare=True, initial_head="main")
    files: dict[str, bytes] = {}
    nodes: dict[str, NodeFile] = {n: NodeFile(node_id=n) for n in ("n1", "n2", "n3")}
    parents: list[pygit2.Oid] = []
    rounds = [
        # (instance, cpu, bids, declines, winner)
        ("web-1", 1.0, [("n1", 0.10, "least-loaded"), ("n2", 0.30, "binpack"),
                        ("n3", 0.20, "least-loaded")], [], "n1"),
        ("web-2", 1.0, [("n1", 0.20, "least-loaded"), ("n2", 0.25, "binpack"),
                        ("n3", 0.20, "least-loaded")], [], "n1"),
        ("big-1", 6.0, [("n2", 0.05, "binpack")], [("n1", Reason.NO_ROOM_CPU),
                                                  ("n3", Reason.MISSING_LABEL)], "n2"),
    ]
    for i, (iid, cpu, bids, declines, winner) in enumerate(rounds):
        spec = _spec(iid, cpu, 512)
        # The broker's layout (its shard), except one record put flat by hand.
        path = flat_instance_path(iid) if iid == "web-2" else instance_path(iid)
        files[path] = msgspec.json.encode(
            InstanceRecord(instance_id=iid, spec=spec, node_id=winner))
        nodes[winner].instances[iid] = Assignment(instance_id=iid, auction_id=f"a{i}",
                                                  cpu=spec.cpu, memory_mb=spec.memory_mb)
        for n, nf in nodes.items():
            files[f"nodes/{n}/node.json"] = msgspec.json.encode(nf)
        ranked = sorted(bids, key=lambda b: (b[1], b[0]))
        record = AuctionRecord(
            auction_id=f"a{i}", instance_id=iid, winner=winner, load=ranked[0][1],
            tie_broken=len(ranked) > 1 and ranked[0][1] == ranked[1][1],
            bids=[NodeBid(node_id=n, load=ld, strategy=s) for n, ld, s in ranked],
            declines=[NodeDecline(node_id=n, reason=r) for n, r in declines])
        message = f"award {iid} to {winner}\n\n{auction_trailer(record)}\n"
        oid = repo.create_commit("refs/heads/main", _SIG, _SIG, message, _tree(repo, files),
                                 parents)
        parents = [oid]
    return root


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return run(parser.parse_args(argv))


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return _build_state(tmp_path / "state")


def test_replay_under_the_production_rule_reproduces_every_award(state: Path,
                                                                  tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _run(["--replay", str(state), "--out", str(out)]) == 0
    result = json.loads((out / "replay.json").read_text())
    assert result["auctions"] == 3
    assert result["changed"] == 0
    assert result["disagreements"] == 0
    assert result["wins_recorded"] == {"n1": 2, "n2": 1}
    assert (out / "replay.md").read_text().startswith("# gavel sim --replay")


def test_replay_under_another_award_rule_reports_the_difference(state: Path,
                                                                 tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _run(["--replay", str(state), "--award", "highest", "--out", str(out)]) == 0
    result = json.loads((out / "replay.json").read_text())
    replayed = [r["replayed"] for r in result["rounds"]]
    assert replayed == ["n2", "n2", "n2"]
    assert result["changed"] == 2


def test_switching_nodes_to_another_strategy_rebids_them(state: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    # n1 and n3 re-bid as binpack on assumed 8-cpu/16 GB nodes: nearly empty, they bid
    # 1 - utilisation-after ~ 0.92 and 0.84, so n2's recorded 0.30 and 0.25 win instead.
    assert _run(["--replay", str(state), "--switch", "n[13]=binpack",
                 "--capacity", "cpu=8,memory_mb=16384", "--out", str(out)]) == 0
    result = json.loads((out / "replay.json").read_text())
    rounds = result["rounds"]
    assert rounds[0]["rebid"] == ["n1", "n3"]
    assert [r["replayed"] for r in rounds] == ["n2", "n2", "n2"]
    assert result["changed"] == 2
    assert rounds[2]["rebid"] == []  # hard declines stay as recorded
    assert rounds[2]["replayed"] == "n2"
    assert result["disagreements"] == 0


def test_a_rev_range_limits_the_replay(state: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _run(["--replay", str(state), "main~1..main", "--out", str(out)]) == 0
    result = json.loads((out / "replay.json").read_text())
    assert result["commits"] == 1
    assert [r["instance_id"] for r in result["rounds"]] == ["big-1"]


def test_bad_replay_input_exits_2_with_one_sentence(state: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["--replay", str(tmp_path / "nowhere")]) == 2
    assert "expected a state directory" in capsys.readouterr().err
    assert _run(["--replay", str(state), "--award", "best"]) == 2
    assert "--award" in capsys.readouterr().err
    assert _run(["--replay", str(state), "--switch", "n1=fastest"]) == 2
    assert "unknown strategy" in capsys.readouterr().err
    assert _run(["--replay", str(state), "nosuchrev"]) == 2
    assert "REV_RANGE" in capsys.readouterr().err
