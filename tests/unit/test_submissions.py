"""A large submission lands in commits of bounded size, in index order, the broker's other
requests served between them, and is answered once all of it is in git; one cut short is
finished by its keyed retry (`broker.submissions` rules 2 and 4)."""

from __future__ import annotations

import asyncio
import subprocess

import msgspec

from gavel.broker.arrays import task_record
from gavel.broker.ledger.plan import View, submit
from gavel.broker.ledger.repository import Ledger
from gavel.shared import subjects
from gavel.shared.api import NodesReply, NodesRequest, SubmitReply, SubmitRequest
from gavel.shared.ids import counted_ids
from gavel.shared.messages import ApiError, EventType, InstanceState
from gavel.shared.reasons import Reason
from tests.unit.fuzzkit import Msg
from tests.unit.test_fuzz_broker import SMALL, Rig


def _request(verb: str, req: msgspec.Struct, reply: str) -> Msg:
    return Msg(subjects.API.format(verb=verb), msgspec.msgpack.encode(req), reply=reply)


def _subjects_of_commits(rig: Rig) -> list[str]:
    out = subprocess.run(["git", "--git-dir", str(rig.b.ledger.path), "log", "--format=%s",
                          rig.b.ledger.ref], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[::-1]


def test_a_large_submission_lands_in_bounded_commits_with_requests_served_between(
        rig: Rig) -> None:
    rig.api.submissions.chunk = 100
    before = len(_subjects_of_commits(rig))
    landed: list[int] = []  # instances of it in the state each time `nodes` is answered
    incoming: list[int] = []  # and those accepted whose commit has not landed (rule 6)
    answered_nodes: list[int] = []

    async def ask_nodes_meanwhile(big: asyncio.Task[None]) -> None:
        k = 0
        while not big.done():
            k += 1
            await rig.api._serve("nodes", _request("nodes", NodesRequest(), f"_INBOX.n{k}"))
            answered_nodes.append(k)
            landed.append(len(rig.b.ledger.state().submitted("bigkey01")))
            incoming.append(rig.api.submissions.incoming)
            await asyncio.sleep(0)

    async def both() -> None:
        big = asyncio.ensure_future(rig.api._serve("submit", _request("submit", SubmitRequest(
            spec=SMALL, count=350, instance_id="big", key="bigkey01"), "_INBOX.big")))
        await asyncio.gather(big, ask_nodes_meanwhile(big))

    rig.run(both())
    reply = msgspec.msgpack.decode(rig.answers("_INBOX.big")[0], type=SubmitReply)
    assert reply.instance_ids == counted_ids("big", 350)
    commits = _subjects_of_commits(rig)[before:]
    assert commits == [
        "submit 100 instances of tiny: big-1 .. big-100 (100 of 350)",
        "submit 100 instances of tiny: big-101 .. big-200 (200 of 350)",
        "submit 100 instances of tiny: big-201 .. big-300 (300 of 350)",
        "submit 50 instances of tiny: big-301 .. big-350 (350 of 350)"]
    # `nodes` was answered while the submission was landing, not only after it.
    assert any(0 < n < 350 for n in landed), landed
    # what has not landed yet is incoming: the tuner counts it as waiting (rule 6)
    assert all(n + k >= 350 for n, k in zip(landed, incoming, strict=True))
    assert 350 in incoming and any(0 < k < 350 for k in incoming), incoming
    assert rig.api.submissions.incoming == 0
    for k in answered_nodes:
        msgspec.msgpack.decode(rig.answers(f"_INBOX.n{k}")[0], type=NodesReply)
    assert len(Ledger(rig.b.ledger.path).state().submitted("bigkey01")) == 350
    assert not rig.api.submissions.landing


def test_a_submission_cut_short_is_finished_by_its_keyed_retry(rig: Rig) -> None:
    """A crash after two of four commits left big-1 .. big-200 in git and no answer; the
    client asks again with its key: the broker commits big-201 .. big-350 and answers with
    all of them, making none of the first ones twice."""
    rig.api.submissions.chunk = 100
    view = View(rig.b.ledger.state())
    for k, iid in enumerate(counted_ids("big", 350)[:200], 1):
        assert submit(view, task_record(iid, SMALL, "bigkey01", "big", k))
    rig.b.ledger.apply(view.change, "submit 200 instances of small (cut short)",
                       rig.b.ledger.state().head)
    before = len(_subjects_of_commits(rig))
    again = SubmitRequest(spec=SMALL, count=350, instance_id="big", key="bigkey01")
    rig.run(rig.api._serve("submit", _request("submit", again, "_INBOX.again")))
    reply = msgspec.msgpack.decode(rig.answers("_INBOX.again")[0], type=SubmitReply)
    assert reply.instance_ids == counted_ids("big", 350)
    assert _subjects_of_commits(rig)[before:] == [
        "submit 100 instances of tiny: big-201 .. big-300 (300 of 350)",
        "submit 50 instances of tiny: big-301 .. big-350 (350 of 350)"]
    assert sorted(Ledger(rig.b.ledger.path).state().submitted("bigkey01")) == \
        sorted(counted_ids("big", 350))
    # Whole now: asked once more, it is answered from git and commits nothing.
    rig.run(rig.api._serve("submit", _request("submit", again, "_INBOX.third")))
    third = msgspec.msgpack.decode(rig.answers("_INBOX.third")[0], type=SubmitReply)
    assert third.instance_ids == reply.instance_ids
    assert len(_subjects_of_commits(rig)) == before + 2
    assert rig.api.submissions.incoming == 0  # rule 6: what landed is no longer incoming


def test_a_retry_naming_another_spec_for_a_cut_short_key_is_refused(rig: Rig) -> None:
    view = View(rig.b.ledger.state())
    for k, iid in enumerate(counted_ids("big", 10)[:4], 1):
        assert submit(view, task_record(iid, SMALL, "bigkey01", "big", k))
    rig.b.ledger.apply(view.change, "cut short", rig.b.ledger.state().head)
    other = msgspec.structs.replace(SMALL, command=["false"])
    rig.run(rig.api._serve("submit", _request("submit", SubmitRequest(
        spec=other, count=10, instance_id="big", key="bigkey01"), "_INBOX.x")))
    got = msgspec.msgpack.decode(rig.answers("_INBOX.x")[0], type=ApiError)
    assert got.error == f"{Reason.KEY_REUSED}: bigkey01 made big-1 .. big-4", got


def test_an_array_still_landing_is_not_judged_ended(rig: Rig) -> None:
    """Rule 2: the first commit's tasks all ended before the rest landed; the array is not
    told ended until its submission has landed whole."""
    view = View(rig.b.ledger.state())
    for k, iid in enumerate(counted_ids("arr", 3), 1):
        rec = task_record(iid, SMALL, "arrkey01", "arr", k)
        view.put_instance(msgspec.structs.replace(rec, state=InstanceState.SUCCEEDED,
                                                  ended_at="2026-01-01T00:00:00.000Z"))
    rig.b.ledger.apply(view.change, "three tasks of arr, ended", rig.b.ledger.state().head)

    def ended() -> list[str]:
        return [e.instance_id for e in rig.b.events
                if e.type == EventType.ARRAY_ENDED]

    rig.api.submissions.landing.add("arr")  # its submission is still landing
    rig.b.arrays.watch()
    assert ended() == []
    rig.api.submissions.landing.discard("arr")
    rig.b.arrays.watch()
    assert ended() == ["arr"]
