"""Plans are compare-and-swap: two verdicts on one instance in one batch — an expiry and a
late report — resolve to exactly one of them, never to a corrupt mix."""

from __future__ import annotations

from gavel.broker.ledger.plan import View, block_ports, finish, record_ports, requeue, unblock_ports
from gavel.broker.ledger.state import Change, State
from gavel.shared.messages import InstanceState as S
from gavel.shared.messages import Spec
from gavel.shared.reasons import Reason
from gavel.shared.records import Assignment, InstanceRecord, NodeFile

SPEC = Spec(name="svc", command=["true"], attempts=3)


def _placed_state() -> State:
    st = State(head="h")
    st.put_instance("i", InstanceRecord(instance_id="i", spec=SPEC))
    st.put_node("n1", NodeFile(node_id="n1", instances={
        "i": Assignment(instance_id="i", auction_id="a", attempt=1, cpu=SPEC.cpu,
                        memory_mb=SPEC.memory_mb)}))
    return st


def test_expiry_then_late_exit_in_one_batch_applies_only_the_expiry() -> None:
    view = View(_placed_state(), Change())
    assert requeue(view, "i", "n1", Reason.NO_LEASE) is not None
    assert finish(view, "i", "n1", S.SUCCEEDED) is None  # the instance is no longer on n1
    rec = view.change.instances["i"]
    assert rec is not None and rec.state is S.QUEUED and rec.excluded == ("n1",)
    assert view.change.nodes["n1"] is None  # the placement is gone exactly once


def test_late_exit_then_expiry_in_one_batch_applies_only_the_exit() -> None:
    view = View(_placed_state(), Change())
    assert finish(view, "i", "n1", S.SUCCEEDED) is not None
    assert requeue(view, "i", "n1", Reason.NO_LEASE) is None
    rec = view.change.instances["i"]
    assert rec is not None and rec.state is S.SUCCEEDED


def test_a_report_from_another_node_changes_nothing() -> None:
    view = View(_placed_state(), Change())
    assert finish(view, "i", "n2", S.FAILED) is None
    assert requeue(view, "i", "n2", Reason.NO_LEASE) is None
    assert not view.change


def test_unblock_gives_back_only_ports_git_blocks() -> None:
    st = State(head="h")
    st.put_node("n1", NodeFile(node_id="n1", blocked_ports=[5, 6, 7]))
    view = View(st, Change())
    assert unblock_ports(view, "n1", [6, 9]) == [6]  # 9 was never blocked: ignored
    nf = view.change.nodes["n1"]
    assert nf is not None and nf.blocked_ports == [5, 7]
    assert unblock_ports(view, "n1", [6]) == []  # already given back in this batch
    assert unblock_ports(view, "nowhere", [5]) == []
    assert "nowhere" not in view.change.nodes


def test_a_handed_back_instance_still_blocks_the_ports_found_taken() -> None:
    """The node had no other ports to give the instance, so it handed it back: the
    instance leaves (its node file may be left empty), the taken port is blocked there all
    the same - but never a port an instance of the node holds."""
    st = _placed_state()
    awarded = Assignment(instance_id="i", auction_id="a", attempt=1,
                         ports={"http": 8, "admin": 9})
    st.put_node("n1", NodeFile(node_id="n1", instances={"i": awarded}))
    view = View(st, Change())
    assert requeue(view, "i", "n1", Reason.NO_ROOM_PORTS) is not None
    assert view.change.nodes["n1"] is None  # nothing left on it...
    assert block_ports(view, "n1", awarded, [8, 9]) == [8, 9]  # ...but the block is written
    nf = view.change.nodes["n1"]
    assert nf is not None and nf.blocked_ports == [8, 9] and not nf.instances
    assert block_ports(view, "n1", awarded, [9]) == []  # already blocked
    other = View(_placed_state(), Change())
    other.put_node(NodeFile(node_id="n1", instances={
        "j": Assignment(instance_id="j", auction_id="a", ports={"http": 5})}))
    both = Assignment(instance_id="k", auction_id="a", ports={"http": 5, "admin": 6})
    assert block_ports(other, "n1", both, [5, 6]) == [6]  # 5 is an instance's: not blocked


def test_recorded_ports_block_only_what_the_instance_was_awarded() -> None:
    st = _placed_state()
    st.put_node("n1", NodeFile(node_id="n1", instances={
        "i": Assignment(instance_id="i", auction_id="a", attempt=1, ports={"http": 7})}))
    view = View(st, Change())
    assert record_ports(view, "i", "n1", {"http": 9}, [7, 8]) is not None
    nf = view.change.nodes["n1"]
    assert nf is not None and nf.blocked_ports == [7]  # 8 was never this instance's
    assert nf.instances["i"].ports == {"http": 9}


def test_an_award_to_a_node_drained_in_the_same_batch_is_not_placed() -> None:
    """A drain committed after the round opened: the award finds node.json draining and the
    instance stays pending for the next round (the node may not know it is draining)."""
    from gavel.broker.ledger.plan import place, set_draining
    from gavel.shared.auction import Awarded, NodeBid
    from gavel.shared.messages import Request

    st = State(head="h")
    st.put_instance("j", InstanceRecord(instance_id="j", spec=SPEC))
    st.put_node("n1", NodeFile(node_id="n1"))
    view = View(st, Change())
    award = Awarded(request=Request.of("j", SPEC), tie_broken=False, bids=[], declines=[],
                    silent=[], winner=NodeBid(node_id="n1", load=0.0))
    assert set_draining(view, "n1", True) is not None
    assert place(view, award, "a1", [20000, 20099]) is None
    assert view.change.instances.get("j") is None  # still pending, untouched
    nf = view.change.nodes["n1"]
    assert nf is not None and nf.draining and nf.instances == {}
    # The broker's state knows which nodes are draining, for the auctions' candidates.
    st.put_node("n1", nf)
    assert st.draining == {"n1"}
    st.put_node("n1", NodeFile(node_id="n1"))
    assert st.draining == set()
