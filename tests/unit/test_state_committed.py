"""What each node's placements commit is kept without summing the node's file again on every
placement: `place` hands the old total plus the new placement to the state. That must be
the very number a sum over the file gives - float for float - after any mix of placements,
ends, drains and re-recorded ports, committed through a real git ledger and read back."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import pytest

from gavel.broker.ledger import state as ledger_state
from gavel.broker.ledger.plan import View, finish, place, record_ports, set_draining, submit
from gavel.broker.ledger.repository import Ledger
from gavel.broker.ledger.state import State, committed_by, compact
from gavel.shared.auction import Awarded
from gavel.shared.award import NodeBid
from gavel.shared.messages import Capacity, Request, Spec
from gavel.shared.messages import InstanceState as S
from gavel.shared.records import Assignment, InstanceRecord, NodeFile

#: Amounts that binary floats cannot hold exactly: a drifting running total shows.
CPUS = (0.01, 0.1, 0.2, 0.3, 0.07, 1.0 / 3)


def _award(iid: str, spec: Spec, node: str) -> Awarded:
    return Awarded(request=Request.of(iid, spec), winner=NodeBid(node_id=node, load=0.5),
                   tie_broken=False, bids=[], declines=[], silent=[])


def _commit(ledger: Ledger, view: View) -> None:
    state = view.state
    for nid, nf in view.change.nodes.items():  # appended to the last commit's JSON or not,
        if nf is not None:  # a node file's bytes are msgspec's for the whole record
            assert view.change.node_compact(nid, nf) == compact(nf), nid
    sha = ledger.write_files(view.change.files(state.flat), "test", state.head)
    ledger.adopt(view.change, state.head, sha)


def _assert_exact(state: State) -> None:
    for nid, nf in state.nodes.items():
        assert state.committed[nid] == committed_by(nf), nid
    assert set(state.committed) == set(state.nodes)


def test_committed_totals_stay_the_sum_of_each_node_file(tmp_path: Path) -> None:
    rng = random.Random(7)
    ledger = Ledger(tmp_path / "state.git")
    nodes = [f"n{k}" for k in range(5)]
    placed: dict[str, str] = {}
    serial = 0
    for _ in range(40):  # commits
        view = View(ledger.state())
        for _ in range(rng.randint(1, 12)):  # plans in one group commit
            roll = rng.random()
            if roll < 0.6 or not placed:
                serial += 1
                iid = f"i{serial}"
                spec = Spec(name="s", command=["true"], cpu=rng.choice(CPUS),
                            memory_mb=rng.randint(1, 300),
                            ports=["http"] if rng.random() < 0.3 else [])
                assert submit(view, InstanceRecord(instance_id=iid, spec=spec))
                node = rng.choice(nodes)
                if place(view, _award(iid, spec, node), "a", range(9000, 9100)) is not None:
                    placed[iid] = node
            elif roll < 0.8:
                iid = rng.choice(sorted(placed))
                assert finish(view, iid, placed.pop(iid), S.SUCCEEDED) is not None
            elif roll < 0.9:
                set_draining(view, rng.choice(nodes), rng.random() < 0.5)
            else:
                iid = rng.choice(sorted(placed))
                record_ports(view, iid, placed[iid], {"http": 9200 + serial}, [9001])
            for nid in view.change.nodes:  # within the batch, too
                nf = view.node(nid)
                assert view.committed(nid) == (committed_by(nf) if nf else Capacity())
        _commit(ledger, view)
        _assert_exact(ledger.state())
    assert placed  # the mix did place things
    fresh = Ledger(tmp_path / "state.git").state()  # summed from the files git holds
    _assert_exact(fresh)
    assert fresh.committed == ledger.state().committed


def test_placements_in_one_view_grow_its_own_copy_never_the_states_record(
        tmp_path: Path) -> None:
    """`broker.plan` rule 4: the first placement a view makes on a node copies the node's
    file, later ones are added to that copy; what the ledger's state holds stays what git
    holds, and the view's encoding follows every placement."""
    ledger = Ledger(tmp_path / "state.git")
    spec = Spec(name="s", command=["true"], cpu=0.1, memory_mb=10)

    def put(view: View, iid: str) -> None:
        assert submit(view, InstanceRecord(instance_id=iid, spec=spec))
        assert place(view, _award(iid, spec, "n1"), "a", range(9000, 9100)) is not None

    view = View(ledger.state())
    put(view, "i1")
    _commit(ledger, view)
    state = ledger.state()
    held = state.nodes["n1"]
    view = View(state)
    for k in (2, 3, 4):
        put(view, f"i{k}")
        seen = msgspec.json.decode(view.change.node_compact("n1", view.node("n1")))
        assert list(seen["instances"]) == [f"i{j}" for j in range(1, k + 1)]
    assert state.nodes["n1"] is held and list(held.instances) == ["i1"]  # untouched
    assert view.committed("n1") == committed_by(view.node("n1"))
    assert set(state.where) == {"i1"} and view.placed_on("i4") == "n1"
    _commit(ledger, view)
    fresh = Ledger(tmp_path / "state.git").state()
    assert list(fresh.nodes["n1"].instances) == ["i1", "i2", "i3", "i4"]
    assert fresh.nodes["n1"] == ledger.state().nodes["n1"]
    _assert_exact(fresh)


@pytest.mark.parametrize("base", [
    NodeFile(node_id="n1", blocked_ports=[9001, 9002]),  # no placements yet
    NodeFile(node_id="n1", instances={f"o{k}": Assignment(
        instance_id=f"o{k}", auction_id="a", cpu=0.5, ports={"h\"ttp": 9000 + k})
        for k in range(2)}),
])
def test_a_node_file_that_only_gained_placements_is_appended_to_byte_for_byte(
        base: NodeFile, monkeypatch: pytest.MonkeyPatch) -> None:
    state = State()
    state.put_node("n1", base)
    state.encoded["n1"] = (base, compact(base))
    view = View(state)
    for k in range(3):
        view.add(view.node("n1") or base, f"i{k}\u00e9",
                 Assignment(instance_id=f"i{k}", auction_id="b", memory_mb=k), Capacity())
    nf = view.node("n1")
    assert nf is not None and list(nf.instances)[-3:] == ["i0\u00e9", "i1\u00e9", "i2\u00e9"]
    whole = compact(nf)

    def no_whole_file(obj: object) -> bytes:  # only the small tail may be encoded anew
        assert not (isinstance(obj, NodeFile) and obj.instances), "encoded the whole file"
        return msgspec.json.encode(obj)

    monkeypatch.setattr(ledger_state, "compact", no_whole_file)
    assert view.change.node_compact("n1", nf) == whole
