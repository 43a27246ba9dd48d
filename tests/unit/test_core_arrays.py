"""Batch arrays in memory (`gavel.shared.arrays`): how many held tasks to release now, which
first, the failure budget and the outcome; the spec's array fields refused with a sentence
naming the field; the ledger never offers a held task to an auction."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import msgspec
import pytest

from gavel.broker.ledger.plan import View, release
from gavel.broker.ledger.state import State
from gavel.broker.retention import due
from gavel.shared.arrays import DEFAULT_MAX_FAILURES, tally, to_release
from gavel.shared.arrays import release as how_many
from gavel.shared.messages import InstanceState as S
from gavel.shared.records import InstanceRecord
from gavel.shared.spec import Spec


def spec(**kw: object) -> Spec:
    return msgspec.convert({"name": "arr", "command": ["true"], **kw}, Spec)


def task(k: int, sp: Spec, state: S = S.QUEUED, held: bool = False, reason: str = "",
         ended_at: str = "") -> InstanceRecord:
    return InstanceRecord(instance_id=f"arr-{k}", spec=sp, state=state, held=held,
                          array="arr", reason=reason, ended_at=ended_at)


def test_only_parallelism_many_run_and_each_end_frees_one_slot() -> None:
    sp = spec(count=5, parallelism=2)
    tasks = [task(1, sp, S.RUNNING), task(2, sp, S.PLACED)] + [
        task(k, sp, held=True) for k in (3, 4, 5)]
    t = tally(sp, tasks)
    assert (t.running, t.held, how_many(t)) == (2, 3, 0)
    tasks[0] = task(1, sp, S.SUCCEEDED)
    t = tally(sp, tasks)
    assert (t.succeeded, t.running, how_many(t)) == (1, 1, 1)
    tasks[1] = task(2, sp, S.SUCCEEDED)
    assert how_many(tally(sp, tasks)) == 2


def test_no_parallelism_means_all_at_once_and_the_last_slots_are_only_what_is_held() -> None:
    sp = spec(count=4)
    t = tally(sp, [task(k, sp, S.SUCCEEDED) for k in (1, 2, 3)] + [task(4, sp, held=True)])
    assert t.parallelism == 4 and how_many(t) == 1


def test_the_lowest_index_goes_first() -> None:
    assert to_release(["arr-10", "arr-2", "arr-3"], 2) == ["arr-2", "arr-3"]
    assert to_release(["arr-2"], 0) == []


def test_a_failure_past_the_budget_releases_nothing_and_names_the_first_failure() -> None:
    assert DEFAULT_MAX_FAILURES == 0
    sp = spec(count=4, parallelism=2)
    tasks = [task(1, sp, S.FAILED, reason="process exited with a non-zero status",
                  ended_at="2026-01-01T00:00:02.000Z"),
             task(2, sp, S.LOST, reason="lease expired: node offline",
                  ended_at="2026-01-01T00:00:01.000Z"),
             task(3, sp, held=True), task(4, sp, held=True)]
    t = tally(sp, tasks)
    assert t.spent and how_many(t) == 0 and not t.ended
    assert t.first_failure == "arr-2: lease expired: node offline"  # the earliest end
    tasks[2:] = [task(3, sp, S.CANCELLED), task(4, sp, S.CANCELLED)]
    t = tally(sp, tasks)
    assert t.ended and not t.ok
    assert t.outcome() == ("0/4 succeeded, 2 failed (first: arr-2: lease expired: node "
                           "offline), 2 cancelled")


def test_within_the_budget_the_array_goes_on() -> None:
    sp = spec(count=3, parallelism=1, max_failures=1)
    t = tally(sp, [task(1, sp, S.FAILED), task(2, sp, held=True), task(3, sp, held=True)])
    assert not t.spent and how_many(t) == 1


def test_an_array_that_all_succeeded_is_ok() -> None:
    sp = spec(count=2, parallelism=1)
    t = tally(sp, [task(1, sp, S.SUCCEEDED), task(2, sp, S.SUCCEEDED)])
    assert t.ended and t.ok and t.outcome() == "2/2 succeeded"


@pytest.mark.parametrize(("fields", "words"), [
    ({"parallelism": 0}, "parallelism 0 is out of range: 1 .. 100000"),
    ({"parallelism": -3}, "parallelism -3 is out of range: 1 .. 100000"),
    ({"max_failures": -1}, "max_failures -1 is out of range: 0 .. 100000"),
    ({"type": "service", "parallelism": 2},
     "parallelism applies to a job's batch array (type = \"job\"), not to a service"),
    ({"type": "service", "max_failures": 2},
     "max_failures applies to a job's batch array (type = \"job\"), not to a service"),
])
def test_bad_array_fields_are_refused_naming_the_field(fields: dict[str, object],
                                                       words: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=re.escape(words)):
        spec(**fields)


def test_a_held_task_is_never_pending_until_it_is_released() -> None:
    sp = spec(count=2, parallelism=1)
    st = State()
    st.put_instance("arr-1", task(1, sp))
    st.put_instance("arr-2", task(2, sp, held=True))
    assert list(st.pending) == ["arr-1"]
    assert [r.instance_id for r in st.tasks_of("arr")] == ["arr-1", "arr-2"]
    view = View(st)
    got = release(view, "arr-2")
    assert got is not None and not got.held
    assert release(view, "arr-1") is None  # not held: nothing to release
    st.put_instance("arr-2", got)
    assert list(st.pending) == ["arr-1", "arr-2"]


def test_retention_keeps_the_ended_tasks_of_an_array_still_running() -> None:
    sp = spec(count=3, parallelism=1)
    st = State()
    old = "2026-01-01T00:00:00.000Z"
    st.put_instance("arr-1", task(1, sp, S.SUCCEEDED, ended_at=old))
    st.put_instance("lone", InstanceRecord(instance_id="lone", spec=spec(), state=S.FAILED,
                                           ended_at=old))
    st.put_instance("arr-2", task(2, sp, S.RUNNING))
    st.put_instance("arr-3", task(3, sp, held=True))
    now = datetime(2026, 6, 1, tzinfo=UTC)
    assert [iid for iid, _, _ in due(st, now, 60.0, {})] == ["lone"]
    st.put_instance("arr-2", task(2, sp, S.SUCCEEDED, ended_at=old))
    st.put_instance("arr-3", task(3, sp, S.SUCCEEDED, ended_at=old))
    assert sorted(iid for iid, _, _ in due(st, now, 60.0, {})) == [
        "arr-1", "arr-2", "arr-3", "lone"]


def test_a_retention_walk_reads_each_array_once_not_once_a_task(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether an array still runs is a look at its every task: asked once for each of its
    ended tasks, a walk over arrays of 1,000 cost a million reads (a quarter of a loaded
    broker's time in a closed loop of batch arrays)."""
    old = "2026-01-01T00:00:00.000Z"
    st = State()
    for name, last in (("a", S.RUNNING), ("b", S.SUCCEEDED), ("c", S.RUNNING)):
        sp = spec(count=50, parallelism=50)
        for k in range(1, 51):
            state = S.SUCCEEDED if k < 50 else last
            st.put_instance(f"{name}-{k}", InstanceRecord(
                instance_id=f"{name}-{k}", spec=sp, state=state, array=name,
                ended_at=old if state.terminal else ""))
    reads: list[str] = []
    tasks_of = State.tasks_of
    monkeypatch.setattr(State, "tasks_of", lambda self, array: reads.append(array) or
                        tasks_of(self, array))
    got = due(st, datetime(2026, 6, 1, tzinfo=UTC), 60.0, {})
    assert sorted(iid for iid, _, _ in got) == sorted(f"b-{k}" for k in range(1, 51))
    assert sorted(reads) == ["a", "b", "c"]


def test_a_failed_task_runs_again_while_the_budget_holds_and_the_retry_counts_for_it() -> None:
    sp = spec(count=2, parallelism=1, max_failures=1)
    tasks = [task(1, sp, S.FAILED, reason="process exited with a non-zero status"),
             task(2, sp, held=True)]
    t = tally(sp, tasks, "arr")
    assert t.retries == ("arr-1-r2",) and t.failed == 1 and not t.ended
    retry = InstanceRecord(instance_id="arr-1-r2", spec=sp, array="arr", held=True)
    t = tally(sp, [*tasks, retry], "arr")
    assert (t.failed, t.held, t.retries, how_many(t)) == (0, 2, (), 1)
    assert to_release(["arr-2", "arr-1-r2"], 1) == ["arr-1-r2"]  # in its task's place
    done = [msgspec.structs.replace(retry, held=False, state=S.SUCCEEDED),
            task(2, sp, S.SUCCEEDED)]
    t = tally(sp, [tasks[0], *done], "arr")
    assert t.ok and t.failures == 1 and t.outcome() == "2/2 succeeded"


def test_past_the_budget_a_failed_task_is_not_run_again() -> None:
    sp = spec(count=2, parallelism=2, max_failures=1)
    tasks = [task(1, sp, S.FAILED), InstanceRecord(instance_id="arr-1-r2", spec=sp,
                                                  array="arr", state=S.FAILED),
             task(2, sp, S.SUCCEEDED)]
    t = tally(sp, tasks, "arr")
    assert t.spent and t.retries == () and t.ended and not t.ok
    assert t.failed == 1 and t.failures == 2


def test_the_state_counts_each_arrays_tasks_by_kind_and_keeps_its_held_in_index_order() -> None:
    sp = spec(count=3, parallelism=1)
    st = State()
    for k in (3, 1, 2):  # read in path order, not index order
        st.put_instance(f"arr-{k}", task(k, sp, held=k > 1))
    st.order_ended()
    assert st.array_kinds["arr"] == {"live": 0, "held": 2} | {"live": 1}
    assert list(st.array_held["arr"]) == ["arr-2", "arr-3"]
    st.put_instance("arr-1", task(1, sp, S.SUCCEEDED))
    st.put_instance("arr-2", task(2, sp))  # released
    assert st.array_kinds["arr"] == {"live": 1, "held": 1, "succeeded": 1}
    assert list(st.array_held["arr"]) == ["arr-3"]
