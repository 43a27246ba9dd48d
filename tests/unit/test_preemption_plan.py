"""The commit of a displacing award as a pure plan (`broker.preemptions`): the victims leave
with the award in one change, re-queued with the fixed reason, or nothing changes; `status`
shows who preempted a waiting instance."""

from __future__ import annotations

import msgspec

from gavel.broker.effects import Emit, Publish, Release
from gavel.broker.ledger.plan import View, place
from gavel.broker.ledger.state import Change, State
from gavel.broker.preemptions import plan_evictions
from gavel.cli.readouts import reason_cell
from gavel.shared import subjects
from gavel.shared.api import InstanceStatus
from gavel.shared.auction import Awarded
from gavel.shared.award import NodeBid
from gavel.shared.messages import Cancel, EventType, Request, Spec, Victim
from gavel.shared.messages import InstanceState as S
from gavel.shared.reasons import Reason, preempted_by
from gavel.shared.records import Assignment, InstanceRecord, NodeFile

EPOCH = 3


def _state(low_priority: int = 10) -> View:
    """``low`` (priority `low_priority`, attempt 1 of 3) placed on ``n1``; ``urgent``
    (priority 80) queued."""
    low = Spec(name="low", command=["true"], priority=low_priority, cpu=1.0)
    urgent = Spec(name="urgent", command=["true"], priority=80, cpu=1.0)
    st = State(head="h")
    st.put_instance("low-1", InstanceRecord(instance_id="low-1", spec=low, attempt=1))
    st.put_instance("urgent-1", InstanceRecord(instance_id="urgent-1", spec=urgent))
    st.put_node("n1", NodeFile(node_id="n1", instances={
        "low-1": Assignment(instance_id="low-1", auction_id="a0", attempt=1, cpu=1.0,
                            memory_mb=64)}))
    return View(st, Change())


def _award(priority_claimed: int = 10) -> Awarded:
    urgent = Request.of("urgent-1", Spec(name="urgent", command=["true"], priority=80,
                                         cpu=1.0))
    return Awarded(request=urgent, winner=NodeBid(node_id="n1", load=0.2), tie_broken=False,
                   bids=[], declines=[], silent=[],
                   displaced=[Victim(instance_id="low-1", priority=priority_claimed, cpu=1.0,
                                     memory_mb=64)])


def test_the_victim_is_requeued_with_the_reason_and_its_node_told_to_stop_it() -> None:
    view = _state()
    planned = plan_evictions(view, _award(), [], EPOCH)
    assert planned is not None
    low = view.change.instances["low-1"]
    assert low is not None
    assert (low.state, low.reason, low.detail) == (
        S.QUEUED, Reason.PREEMPTED, "urgent-1 (priority 80)")
    assert low.attempt == 0  # the attempt is given back: being preempted is no failure
    assert low.excluded == ("n1",)
    assert planned.lines == ["preempt low-1 on n1 for urgent-1"]
    assert planned.effects == [
        Publish(subjects.CANCEL.format(node="n1"),
                Cancel(instance_id="low-1", node_id="n1", epoch=EPOCH, attempt=1)),
        Release("low-1"),
        Emit("low-1", EventType.PREEMPTED, node_id="n1", reason=Reason.PREEMPTED,
             detail="urgent-1 (priority 80)")]
    assert place(view, _award(), "a1", []) is not None  # the award lands in the same change
    nf = view.change.nodes["n1"]
    assert nf is not None and list(nf.instances) == ["urgent-1"]


def test_the_nodes_word_is_not_taken_for_the_victims_priority() -> None:
    view = _state(low_priority=75)  # git says 75: not 10 below 80, whatever the node says
    assert plan_evictions(view, _award(priority_claimed=10), [], EPOCH) is None
    assert not view.change.instances and not view.change.nodes


def test_a_system_jobs_instance_is_never_a_victim() -> None:
    view = _state()
    rec = view.state.instances["low-1"]
    view.state.put_instance("low-1", msgspec.structs.replace(rec, only_node="n1"))
    assert plan_evictions(view, _award(), [], EPOCH) is None


def test_a_victim_no_longer_there_spoils_the_award_and_nothing_changes() -> None:
    view = _state()
    view.state.put_node("n1", NodeFile(node_id="n1"))
    assert plan_evictions(view, _award(), [], EPOCH) is None
    assert not view.change.instances


def test_no_eviction_for_an_award_that_could_not_be_placed() -> None:
    view = _state()
    st = view.state
    rec = st.instances["urgent-1"]
    st.put_instance("urgent-1", InstanceRecord(instance_id="urgent-1", spec=rec.spec,
                                               state=S.CANCELLED))
    assert plan_evictions(view, _award(), [], EPOCH) is None
    assert not view.change.instances


def test_status_shows_who_preempted_a_waiting_instance() -> None:
    waiting = InstanceStatus(instance_id="low-1", name="low", state="queued",
                             reason=Reason.PREEMPTED, detail=preempted_by("urgent-1", 80))
    assert reason_cell(waiting) == "preempted by urgent-1 (priority 80)"
    stuck = InstanceStatus(instance_id="low-1", name="low", state="unschedulable",
                           reason=Reason.ALL_FULL, detail="0/1 nodes bid: 1 no room for 1 cpu")
    assert reason_cell(stuck) == "0/1 nodes bid: 1 no room for 1 cpu"
