"""The award as a pure plan (`broker.awardplan`): a closed auction's decisions on a `View` of
an in-memory `State` in, the change and its effects out - no committer, no writer, no NATS,
no clock."""

from __future__ import annotations

from gavel.broker.awardplan import NotPlaced, Placed, Waits, plan_award, winner_ports
from gavel.broker.effects import Emit, Publish, Release
from gavel.broker.ledger.plan import View
from gavel.broker.ledger.state import Change, State
from gavel.shared import subjects
from gavel.shared.auction import Auction, Awarded, Decision, Unschedulable
from gavel.shared.award import NodeBid
from gavel.shared.messages import Cancel, EventType, Heartbeat, Request, Spec, Victim
from gavel.shared.messages import InstanceState as S
from gavel.shared.reasons import Reason
from gavel.shared.records import Assignment, InstanceRecord, NodeFile, parse_trailers

EPOCH = 3
ROUND_S = 0.012
WEB = Spec(name="web", command=["true"], ports=["http"])
JOB = Spec(name="job", command=["true"])


def _view(*records: InstanceRecord, draining: bool = False) -> View:
    st = State(head="h")
    for rec in records:
        st.put_instance(rec.instance_id, rec)
    st.put_node("n1", NodeFile(node_id="n1"))
    st.put_node("n2", NodeFile(node_id="n2", draining=draining))
    return View(st, Change())


def _awarded(iid: str, spec: Spec, node: str, displaced: tuple[Victim, ...] = ()) -> Awarded:
    return Awarded(request=Request.of(iid, spec), winner=NodeBid(node_id=node, load=0.25),
                   tie_broken=False, bids=[NodeBid(node_id=node, load=0.25)], declines=[],
                   silent=[], displaced=displaced)


def _waits(iid: str, summary: str = "0/2 nodes bid: 2 no room for 1.0 cpu") -> Unschedulable:
    return Unschedulable(request=Request.of(iid, JOB), reason=Reason.ALL_FULL, summary=summary,
                         bids=[], declines=[], silent=[])


def _auction(decisions: list[Decision]) -> Auction:
    return Auction("a1", [d.request for d in decisions], {"n1", "n2"}, 0.0, 1.0)


HEARTBEATS = {"n1": Heartbeat(node_id="n1", seq=1, port_range=[20000, 20009])}


def test_a_batch_says_what_each_decision_came_to_in_order() -> None:
    """Placed with its attempt, NotPlaced for a node drained since the round opened, and an
    instance that waits - its event only when its record says something new."""
    old = _waits("old")
    view = _view(InstanceRecord(instance_id="web-1", spec=WEB),
                 InstanceRecord(instance_id="job-1", spec=JOB),
                 InstanceRecord(instance_id="new", spec=JOB),
                 InstanceRecord(instance_id="old", spec=JOB, state=S.UNSCHEDULABLE,
                                reason=old.reason, detail=old.summary),
                 draining=True)
    placed, drained = _awarded("web-1", WEB, "n1"), _awarded("job-1", JOB, "n2")
    new = _waits("new")
    decisions: list[Decision] = [placed, drained, new, old]
    planned = plan_award(view, _auction(decisions), decisions, ROUND_S,
                         ports=winner_ports(decisions, HEARTBEATS), epoch=EPOCH)
    assert planned.effects == [Placed(placed, "a1", 1, ROUND_S), NotPlaced(drained),
                               Waits(new, "a1", True), Waits(old, "a1", False)]
    assert planned.lines[1:] == ["unschedulable new: 0/2 nodes bid: 2 no room for 1.0 cpu"]
    assert planned.lines[0].startswith("place web-1 on n1")
    nf = view.change.nodes["n1"]
    assert nf is not None and nf.instances["web-1"].ports == {"http": 20000}  # its heartbeat's
    assert "n2" not in view.change.nodes and "job-1" not in view.change.instances
    rec = view.change.instances["new"]
    assert rec is not None and rec.state is S.UNSCHEDULABLE
    assert "old" not in view.change.instances  # nothing new to write
    [trailer] = planned.trailers
    assert [(r.instance_id, r.winner) for r in parse_trailers(trailer)] == [
        ("web-1", "n1"), ("new", "")]


def test_a_displacing_award_tells_its_victims_first_then_lands() -> None:
    low = Spec(name="low", command=["true"], priority=10, cpu=1.0)
    urgent = Spec(name="urgent", command=["true"], priority=80, cpu=1.0)
    view = _view(InstanceRecord(instance_id="low-1", spec=low, attempt=1),
                 InstanceRecord(instance_id="urgent-1", spec=urgent))
    view.state.put_node("n1", NodeFile(node_id="n1", instances={
        "low-1": Assignment(instance_id="low-1", auction_id="a0", attempt=1, cpu=1.0)}))
    award = _awarded("urgent-1", urgent, "n1",
                     (Victim(instance_id="low-1", priority=10, cpu=1.0),))
    planned = plan_award(view, _auction([award]), [award], ROUND_S, ports={},
                         epoch=EPOCH)
    assert planned.effects == [
        Publish(subjects.CANCEL.format(node="n1"),
                Cancel(instance_id="low-1", node_id="n1", epoch=EPOCH, attempt=1)),
        Release("low-1"),
        Emit("low-1", EventType.PREEMPTED, node_id="n1", reason=Reason.PREEMPTED,
             detail="urgent-1 (priority 80)"),
        Placed(award, "a1", 1, ROUND_S)]
    assert planned.lines[0] == "preempt low-1 on n1 for urgent-1"
    nf = view.change.nodes["n1"]
    assert nf is not None and list(nf.instances) == ["urgent-1"]


def test_an_award_whose_victims_cannot_leave_changes_nothing() -> None:
    urgent = Spec(name="urgent", command=["true"], priority=80, cpu=1.0)
    view = _view(InstanceRecord(instance_id="urgent-1", spec=urgent))
    award = _awarded("urgent-1", urgent, "n1",
                     (Victim(instance_id="gone-1", priority=10, cpu=1.0),))
    planned = plan_award(view, _auction([award]), [award], ROUND_S, ports={},
                         epoch=EPOCH)
    assert planned.effects == [NotPlaced(award)]
    assert planned.lines == [] and planned.trailers == []
    assert not view.change


# -- what the plan reads is given (`broker.awardplan` rule 6) ------------------------------
def test_a_winner_takes_its_ports_from_the_range_it_is_given() -> None:
    """The port range is an argument: the same award on the same view lands on the range
    given, and a winner given none takes no work that asks for ports."""
    award = _awarded("web-1", WEB, "n1")
    for given, port in (([30000, 30009], 30000), ([20005, 20009], 20005)):
        view = _view(InstanceRecord(instance_id="web-1", spec=WEB))
        planned = plan_award(view, _auction([award]), [award], ROUND_S,
                             ports={"n1": given}, epoch=EPOCH)
        nf = view.change.nodes["n1"]
        assert nf is not None and nf.instances["web-1"].ports == {"http": port}
        assert planned.effects == [Placed(award, "a1", 1, ROUND_S)]
    view = _view(InstanceRecord(instance_id="web-1", spec=WEB))
    assert plan_award(view, _auction([award]), [award], ROUND_S, ports={},
                      epoch=EPOCH).effects == [NotPlaced(award)]


def test_the_winners_ports_are_gathered_once_each_from_the_heartbeats() -> None:
    decisions: list[Decision] = [_awarded("web-1", WEB, "n1"), _awarded("web-2", WEB, "n1"),
                                 _awarded("job-1", JOB, "n2"), _waits("new")]
    assert winner_ports(decisions, HEARTBEATS) == {"n1": [20000, 20009], "n2": ()}
