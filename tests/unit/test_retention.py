"""Retention of ended instances, in memory and against a real git ledger: the end is stamped
by the commit that records it, the oldest ended records past the window are found without a
scan of every instance, and a forget commit removes them from the tree (not from history)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pygit2
import pytest

from gavel.broker.ledger.committer import Committer, Item, Planned
from gavel.broker.ledger.plan import View, forget, submit
from gavel.broker.ledger.repository import Ledger, State, parse_stamp, stamp
from gavel.broker.retention import Forgotten, due, plan_forget
from gavel.shared.messages import InstanceState as S
from gavel.shared.messages import Spec
from gavel.shared.reasons import Reason
from gavel.shared.records import InstanceRecord, instance_path

SPEC = Spec(name="s", command=["true"])
T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


def _rec(iid: str, state: S = S.SUCCEEDED, at: datetime | None = None) -> InstanceRecord:
    return InstanceRecord(instance_id=iid, spec=SPEC, state=state,
                          ended_at="" if at is None else stamp(at))


def _state(*recs: InstanceRecord) -> State:
    st = State()
    for r in recs:
        st.put_instance(r.instance_id, r)
    return st


def test_state_keeps_ended_instances_in_end_order_and_drops_the_rest() -> None:
    st = _state(_rec("a", S.QUEUED), _rec("b", at=T0), _rec("c", S.FAILED, T0))
    assert list(st.ended) == ["b", "c"]
    st.put_instance("b", None)
    st.put_instance("a", _rec("a", S.CANCELLED, T0))
    assert list(st.ended) == ["c", "a"]
    # A full read comes in path order; ordering puts stamped records oldest first, then the
    # unstamped ones (timed from when the broker read them).
    st = _state(_rec("x", at=T0 + timedelta(seconds=5)), _rec("y"), _rec("z", at=T0))
    st.order_ended()
    assert list(st.ended) == ["z", "x", "y"]


def test_due_takes_the_oldest_past_the_window_and_stops_at_the_first_inside() -> None:
    recs = [_rec(f"i{k}", at=T0 + timedelta(seconds=k)) for k in range(10)]
    st = _state(*recs, _rec("q", S.RUNNING))
    now = T0 + timedelta(seconds=104.5)  # window 100 s: i0..i4 ended at or before now-100
    assert [d[0] for d in due(st, now, 100.0, {})] == ["i0", "i1", "i2", "i3", "i4"]
    assert [d[0] for d in due(st, now, 100.0, {}, limit=2)] == ["i0", "i1"]
    assert due(st, now, 0.0, {}) == []  # 0: keep for ever
    assert due(st, T0, 100.0, {}) == []
    assert due(st, now, 100.0, {})[0] == ("i0", "2026-11-29T12:00:00.000Z",
                                          Reason.RETAINED)  # judged by its stamp


def test_beyond_the_count_the_oldest_go_whatever_their_age() -> None:
    st = _state(*[_rec(f"i{k}", at=T0 + timedelta(seconds=k)) for k in range(10)],
                _rec("live", S.RUNNING))
    # Keep 7: the three oldest go at once (no window), the rest stay.
    got = due(st, T0, 0.0, {}, keep_max=7)
    assert [(d[0], d[2]) for d in got] == [(f"i{k}", Reason.RETAINED_MAX) for k in range(3)]
    # With a window as well: the count takes the oldest, the window the next ones.
    got = due(st, T0 + timedelta(seconds=105.5), 100.0, {}, keep_max=8)
    assert [(d[0], d[2]) for d in got] == [("i0", Reason.RETAINED_MAX),
                                          ("i1", Reason.RETAINED_MAX),
                                          *[(f"i{k}", Reason.RETAINED) for k in range(2, 6)]]
    assert due(st, T0, 0.0, {}, keep_max=10) == []  # within the count, no window: keep
    assert len(due(st, T0, 0.0, {}, keep_max=1, limit=4)) == 4  # at most `limit` a commit


def test_an_unstamped_end_counts_from_when_it_was_first_met() -> None:
    st = _state(_rec("old"))
    seen: dict[str, datetime] = {}
    assert due(st, T0, 60.0, seen) == []
    assert seen == {"old": T0}
    assert due(st, T0 + timedelta(seconds=59), 60.0, seen) == []
    assert due(st, T0 + timedelta(seconds=60), 60.0, seen) == [("old", "", Reason.RETAINED)]


def test_a_stamp_in_the_future_counts_from_when_it_was_first_met() -> None:
    # A clock stepped back (or a typo by hand) must not hold every later end back for years.
    st = _state(_rec("ahead", at=T0 + timedelta(days=3650)))
    st.put_instance("later", _rec("later", at=T0 + timedelta(seconds=1)))
    seen: dict[str, datetime] = {}
    assert due(st, T0, 60.0, seen) == [] and seen == {"ahead": T0}
    assert [d[0] for d in due(st, T0 + timedelta(seconds=61), 60.0, seen)] == ["ahead",
                                                                                "later"]


def test_stamps_read_back_and_a_stamp_naming_no_real_time_counts_as_none() -> None:
    assert stamp(T0 + timedelta(microseconds=123_456)) == "2026-11-29T12:00:00.123Z"
    assert parse_stamp("2026-11-29T12:00:00.123Z") == T0 + timedelta(milliseconds=123)
    assert parse_stamp("") is None and parse_stamp("2026-02-30T00:00:00Z") is None
    st = _state(InstanceRecord(instance_id="odd", spec=SPEC, state=S.FAILED,
                               ended_at="2026-02-30T00:00:00Z"))
    seen: dict[str, datetime] = {}
    assert due(st, T0, 60.0, seen) == [] and seen == {"odd": T0}


def test_a_malformed_stamp_is_refused_when_decoded() -> None:
    with pytest.raises(msgspec.ValidationError, match="ended_at"):
        msgspec.json.decode(b'{"instance_id":"a","spec":{"name":"s","command":["true"]},'
                            b'"state":"failed","ended_at":"yesterday"}', type=InstanceRecord)


def test_forget_rechecks_the_record() -> None:
    st = _state(_rec("a", at=T0), _rec("b", S.RUNNING), _rec("c", at=T0))
    view = View(st)
    assert forget(view, "a", stamp(T0)) is not None
    assert forget(view, "b", "") is None  # not ended
    assert forget(view, "c", stamp(T0 + timedelta(seconds=1))) is None  # rewritten since
    assert forget(view, "zz", stamp(T0)) is None
    assert view.change.instances == {"a": None}


def test_the_forget_plan_drops_what_is_still_due_and_names_its_effect() -> None:
    st = _state(_rec("a", at=T0), _rec("b", S.RUNNING), _rec("c", S.FAILED, T0))
    batch = [("a", stamp(T0), Reason.RETAINED), ("b", "", Reason.RETAINED),
             ("c", stamp(T0), Reason.RETAINED_MAX)]
    view = View(st)
    planned = plan_forget(view, batch)
    assert planned is not None
    assert planned.lines == [f"forget a (succeeded, ended {stamp(T0)}): {Reason.RETAINED}",
                             f"forget c (failed, ended {stamp(T0)}): {Reason.RETAINED_MAX}"]
    assert planned.effects == [Forgotten(tuple(batch))]  # the part counts what left
    assert view.change.instances == {"a": None, "c": None}
    assert plan_forget(View(st), [("b", "", Reason.RETAINED)]) is None


async def test_the_commit_stamps_ends_and_a_forget_commit_leaves_history_intact(
        tmp_path: Path) -> None:
    clock = [T0 + timedelta(microseconds=123_456)]
    ledger = Ledger(tmp_path / "state.git")
    committer = Committer(ledger, writer="thread", wall=lambda: clock[0])
    runner = asyncio.create_task(committer.run())

    async def commit(plan: Item) -> None:
        committer.submit(plan)
        await asyncio.sleep(0)
        await asyncio.wait_for(committer.idle.wait(), 10)

    def put(rec: InstanceRecord) -> Item:
        def plan(view: View) -> Planned:
            if not submit(view, rec):
                view.put_instance(rec)
            return Planned(lines=[f"put {rec.instance_id}"])
        return Item(plan=plan)

    try:
        await commit(put(_rec("a", S.QUEUED)))
        assert ledger.state().instances["a"].ended_at == ""  # not ended: no stamp
        await commit(put(_rec("a", S.SUCCEEDED)))
        stamped = ledger.state().instances["a"].ended_at
        assert stamped == "2026-11-29T12:00:00.123Z"  # this commit's time
        clock[0] = T0 + timedelta(hours=1)
        kept = InstanceRecord(instance_id="a", spec=SPEC, state=S.SUCCEEDED, ended_at=stamped,
                              reason="rewritten")
        await commit(put(kept))  # rewritten: the stamp is kept
        assert ledger.state().instances["a"].ended_at == stamped
        # What git holds is what the state says (a fresh read).
        fresh = Ledger(tmp_path / "state.git").state()
        assert fresh.instances["a"].ended_at == stamped and list(fresh.ended) == ["a"]
        assert b'"ended_at": "2026-11-29T12:00:00.123Z"' in pygit2.Repository(
            str(tmp_path / "state.git")).revparse_single(
                f"main:{instance_path('a')}").data  # type: ignore[attr-defined]

        def drop(view: View) -> Planned | None:
            return Planned(lines=["forget a"]) if forget(view, "a", stamped) else None
        before = ledger.state().head
        await commit(Item(plan=drop))
        assert "a" not in ledger.state().instances and not ledger.state().ended
        repo = pygit2.Repository(str(tmp_path / "state.git"))
        head = repo[ledger.state().head]
        assert instance_path("a") not in head.peel(pygit2.Tree)
        assert instance_path("a") in repo[before].peel(pygit2.Tree)  # history keeps it
    finally:
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner
        committer.close()
