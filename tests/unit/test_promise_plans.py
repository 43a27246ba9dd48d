"""The promises' plans as pure functions: a `View` of an in-memory `State` in, the change and
its effects out — no committer, no writer, no NATS. The lifecycle edges an operator sees
(the attempt budget spent -> ``lost`` or ``failed``, an offline node's instance re-queued or
``lost``, a revoke, a timeout, an overruled cancel) are pinned here at the plan."""

from __future__ import annotations

import msgspec

from gavel.broker.effects import Arm, Emit, Publish, Release, Timer
from gavel.broker.ledger.plan import View
from gavel.broker.ledger.state import Change, State
from gavel.broker.promiseplans import (
    plan_action,
    plan_cancel,
    plan_end,
    plan_requeue,
    plan_retry,
)
from gavel.broker.watchdog import Action, Kind
from gavel.shared import subjects
from gavel.shared.messages import Cancel, Event, EventType, Spec
from gavel.shared.messages import InstanceState as S
from gavel.shared.reasons import Reason
from gavel.shared.records import Assignment, InstanceRecord, NodeFile

EPOCH = 7


def _placed(attempt: int = 1, attempts: int = 3, **rec: object) -> View:
    """Instance ``i``, attempt `attempt` of `attempts`, placed on ``n1``."""
    spec = Spec(name="svc", command=["true"], attempts=attempts)
    st = State(head="h")
    st.put_instance("i", InstanceRecord(instance_id="i", spec=spec,
                                        attempt=attempt, **rec))  # type: ignore[arg-type]
    st.put_node("n1", NodeFile(node_id="n1", instances={
        "i": Assignment(instance_id="i", auction_id="a", attempt=attempt, cpu=spec.cpu,
                        memory_mb=spec.memory_mb)}))
    return View(st, Change())


def _record(view: View) -> InstanceRecord:
    rec = view.change.instances["i"]
    assert rec is not None
    return rec


def _stop(attempt: int = 1) -> Publish:
    return Publish(subjects.CANCEL.format(node="n1"),
                   Cancel(instance_id="i", node_id="n1", epoch=EPOCH, attempt=attempt))


# -- offline: the lease expired -------------------------------------------------------------

def test_offline_with_attempts_left_requeues_without_the_node_and_says_nothing_yet() -> None:
    view = _placed(attempt=1)
    planned = plan_action(view, Action(Kind.EXPIRE, "i", "n1"), EPOCH)
    assert planned is not None
    rec = _record(view)
    assert (rec.state, rec.reason, rec.excluded) == (S.QUEUED, Reason.NO_LEASE, ("n1",))
    assert view.change.nodes["n1"] is None  # the placement is gone
    assert planned.lines == [f"requeue i off n1: {Reason.NO_LEASE}"]
    # its hold is released; its next auction speaks for it; an offline node is not told
    assert planned.effects == [Release("i")]


def test_offline_with_the_attempt_budget_spent_is_lost_with_a_reason() -> None:
    view = _placed(attempt=3, attempts=3)
    planned = plan_action(view, Action(Kind.EXPIRE, "i", "n1"), EPOCH)
    assert planned is not None
    rec = _record(view)
    assert (rec.state, rec.reason) == (S.LOST, Reason.NO_LEASE)
    assert rec.detail == f"{Reason.ATTEMPTS_EXHAUSTED} (3/3)"
    assert planned.effects == [Release("i"), Emit("i", EventType.LOST, node_id="n1",
                                                  reason=Reason.NO_LEASE, detail=rec.detail)]


def test_a_retryable_failure_with_the_budget_spent_fails_and_frees_nothing_twice() -> None:
    view = _placed(attempt=2, attempts=2)
    planned = plan_requeue(view, "i", "n1", Reason.DRIVER_FAILED, "no such file")
    assert planned is not None
    rec = _record(view)
    assert rec.state is S.FAILED and rec.detail == \
        f"{Reason.ATTEMPTS_EXHAUSTED} (2/2): no such file"
    assert planned.effects == [Release("i"), Emit("i", EventType.FAILED, node_id="n1",
                                                  reason=Reason.DRIVER_FAILED,
                                                  detail=rec.detail)]
    assert plan_requeue(view, "i", "n1", Reason.DRIVER_FAILED) is None  # compare-and-swap


def test_a_free_requeue_gives_the_attempt_back() -> None:
    view = _placed(attempt=3, attempts=3)
    planned = plan_requeue(view, "i", "n1", Reason.MIGRATED, free=True, stop=True,
                           epoch=EPOCH)
    assert planned is not None
    rec = _record(view)
    assert (rec.state, rec.attempt) == (S.QUEUED, 2)
    assert planned.effects == [_stop(attempt=3), Release("i")]  # the node stops its copy


# -- the provisioning deadline and the spec's timeout ----------------------------------------

def test_a_revoked_award_tells_the_node_to_stop_that_attempt_before_anything_else() -> None:
    view = _placed(attempt=2)
    planned = plan_action(view, Action(Kind.REVOKE, "i", "n1"), EPOCH)
    assert planned is not None and _record(view).state is S.QUEUED
    assert planned.effects == [_stop(attempt=2), Release("i")]


def test_a_timeout_fails_the_instance_and_stops_it() -> None:
    view = _placed()
    planned = plan_action(view, Action(Kind.TIMEOUT, "i", "n1"), EPOCH)
    assert planned is not None and _record(view).state is S.FAILED
    assert planned.effects == [_stop(), Release("i"),
                               Emit("i", EventType.FAILED, node_id="n1",
                                    reason=Reason.TIMEOUT)]


# -- cancel ---------------------------------------------------------------------------------

def test_a_cancel_of_a_placed_instance_arms_the_grace_then_tells_the_node() -> None:
    view = _placed(attempt=2)
    planned = plan_cancel(view, "i", "n1", EPOCH)
    assert planned is not None and _record(view).cancelling
    assert planned.effects == [Arm(Timer.CANCEL_GRACE, "i", "n1"), _stop(attempt=2)]
    assert plan_cancel(view, "i", "n1", EPOCH) is None  # already cancelling


def test_an_unanswered_cancel_is_overruled_keeping_why_it_was_asked() -> None:
    view = _placed(cancelling=True, reason=Reason.SCALED_DOWN)
    planned = plan_action(view, Action(Kind.CANCEL_EXPIRED, "i", "n1"), EPOCH)
    assert planned is not None
    rec = _record(view)
    assert (rec.state, rec.reason, rec.detail) == (
        S.CANCELLED, Reason.CANCEL_UNANSWERED, Reason.SCALED_DOWN)
    assert planned.effects == [Release("i"), Emit("i", EventType.CANCELLED, node_id="n1",
                                                  reason=Reason.CANCEL_UNANSWERED)]


def test_a_cancel_of_a_queued_instance_ends_it_at_once() -> None:
    st = State(head="h")
    st.put_instance("q", InstanceRecord(instance_id="q", spec=Spec(name="s", command=["x"])))
    view = View(st, Change())
    planned = plan_cancel(view, "q", None)
    assert planned is not None
    assert planned.effects == [Emit("q", EventType.CANCELLED, reason=Reason.CANCELLED)]


# -- the node's own reports ------------------------------------------------------------------

def test_a_reported_end_releases_the_hold_and_a_late_attempts_end_changes_nothing() -> None:
    view = _placed(attempt=2)
    late = Event(instance_id="i", type=EventType.EXITED, node_id="n1", exit_code=1, attempt=1)
    assert plan_end(view, late, S.FAILED) is None and not view.change
    now = msgspec.structs.replace(late, attempt=2)
    planned = plan_end(view, now, S.FAILED)
    assert planned is not None and planned.effects == [Release("i")]
    assert planned.lines == ["failed i on n1 (exit 1)"]
    assert _record(view).reason == Reason.EXITED_NONZERO


def test_a_retryable_failure_requeues_only_the_attempt_it_names() -> None:
    """`plan_retry`: the report's attempt is checked on the plan's own view; one of its
    worker stopping spends no attempt."""
    failed = Event(instance_id="i", type=EventType.FAILED, node_id="n1", attempt=1,
                   reason=Reason.DRIVER_FAILED, detail="no such file")
    view = _placed(attempt=2)
    assert plan_retry(view, failed) is None and not view.change  # placed again since
    view = _placed(attempt=1, attempts=3)
    planned = plan_retry(view, failed)
    assert planned is not None and planned.effects == [Release("i")]
    rec = _record(view)
    assert (rec.state, rec.reason, rec.attempt) == (S.QUEUED, Reason.DRIVER_FAILED, 1)
    last = msgspec.structs.replace(failed, attempt=3)
    stopped = msgspec.structs.replace(last, reason=Reason.WORKER_STOPPED, detail="")
    view = _placed(attempt=3, attempts=3)
    planned = plan_retry(view, stopped)
    assert planned is not None and _record(view).state is S.QUEUED  # not its fault
    view = _placed(attempt=3, attempts=3)
    assert plan_retry(view, last) is not None and _record(view).state is S.FAILED


def test_a_migration_tells_the_node_to_stop_in_the_epoch_it_is_given() -> None:
    for epoch in (EPOCH, EPOCH + 1):
        view = _placed(attempt=1)
        planned = plan_requeue(view, "i", "n1", Reason.MIGRATED, free=True, stop=True,
                               epoch=epoch)
        assert planned is not None and planned.effects == [
            Publish(subjects.CANCEL.format(node="n1"),
                    Cancel(instance_id="i", node_id="n1", epoch=epoch, attempt=1)),
            Release("i")]
