"""The bench's own check (bench/verify.py) against real git repositories written by hand: it
passes a consistent run and fails loudly on each kind of inconsistency."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gavel.bench.verify import VerifyError, answered, verify, verify_churn
from gavel.broker.ledger.repository import Ledger, encode
from gavel.shared.messages import InstanceState, Spec
from gavel.shared.records import (
    Assignment,
    AuctionRecord,
    InstanceRecord,
    NodeFile,
    auction_trailer,
    instance_path,
    node_path,
)

SPEC = Spec(name="s", command=["true"])


def _node(nid: str, *iids: str) -> bytes:
    return encode(NodeFile(node_id=nid, instances={
        i: Assignment(instance_id=i, auction_id="a1", cpu=0.1, memory_mb=16) for i in iids}))


def _rec(iid: str, state: InstanceState = InstanceState.QUEUED) -> bytes:
    return encode(InstanceRecord(instance_id=iid, spec=SPEC, state=state))


def _award(*iids: str) -> str:
    return "\n".join(auction_trailer(AuctionRecord(auction_id="a1", instance_id=i, winner="n1",
                                                   load=0.1)) for i in iids)


def _repo(tmp_path: Path, commits: list[tuple[dict[str, bytes | None], str]]) -> Path:
    ledger = Ledger(tmp_path / "state.git")
    head = ledger.head()
    for files, message in commits:
        head = ledger.write_files(files, message, head)
    return tmp_path


def test_every_placement_in_exactly_one_node_file(tmp_path: Path) -> None:
    root = _repo(tmp_path, [({node_path("n1"): _node("n1", "a", "b"),
                              node_path("n2"): _node("n2", "c")}, "placed")])
    verify(root, ["a", "b", "c"])
    with pytest.raises(VerifyError, match=re.escape("1 placements are in no node.json, e.g. d")):
        verify(root, ["a", "b", "c", "d"])


def test_the_tree_must_hold_the_ids_asked_for_and_no_other(tmp_path: Path) -> None:
    """What the bench asked for against what git holds, both ways: a state that lacks one
    id fails, and so does one that holds an extra (in a node.json, or only as a record)."""
    root = _repo(tmp_path, [({instance_path(i): _rec(i) for i in "abc"}, "submit"),
                            ({node_path("n1"): _node("n1", "a", "b", "c")}, "placed")])
    verify(root, ["a", "b", "c"])
    with pytest.raises(VerifyError, match=re.escape("1 placements are in no node.json, e.g. "
                                                    "b0000009")):
        verify(root, ["a", "b", "c", "b0000009"])
    with pytest.raises(VerifyError, match=re.escape(
            "1 instances in node.json files were never submitted, e.g. c")):
        verify(root, ["a", "b"])
    _repo(tmp_path, [({instance_path("x"): _rec("x")}, "someone else's")])
    with pytest.raises(VerifyError, match=re.escape(
            "1 instances in instance records were never submitted, e.g. x")):
        verify(root, ["a", "b", "c"])
    with pytest.raises(VerifyError, match=re.escape("the bench asked for a twice")):
        verify(root, ["a", "a", "b", "c", "x"])


def test_an_instance_in_two_node_files_fails(tmp_path: Path) -> None:
    root = _repo(tmp_path, [({node_path("n1"): _node("n1", "a"),
                              node_path("n2"): _node("n2", "a")}, "twice")])
    with pytest.raises(VerifyError, match=re.escape("a is in two node.json files: n1 and n2")):
        verify(root, ["a"])


def test_a_reply_must_name_the_ids_asked_for() -> None:
    asked = ["b0000000-1", "b0000000-2", "b0000000-3"]
    answered(asked, list(asked))
    answered(["b0000003"], ["b0000003"])
    with pytest.raises(VerifyError, match=re.escape(
            "the broker named 2 instances for a submission of 3 (b0000000-1 ..)")):
        answered(asked, asked[:2])
    with pytest.raises(VerifyError, match=re.escape(
            "named 4 instances for a submission of 3 (b0000000-1 ..), among them x, never "
            "asked for")):
        answered(asked, [*asked, "x"])
    with pytest.raises(VerifyError, match="named 3 instances for a submission of 3"):
        answered(asked, asked[::-1])


def _churned(tmp_path: Path, extra: list[tuple[dict[str, bytes | None], str]]) -> Path:
    base: list[tuple[dict[str, bytes | None], str]] = [
        ({instance_path(i): _rec(i) for i in ("run", "done", "gone")}, "submit"),
        ({node_path("n1"): _node("n1", "run", "done", "gone")},
         "placed\n\n" + _award("run", "done", "gone")),
        ({node_path("n1"): _node("n1", "run"),
          instance_path("done"): _rec("done", InstanceState.SUCCEEDED),
          instance_path("gone"): _rec("gone", InstanceState.SUCCEEDED)}, "ended"),
        ({instance_path("gone"): None}, "forget gone (succeeded): retention"),
    ]
    return _repo(tmp_path, base + extra)


def test_a_consistent_churn_run_passes_and_is_counted(tmp_path: Path) -> None:
    churn = verify_churn(_churned(tmp_path, []), ["run", "done", "gone"])
    assert (churn.running, churn.ended_kept, churn.forgotten) == (1, 1, 1)


def test_a_requeued_instance_wins_once_more_for_each_requeue(tmp_path: Path) -> None:
    """A node that did not accept its assignment in time (a loaded machine) has the instance
    requeued and auctioned again: a second award, honest - but only after the requeue."""
    requeued = [({node_path("n1"): _node("n1"), instance_path("run"): _rec("run")},
                 "requeue run off n1: node did not accept assignment"),
                ({node_path("n1"): _node("n1", "run")}, "placed\n\n" + _award("run"))]
    churn = verify_churn(_churned(tmp_path, requeued), ALL)
    assert churn.running == 1
    again = [*requeued, ({}, "again\n\n" + _award("run"))]
    with pytest.raises(VerifyError, match=re.escape(
            "run won 3 awards in git history, not one and one for each of its 1 requeues")):
        verify_churn(_churned(tmp_path / "again", again), ALL)


ALL = ["run", "done", "gone"]


@pytest.mark.parametrize(("extra", "ids", "words"), [
    ([], [*ALL, "never"], "never won 0 awards in git history"),
    ([({}, "again\n\n" + _award("run"))], ALL, "run won 2 awards"),
    ([({instance_path("gone"): _rec("gone", InstanceState.SUCCEEDED)}, "back")], ALL,
     "gone was forgotten but its record is still in the tree"),
    ([({node_path("n1"): None}, "lost it")], ALL,
     "run is in no node.json, did not succeed and was not forgotten"),
    ([], ["run", "gone"], "1 instances in instance records were never submitted, e.g. done"),
    ([({node_path("n2"): _node("n2", "stray")}, "someone else's")], ALL,
     "1 instances in node.json files were never submitted, e.g. stray"),
])
def test_each_inconsistency_of_a_churn_run_fails(
        tmp_path: Path, extra: list[tuple[dict[str, bytes | None], str]], ids: list[str],
        words: str) -> None:
    with pytest.raises(VerifyError, match=re.escape(words)):
        verify_churn(_churned(tmp_path, extra), ids)
