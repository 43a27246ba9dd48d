"""The broker's last move commit (`broker.reauction.plan_finish`) as a pure function: a
`View` of an in-memory `State` in, the stop, its line and its effect out."""

from __future__ import annotations

from gavel.broker.ledger.plan import View
from gavel.broker.ledger.state import Change, State
from gavel.broker.reauction import Finished, plan_finish
from gavel.shared.messages import InstanceState as S
from gavel.shared.messages import Spec
from gavel.shared.reasons import Reason
from gavel.shared.records import Assignment, InstanceRecord, NodeFile

SPEC = Spec(name="web", type="service", command=["true"], cpu=0.5, memory_mb=64)


def _view(*, placed: bool = True, state: S = S.RUNNING, **rec: object) -> View:
    st = State(head="h")
    st.put_instance("web-1", InstanceRecord(instance_id="web-1", spec=SPEC, service="web",
                                            version=3, state=state, attempt=1,
                                            **rec))  # type: ignore[arg-type]
    if placed:
        st.put_node("n1", NodeFile(node_id="n1", instances={"web-1": Assignment(
            instance_id="web-1", auction_id="a", attempt=1, cpu=0.5, memory_mb=64)}))
    return View(st, Change())


def test_a_settled_move_marks_the_old_copy_cancelling_and_tells_its_node_after() -> None:
    view = _view()
    planned = plan_finish(view, service="web", new="web-2", stop_id="web-1",
                          reason=Reason.REBALANCED)
    assert planned is not None
    changed = view.change.instances["web-1"]
    assert changed is not None and changed.cancelling and not changed.state.terminal
    assert set(view.change.instances) == {"web-1"}
    assert planned.lines == [f"service web: re-auction stops web-1 on n1: {Reason.REBALANCED}"]
    assert planned.effects == [Finished(new="web-2", stop_id="web-1", node="n1",
                                        reason=Reason.REBALANCED)]


def test_an_abandoned_copy_not_yet_on_a_node_is_cancelled_at_once() -> None:
    view = _view(placed=False, state=S.QUEUED)
    planned = plan_finish(view, service="web", new="web-1", stop_id="web-1",
                          reason=Reason.MOVE_ABANDONED)
    assert planned is not None
    changed = view.change.instances["web-1"]
    assert changed is not None and changed.state is S.CANCELLED
    assert planned.lines == [f"service web: re-auction stops web-1: {Reason.MOVE_ABANDONED}"]
    assert planned.effects == [Finished(new="web-1", stop_id="web-1", node="",
                                        reason=Reason.MOVE_ABANDONED)]


def test_nothing_to_commit_when_the_copy_is_no_longer_live() -> None:
    for view in (_view(cancelling=True), _view(state=S.FAILED)):
        assert plan_finish(view, service="web", new="web-2", stop_id="web-1",
                           reason=Reason.REBALANCED) is None
        assert view.change.instances == {}
