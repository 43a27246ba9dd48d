"""The status summary (`broker.views` rule 5): every instance counted by state and name in
one answer of bounded size, live instances listed first - what the dashboard asks for."""

from __future__ import annotations

import msgspec

from gavel.broker.arrays import task_record
from gavel.broker.ledger.plan import View, submit
from gavel.shared import subjects
from gavel.shared.api import SUMMARY_SHOWN, StatusReply, StatusRequest
from gavel.shared.ids import counted_ids
from gavel.shared.messages import InstanceState
from tests.unit.fuzzkit import Msg
from tests.unit.test_fuzz_broker import SMALL, Rig


def _ask(rig: Rig, req: StatusRequest, reply: str) -> StatusReply:
    rig.run(rig.api._serve("status", Msg(subjects.API.format(verb="status"),
                                         msgspec.msgpack.encode(req), reply=reply)))
    return msgspec.msgpack.decode(rig.answers(reply)[-1], type=StatusReply)


def test_the_summary_counts_every_instance_and_lists_a_bounded_few_live_first(
        rig: Rig) -> None:
    view = View(rig.b.ledger.state())
    ended = counted_ids("old", 300)
    for k, iid in enumerate(ended, 1):
        rec = task_record(iid, SMALL, "", "old", k)
        view.put_instance(msgspec.structs.replace(rec, state=InstanceState.SUCCEEDED,
                                                  ended_at="2026-01-01T00:00:00.000Z"))
    for k, iid in enumerate(counted_ids("new", SUMMARY_SHOWN + 100), 1):
        assert submit(view, task_record(iid, SMALL, "", "new", k))
    rig.b.ledger.apply(view.change, "many", rig.b.ledger.state().head)
    total = len(rig.b.ledger.state().instances)
    got = _ask(rig, StatusRequest(summary=True), "_INBOX.s")
    assert got.total == total == 300 + SUMMARY_SHOWN + 100 + 2  # and tiny-1, web-1
    assert sum(got.counts.values()) == total and got.counts["succeeded"] == 300
    assert got.by_name == {"tiny": 300 + SUMMARY_SHOWN + 100 + 1, "web": 1}
    assert len(got.instances) == SUMMARY_SHOWN and not got.next
    assert all(i.state != "succeeded" for i in got.instances)  # live ones first
    ids = [i.instance_id for i in got.instances]
    assert ids == sorted(ids)
    # A page of every instance is still there for those who read them all.
    page = _ask(rig, StatusRequest(), "_INBOX.p")
    assert not page.counts and len(page.instances) == total


def test_with_few_live_instances_the_latest_ended_fill_the_summary(rig: Rig) -> None:
    view = View(rig.b.ledger.state())
    for k, iid in enumerate(counted_ids("old", 3), 1):
        rec = task_record(iid, SMALL, "", "old", k)
        view.put_instance(msgspec.structs.replace(rec, state=InstanceState.FAILED,
                                                  ended_at="2026-01-01T00:00:00.000Z"))
    rig.b.ledger.apply(view.change, "three ended", rig.b.ledger.state().head)
    got = _ask(rig, StatusRequest(summary=True), "_INBOX.s")
    assert [i.instance_id for i in got.instances][:2] == ["tiny-1", "web-1"]
    assert sorted(i.instance_id for i in got.instances[2:]) == counted_ids("old", 3)
    assert got.counts["failed"] == 3


def test_the_pages_of_one_commit_put_the_ids_in_order_once(rig: Rig) -> None:
    """`broker.views` rule 3: every page of one commit reads the same order of ids, sorted
    once; the next commit's pages sort again and see what it added."""
    views = rig.api.views
    nc = type("Nc", (), {"max_payload": 1 << 20})()
    sorts = 0

    class Ids(dict[str, object]):
        def __iter__(self):  # type: ignore[no-untyped-def]
            nonlocal sorts
            sorts += 1
            return super().__iter__()

    state = rig.b.ledger.state()
    instances = Ids(state.instances)
    first, _ = views.status_page(instances, "", nc, "c1")  # type: ignore[arg-type]
    views.status_page(instances, first[0].instance_id, nc, "c1")  # type: ignore[arg-type]
    assert sorts == 1
    view = View(state)
    assert submit(view, task_record("zz-new", SMALL, "", "zz", 1))
    rig.b.ledger.apply(view.change, "one more", state.head)
    instances = Ids(rig.b.ledger.state().instances)
    page, _ = views.status_page(instances, "", nc, "c2")  # type: ignore[arg-type]
    assert sorts == 2 and page[-1].instance_id == "zz-new"
