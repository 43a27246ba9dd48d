"""The keep rule of `broker.ledger.integrity`, in memory: a tree someone else wrote that
lists an instance on a node the broker did not place it on is read as the broker had it,
against its own history - or, at a broker start, by the newest recorded auction, the highest
attempt, the lowest node id - and each correction is a `Dispute` naming every node file."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from pathlib import Path

import msgspec
import pygit2
import pytest

from gavel.broker.integrity import Corrected, plan_correction
from gavel.broker.ledger.disputes import Keep
from gavel.broker.ledger.integrity import settle
from gavel.broker.ledger.plan import View
from gavel.broker.ledger.repository import Ledger
from gavel.broker.ledger.state import Change, State, committed_by, encode
from gavel.shared.messages import Capacity, Spec
from gavel.shared.records import (
    Assignment,
    AuctionRecord,
    InstanceRecord,
    NodeFile,
    auction_trailer,
    instance_path,
    node_path,
)
from tests.unit.test_fuzz_broker import Rig

SPEC = Spec(name="web", command=["true"], cpu=0.5, memory_mb=64)


def entry(iid: str, attempt: int = 1, auction: str = "a1") -> Assignment:
    return Assignment(instance_id=iid, auction_id=auction, attempt=attempt, cpu=SPEC.cpu,
                      memory_mb=SPEC.memory_mb)


def tree(nodes: Mapping[str, Mapping[str, Assignment]], *, records: Collection[str] = (),
         draining: Collection[str] = ()) -> State:
    """A State as `Ledger` reads one: records, then node files in node id order."""
    st = State(head="h")
    for iid in sorted({*records, *(i for f in nodes.values() for i in f)}):
        st.put_instance(iid, InstanceRecord(instance_id=iid, spec=SPEC))
    for nid in sorted(nodes):
        st.put_node(nid, NodeFile(node_id=nid, instances=dict(nodes[nid]),
                                  draining=nid in draining))
    return st


def no_auctions(iids: Collection[str]) -> dict[str, str]:
    return {}


def indexed_once(st: State) -> None:
    """Every index says the same as the node files, and no instance is in two of them."""
    listed = [(iid, nid) for nid, nf in st.nodes.items() for iid in nf.instances]
    assert len({iid for iid, _ in listed}) == len(listed), listed
    assert st.where == dict(listed)
    for nid, nf in st.nodes.items():
        assert st.committed[nid] == committed_by(nf)
    assert all(iid not in st.where for iid in st.pending)


# -- against the broker's own history (the ref moved under it) ---------------------------

def test_an_instance_added_to_a_second_node_file_is_taken_out_of_it() -> None:
    history = tree({"node-3": {"web-1": entry("web-1")}, "node-1": {"db-1": entry("db-1")}})
    read = tree({"node-3": {"web-1": entry("web-1")},
                 "node-1": {"db-1": entry("db-1"), "web-1": entry("web-1")}})
    (d,) = settle(read, history, no_auctions)
    assert (d.instance_id, d.kept, d.rule) == ("web-1", "node-3", Keep.HISTORY)
    assert (d.held, d.dropped, d.restored) == (("node-1", "node-3"), ("node-1",), "")
    assert d.rewrite == ("node-1",)
    assert set(read.nodes["node-1"].instances) == {"db-1"}
    assert read.placement_of("web-1") == "node-3"
    assert read.committed["node-1"] == Capacity(cpu=0.5, memory_mb=64)
    indexed_once(read)
    assert read.disputes == {"web-1": d}
    line = d.sentence()
    assert node_path("node-1") in line and node_path("node-3") in line and "web-1" in line


def test_the_last_file_read_does_not_decide() -> None:
    """`where` holds the last node file read that lists an instance: node-9 after node-3."""
    history = tree({"node-3": {"web-1": entry("web-1")}})
    read = tree({"node-3": {"web-1": entry("web-1")}, "node-9": {"web-1": entry("web-1")}})
    assert read.where["web-1"] == "node-9"
    (d,) = settle(read, history, no_auctions)
    assert d.kept == "node-3" and "node-9" not in read.nodes  # its file only held web-1
    assert read.placement_of("web-1") == "node-3"
    indexed_once(read)


def test_a_moved_entry_is_put_back_where_the_broker_had_it() -> None:
    history = tree({"node-3": {"web-1": entry("web-1"), "api-1": entry("api-1")}})
    read = tree({"node-3": {"api-1": entry("api-1")}, "node-1": {"web-1": entry("web-1")}})
    (d,) = settle(read, history, no_auctions)
    assert (d.kept, d.dropped, d.restored) == ("node-3", ("node-1",), "node-3")
    assert d.rewrite == ("node-1", "node-3")
    assert read.nodes["node-3"].instances["web-1"] == entry("web-1")
    assert "node-1" not in read.nodes
    indexed_once(read)


def test_a_removed_entry_is_put_back_while_its_record_is_there() -> None:
    history = tree({"node-3": {"web-1": entry("web-1")}})
    read = tree({}, records=["web-1"])
    (d,) = settle(read, history, no_auctions)
    assert (d.kept, d.held, d.restored) == ("node-3", (), "node-3")
    assert read.placement_of("web-1") == "node-3" and "web-1" not in read.pending
    indexed_once(read)


def test_a_removed_entry_whose_record_is_gone_too_stays_removed() -> None:
    history = tree({"node-3": {"web-1": entry("web-1")}})
    read = tree({})
    assert settle(read, history, no_auctions) == []
    assert read.placement_of("web-1") is None and not read.disputes


def test_an_edited_entry_is_put_back_as_it_was() -> None:
    history = tree({"node-3": {"web-1": entry("web-1", attempt=1)}})
    read = tree({"node-3": {"web-1": entry("web-1", attempt=7)}})
    (d,) = settle(read, history, no_auctions)
    assert (d.kept, d.dropped, d.restored) == ("node-3", (), "node-3")
    assert read.nodes["node-3"].instances["web-1"].attempt == 1


def test_an_instance_the_broker_placed_nowhere_is_taken_out_and_waits() -> None:
    history = tree({}, records=["queued-1"])
    read = tree({"node-1": {"queued-1": entry("queued-1")}})
    (d,) = settle(read, history, no_auctions)
    assert (d.kept, d.rule, d.dropped) == ("", Keep.NOWHERE, ("node-1",))
    assert read.placement_of("queued-1") is None and "queued-1" in read.pending
    assert "on no node" in d.sentence()
    indexed_once(read)


def test_draining_and_blocked_ports_stay_the_operators_to_edit() -> None:
    history = tree({"node-3": {"web-1": entry("web-1")}})
    read = tree({"node-3": {"web-1": entry("web-1")}}, draining=["node-3"])
    read.put_node("node-3", msgspec.structs.replace(read.nodes["node-3"],
                                                    blocked_ports=[20001]))
    assert settle(read, history, no_auctions) == []
    assert read.nodes["node-3"].draining and read.nodes["node-3"].blocked_ports == [20001]
    assert "node-3" in read.draining


def test_a_duplicate_in_a_node_file_drained_by_hand_keeps_the_drain() -> None:
    history = tree({"node-3": {"web-1": entry("web-1")}, "node-1": {}})
    read = tree({"node-3": {"web-1": entry("web-1")}, "node-1": {"web-1": entry("web-1")}},
                draining=["node-1"])
    (d,) = settle(read, history, no_auctions)
    assert d.kept == "node-3"
    assert read.nodes["node-1"] == NodeFile(node_id="node-1", draining=True)


def test_an_unusable_node_file_is_never_rewritten() -> None:
    history = tree({"node-3": {"web-1": entry("web-1")}})
    read = tree({"node-1": {"web-1": entry("web-1")}})
    read.unusable_nodes.add("node-3")
    read.unreadable[node_path("node-3")] = "not JSON"
    assert settle(read, history, no_auctions) == []


def test_a_dispute_still_open_at_the_next_read_is_the_same_one() -> None:
    history = tree({"node-3": {"web-1": entry("web-1")}})
    first = tree({"node-3": {"web-1": entry("web-1")}, "node-1": {"web-1": entry("web-1")}})
    (d,) = settle(first, history, no_auctions)
    again = tree({"node-3": {"web-1": entry("web-1")}, "node-1": {"web-1": entry("web-1")}},
                 records=["new-1"])  # another commit by hand on top, before the correction
    (d2,) = settle(again, first, no_auctions)
    assert d2 is d and again.disputes["web-1"] is d


def test_a_tree_as_the_broker_wrote_it_has_no_dispute() -> None:
    history = tree({"node-3": {"web-1": entry("web-1")}, "node-1": {"db-1": entry("db-1")}})
    read = tree({"node-3": {"web-1": entry("web-1")}, "node-1": {"db-1": entry("db-1")}},
                records=["new-1"])  # a record added by hand: not a placement
    assert settle(read, history, no_auctions) == [] and not read.disputes


# -- at a broker start (no history) ------------------------------------------------------

def test_at_start_the_newest_auction_winner_keeps_it() -> None:
    read = tree({"node-1": {"web-1": entry("web-1", attempt=2)},
                 "node-3": {"web-1": entry("web-1", attempt=1)}})
    asked: list[list[str]] = []

    def winners(iids: Collection[str]) -> dict[str, str]:
        asked.append(list(iids))
        return {"web-1": "node-3"}

    (d,) = settle(read, None, winners)
    assert asked == [["web-1"]]  # once, for the duplicates only
    assert (d.kept, d.rule, d.dropped) == ("node-3", Keep.AUCTION, ("node-1",))
    assert read.placement_of("web-1") == "node-3"
    indexed_once(read)


def test_at_start_without_an_auction_the_highest_attempt_keeps_it() -> None:
    read = tree({"node-1": {"web-1": entry("web-1", attempt=1)},
                 "node-3": {"web-1": entry("web-1", attempt=2)},
                 "node-5": {"web-1": entry("web-1", attempt=1)}})
    (d,) = settle(read, None, lambda iids: {"web-1": "node-9"})  # a winner that holds none
    assert (d.kept, d.rule, d.dropped) == ("node-3", Keep.ATTEMPT, ("node-1", "node-5"))
    indexed_once(read)


def test_at_start_equal_attempts_keep_the_lowest_node_id() -> None:
    read = tree({"node-3": {"web-1": entry("web-1")}, "node-1": {"web-1": entry("web-1")}})
    (d,) = settle(read, None, no_auctions)
    assert (d.kept, d.rule) == ("node-1", Keep.NODE_ID)
    assert read.placement_of("web-1") == "node-1"
    indexed_once(read)


def test_at_start_a_single_listing_is_taken_as_it_is() -> None:
    read = tree({"node-1": {"web-1": entry("web-1")}, "node-3": {"db-1": entry("db-1")}})
    assert settle(read, None, no_auctions) == []
    assert read.placement_of("web-1") == "node-1"


# -- a real ledger -----------------------------------------------------------------------

def _hand_tree(repo: pygit2.Repository, files: Mapping[str, bytes]) -> pygit2.Oid:
    index = pygit2.Index()
    for path, data in files.items():
        index.add(pygit2.IndexEntry(path, repo.create_blob(data), pygit2.enums.FileMode.BLOB))
    return index.write_tree(repo)


def test_a_broker_start_on_a_tree_that_already_holds_the_duplicate(tmp_path: Path) -> None:
    """The history says node-3 won web-1's auction; a later hand commit copied it into
    node-1's file (node-1 would win on the node id). The broker's ledger reads node-3 only;
    a plain ledger - what `gavel bench`'s check reads - still sees git as it is."""
    path = tmp_path / "state.git"
    repo = pygit2.init_repository(str(path), bare=True, initial_head="main")
    sig = pygit2.Signature("gavel-broker", "broker@gavel.local")
    rec = encode(InstanceRecord(instance_id="web-1", spec=SPEC))
    won = auction_trailer(AuctionRecord(auction_id="a1", instance_id="web-1", winner="node-3",
                                        load=0.1))
    placed = {instance_path("web-1"): rec,
              node_path("node-3"): encode(NodeFile(node_id="node-3",
                                                   instances={"web-1": entry("web-1")}))}
    first = repo.create_commit("refs/heads/main", sig, sig, f"place web-1 on node-3\n\n{won}\n",
                               _hand_tree(repo, placed), [])
    hand = pygit2.Signature("someone", "someone@example.com")
    repo.create_commit("refs/heads/main", hand, hand, "web-1 on node-1 too\n", _hand_tree(repo, {
        **placed, node_path("node-1"): encode(NodeFile(node_id="node-1",
                                                       instances={"web-1": entry("web-1")}))}),
                       [first])

    st = Ledger(path, settle=True).state()
    assert st.placement_of("web-1") == "node-3" and "node-1" not in st.nodes
    (d,) = st.disputes.values()
    assert (d.kept, d.rule, d.held) == ("node-3", Keep.AUCTION, ("node-1", "node-3"))

    raw = Ledger(path).state()
    assert not raw.disputes
    assert {n for n, nf in raw.nodes.items() if "web-1" in nf.instances} == {"node-1", "node-3"}


# -- the broker: no award for the dropped copy, and the correction committed -----------

def test_the_broker_never_awards_the_dropped_copy_and_commits_the_correction(
        rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    """`Rig` placed web-1 on n1; a commit by hand lists it on n2 too. A worker of n2 that
    asks (`gavel.assign.n2`), or holds it and asks to keep it (converge rule 2), is told it
    is not placed there; the correction names both files, and git then lists n1 only."""
    b = rig.b
    repo = pygit2.Repository(str(b.ledger.path))
    head = repo.references["refs/heads/main"].target
    base = repo[head].peel(pygit2.Tree)
    placed = msgspec.json.decode((base / node_path("n1")).data,  # type: ignore[attr-defined]
                                 type=NodeFile).instances["web-1"]
    index = pygit2.Index()
    index.read_tree(base)
    index.add(pygit2.IndexEntry(node_path("n2"), repo.create_blob(encode(
        NodeFile(node_id="n2", instances={"web-1": placed}))), pygit2.enums.FileMode.BLOB))
    hand = pygit2.Signature("someone", "someone@example.com")
    repo.create_commit("refs/heads/main", hand, hand, "web-1 on n2 too\n",
                       index.write_tree(repo), [head])
    b.ledger.forget_head()

    assert b.assignments.award_for("web-1", "n2", "sha") is None
    award = b.assignments.award_for("web-1", "n1", "sha")
    assert award is not None and award.node_id == "n1"
    assert b.ledger.state().placement_of("web-1") == "n1"
    with caplog.at_level("ERROR", logger="gavel.broker"):
        b.integrity.watch()
        b.integrity.watch()  # once: the dispute is on its way
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and node_path("n1") in errors[0] and node_path("n2") in errors[0]
    rig.run(b.committer.idle.wait())
    rig.run(asyncio.sleep(0.05))
    fixed = repo[repo.references["refs/heads/main"].target].peel(pygit2.Commit)
    assert fixed.message.startswith("correct: web-1 was listed in nodes/n1/node.json and "
                                    "nodes/n2/node.json: kept on n1")
    assert node_path("n2") not in [f"nodes/{e.name}/node.json" for e in fixed.tree / "nodes"]
    assert not b.ledger.state().disputes and b.integrity.corrected == 1
    assert b.ledger.state().placement_of("web-1") == "n1"


# -- the correction as a pure plan (`broker.integrity` rule 4) --------------------------------

def test_the_correction_plan_rewrites_the_node_files_and_names_its_effect() -> None:
    history = tree({"node-3": {"web-1": entry("web-1")}, "node-1": {"db-1": entry("db-1")}})
    read = tree({"node-3": {"web-1": entry("web-1")},
                 "node-1": {"db-1": entry("db-1"), "web-1": entry("web-1")}})
    (d,) = settle(read, history, no_auctions)
    view = View(read, Change())
    planned, gone = plan_correction(view, [d])
    assert planned is not None and gone == []
    assert planned.lines == [f"correct: {d.sentence()}"]
    assert planned.effects == [Corrected((d,))]
    written = view.change.nodes["node-1"]
    assert written is not None and set(written.instances) == {"db-1"}
    assert set(view.change.nodes) == {"node-1"}  # only the file the dispute rewrites


def test_a_dispute_closed_before_the_correction_is_planned_is_handed_back() -> None:
    history = tree({"node-3": {"web-1": entry("web-1")}})
    read = tree({"node-3": {"web-1": entry("web-1")}, "node-1": {"web-1": entry("web-1")}})
    (d,) = settle(read, history, no_auctions)
    later = tree({"node-3": {"web-1": entry("web-1")}})  # the tree moved again meanwhile
    view = View(later, Change())
    assert plan_correction(view, [d]) == (None, [d])
    assert not view.change
