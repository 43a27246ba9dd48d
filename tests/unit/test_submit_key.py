"""A submission has one outcome (`broker.api` rule 4): a request retried with its key gets
the first answer - the same instance ids - once that landed, also from a broker started
afresh on the same repository; one that failed landed nothing and may be tried again; two
at once make one submission. The key is checked at the edge: one sentence when wrong."""

from __future__ import annotations

import argparse
import asyncio
import errno
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gavel.broker.ledger import objects, packs
from gavel.broker.ledger.repository import Ledger
from gavel.broker.service import Broker, Config
from gavel.cli import commands
from gavel.shared.api import SubmitReply, SubmitRequest, key_problem
from gavel.shared.messages import ApiError, Message, Spec
from gavel.shared.reasons import Reason
from gavel.shared.timing import Timing
from tests.unit.test_fuzz_broker import SMALL, Rig

KEY = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"


def keyed(rig: Rig) -> list[str]:
    """The ids git holds under KEY, read afresh."""
    st = Ledger(rig.b.ledger.path).state()
    return sorted(i for i, rec in st.instances.items() if rec.key == KEY)


def ask(rig: Rig, req: SubmitRequest) -> Message:
    out: Message = rig.run(rig.api.submit(req))
    return out


def test_a_retried_key_returns_the_first_ids_and_makes_nothing_new(rig: Rig) -> None:
    req = SubmitRequest(spec=SMALL, count=3, key=KEY)  # the broker names them: random
    first = ask(rig, req)
    assert isinstance(first, SubmitReply) and len(first.instance_ids) == 3
    head = rig.b.ledger.head()
    again = ask(rig, req)
    assert again == first
    assert rig.b.ledger.head() == head, "a retry commits nothing"
    assert keyed(rig) == sorted(first.instance_ids)


def test_the_key_is_durable_a_broker_started_afresh_answers_the_same(rig: Rig,
                                                                     tmp_path: Path) -> None:
    req = SubmitRequest(spec=SMALL, key=KEY)
    first = ask(rig, req)
    assert isinstance(first, SubmitReply)
    fresh = Broker(Config(nats_url="nats://127.0.0.1:1", state_dir=tmp_path,
                          timing=Timing().scaled(10), writer="thread"))
    try:
        again = rig.loop.run_until_complete(fresh.api.submit(req))  # answered from git alone
    finally:
        fresh.committer.close()
    assert again == first and keyed(rig) == [first.instance_id]


def test_two_requests_with_one_key_at_once_make_one_submission(rig: Rig) -> None:
    req = SubmitRequest(spec=SMALL, count=2, key=KEY)

    async def both() -> list[Message]:
        return list(await asyncio.gather(*(rig.api.submit(req) for _ in range(4))))

    replies = rig.run(both())
    assert all(isinstance(r, SubmitReply) for r in replies)
    assert len({msgspec.json.encode(r) for r in replies}) == 1
    first = replies[0]
    assert isinstance(first, SubmitReply)
    assert keyed(rig) == sorted(first.instance_ids)


def test_a_key_whose_submission_failed_may_be_tried_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(tmp_path, writer="thread")
    try:
        def disk_full(*args: Any, **kw: Any) -> Any:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(objects, "put_file", disk_full)
        monkeypatch.setattr(packs, "put_file", disk_full)
        req = SubmitRequest(spec=SMALL, instance_id="web-9", key=KEY)
        failed = ask(rig, req)
        assert isinstance(failed, ApiError) and Reason.LEDGER_UNWRITABLE in failed.error
        assert keyed(rig) == []  # it landed nothing
        monkeypatch.undo()
        landed = ask(rig, req)
        assert landed == SubmitReply(instance_id="web-9")
        assert keyed(rig) == ["web-9"]
    finally:
        rig.close()


def test_a_key_met_again_with_another_submission_is_refused(rig: Rig) -> None:
    assert isinstance(ask(rig, SubmitRequest(spec=SMALL, key=KEY)), SubmitReply)
    other = msgspec.structs.replace(SMALL, cpu=0.2)
    for req in (SubmitRequest(spec=other, key=KEY), SubmitRequest(spec=SMALL, key=KEY, count=2),
                SubmitRequest(spec=SMALL, key=KEY, instance_id="another")):
        reply = ask(rig, req)
        assert isinstance(reply, ApiError) and reply.error.startswith(Reason.KEY_REUSED)
    assert len(keyed(rig)) == 1


def test_without_a_key_a_repeat_is_a_new_submission(rig: Rig) -> None:
    a, b = ask(rig, SubmitRequest(spec=SMALL)), ask(rig, SubmitRequest(spec=SMALL))
    assert isinstance(a, SubmitReply) and isinstance(b, SubmitReply)
    assert a.instance_id != b.instance_id


def test_retention_forgets_the_key_with_its_records(tmp_path: Path) -> None:
    """Every record of a submission carries its key; the index goes with the last of them."""
    from gavel.broker.ledger.plan import View, forget, submit
    from gavel.shared.messages import InstanceState as S
    from gavel.shared.records import InstanceRecord

    ledger = Ledger(tmp_path / "state.git")
    view = View(ledger.state())
    for iid in ("k-1", "k-2"):
        submit(view, InstanceRecord(instance_id=iid, spec=Spec(name="k", command=["true"]),
                                    key=KEY, state=S.SUCCEEDED, ended_at="2026-01-01T00:00:00Z"))
    ledger.apply(view.change, "submit", None)
    assert ledger.state().submitted(KEY) == ["k-1", "k-2"]
    assert Ledger(ledger.path).state().submitted(KEY) == ["k-1", "k-2"]  # read from git
    for iid in ("k-1", "k-2"):
        view = View(ledger.state())
        assert forget(view, iid, "2026-01-01T00:00:00Z") is not None
        ledger.apply(view.change, f"forget {iid}", ledger.state().head)
    assert ledger.state().submitted(KEY) == [] and KEY not in ledger.state().keys
    assert Ledger(ledger.path).state().keys == {}


def test_a_submission_of_many_answers_its_ids_in_their_order(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "state.git")
    from gavel.broker.ledger.plan import View, submit
    from gavel.shared.records import InstanceRecord

    view = View(ledger.state())
    ids = [f"web-{k}" for k in range(1, 13)]
    for iid in ids:
        submit(view, InstanceRecord(instance_id=iid, spec=SMALL, key=KEY))
    ledger.apply(view.change, "submit", None)
    assert Ledger(ledger.path).state().submitted(KEY) == ids  # web-2 before web-10


@pytest.mark.parametrize("key", ["short", "has space in it", "x" * 65, "ünïcode-key-here",
                                 "semi;colon-key"])
def test_an_unusable_key_is_one_sentence(key: str) -> None:
    problem = key_problem(key)
    assert problem.startswith("key ") and problem.count(".") <= 1 and "\n" not in problem
    with pytest.raises(msgspec.ValidationError, match="key"):
        msgspec.msgpack.decode(msgspec.msgpack.encode({"type": "submit", "spec": {
            "name": "s", "command": ["true"]}, "key": key}), type=SubmitRequest)


def test_a_uuid4_and_no_key_are_usable() -> None:
    import uuid

    assert key_problem(uuid.uuid4().hex) == "" and key_problem(str(uuid.uuid4())) == ""
    assert key_problem("") == ""


async def test_the_cli_refuses_an_unusable_key_before_it_connects(tmp_path: Path) -> None:
    spec = tmp_path / "s.toml"
    spec.write_text('name = "s"\ncommand = ["true"]\n')
    args = argparse.Namespace(command="submit", spec=spec, id="", key="no good", wait=False,
                              json=False, nats="nats://127.0.0.1:1", creds=None, timeout=1.0)
    with pytest.raises(commands.UsageError, match="--key: key 'no good' is not usable"):
        await commands.submit(args)


def test_a_retry_after_retention_forgot_some_records_still_names_them_all(rig: Rig) -> None:
    """The records of a submission end and leave the tree one by one; a retry meanwhile
    still gets the first answer: the broker named them base-1 .. base-N."""
    from gavel.broker.ledger.plan import View, forget
    from gavel.shared.messages import InstanceState as S

    req = SubmitRequest(spec=SMALL, count=3, key=KEY)
    first = ask(rig, req)
    assert isinstance(first, SubmitReply)
    ledger = rig.b.ledger
    for iid in first.instance_ids[:2]:  # two of them ended long ago and were forgotten
        view = View(ledger.state())
        rec = msgspec.structs.replace(ledger.state().instances[iid], state=S.SUCCEEDED,
                                      ended_at="2026-01-01T00:00:00Z")
        view.put_instance(rec)
        ledger.apply(view.change, f"end {iid}", ledger.state().head)
        view = View(ledger.state())
        assert forget(view, iid, rec.ended_at) is not None
        ledger.apply(view.change, f"forget {iid}", ledger.state().head)
    assert keyed(rig) == [first.instance_ids[2]]
    assert ask(rig, req) == first
    assert keyed(rig) == [first.instance_ids[2]], "nothing submitted again"
