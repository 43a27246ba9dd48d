"""A big submission makes and encodes its records in slices, with the loop's other work
between them (`broker.submissions` rule 1), and its commit writes those very encodings
(`Change.ready`) - never a record a later plan replaced."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from gavel.broker.ledger import state as ledger_state
from gavel.broker.ledger.plan import View, submit
from gavel.broker.ledger.repository import Ledger
from gavel.broker.ledger.state import Change, compact, ready
from gavel.broker.submissions import SUBMIT_SLICE
from gavel.shared import subjects
from gavel.shared.api import SubmitReply, SubmitRequest
from gavel.shared.messages import InstanceState as S
from gavel.shared.messages import Spec
from gavel.shared.records import InstanceRecord, instance_path
from tests.unit.fuzzkit import Msg
from tests.unit.test_fuzz_broker import SMALL, Rig


def test_a_big_submission_is_encoded_in_slices_and_committed_from_them(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    n = 5 * SUBMIT_SLICE
    encoded: list[str] = []  # instance records encoded, in order

    def counting(obj: object) -> bytes:
        if isinstance(obj, InstanceRecord):
            encoded.append(obj.instance_id)
        return msgspec.json.encode(obj)

    monkeypatch.setattr(ledger_state, "compact", counting)
    turns: list[int] = []  # records encoded each time another task got a turn

    async def other() -> None:
        while True:
            turns.append(len(encoded))
            await asyncio.sleep(0)

    watcher = rig.loop.create_task(other())
    msg = Msg(subjects.API.format(verb="submit"),
              msgspec.msgpack.encode(SubmitRequest(spec=SMALL, count=n, instance_id="big")),
              reply="_INBOX.api")
    rig.run(rig.api._serve("submit", msg))  # the request's own task, as `_handle` starts it
    watcher.cancel()
    reply = msgspec.msgpack.decode(rig.answers("_INBOX.api")[0], type=SubmitReply)
    assert len(reply.instance_ids) == n
    assert len({t for t in turns if 0 < t < n}) >= 3, "the loop never ran between slices"
    assert sorted(encoded) == sorted(reply.instance_ids)  # once each: the commit reused them
    state = Ledger(rig.b.ledger.path).state()  # what git holds, read afresh
    assert all(state.instances[iid].state is S.QUEUED for iid in reply.instance_ids)


def test_a_record_replaced_before_its_commit_is_encoded_afresh(tmp_path: Path) -> None:
    spec = Spec(name="s", command=["true"])
    first = InstanceRecord(instance_id="a", spec=spec)
    view = View(Ledger(tmp_path / "state.git").state(), Change())
    assert submit(view, first)
    view.change.ready["a"] = ready(first)
    _, raw = view.change.files_compact()
    assert raw[instance_path("a")] == compact(first)
    later = msgspec.structs.replace(first, state=S.CANCELLED)  # a later plan, same commit
    view.put_instance(later)
    _, raw = view.change.files_compact()
    assert raw[instance_path("a")] == compact(later) != compact(first)
