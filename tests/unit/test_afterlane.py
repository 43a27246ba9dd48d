"""The after-commit lane: a commit's answers and wake-ups do not wait behind the awards of
the commits before it (`broker.ledger.afterlane` rule 2, `broker.effects` rule 5).

A submission is in git once its commit lands; under load the commits before it still have
thousands of awards to send out. Its answer, and the pass that auctions what it submitted,
run as soon as it is durable; what a plan lists after another effect keeps its place.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from gavel.broker.effects import Answer, Emit, Publish, Wake, prompt
from gavel.broker.ledger.committer import AFTER_SLICE_S, Committer, Item, Planned
from gavel.broker.ledger.plan import View, submit
from gavel.broker.ledger.repository import Ledger
from gavel.broker.ledger.state import Change
from gavel.shared.messages import EventType, Spec
from gavel.shared.records import InstanceRecord
from tests.unit.commitkit import Gate, Then, heard

SPEC = Spec(name="s", command=["true"])
_SLOW = 20_000  # the earlier commit's effects: half a slice each until the test releases them


def test_only_the_answers_and_wake_ups_a_plan_lists_first_are_prompt() -> None:
    loop = asyncio.new_event_loop()
    try:
        done: asyncio.Future[Any] = loop.create_future()
        emit = Emit("i1", EventType.CANCELLED)
        assert prompt([Answer(done, None), Wake()]) == 2
        assert prompt([Wake(), Answer(done, None), emit, Answer(done, None)]) == 2
        assert prompt([emit, Answer(done, None), Wake()]) == 0
        assert prompt([Publish("s", Spec(name="x", command=["y"])), Wake()]) == 0
        assert prompt([]) == 0
    finally:
        loop.close()


class _Rig:
    """A committer whose `Answer`s set their futures and whose `Wake`s are counted, with the
    log of what ran when."""

    def __init__(self, tmp_path: Path, durable: Gate | None = None) -> None:
        self.ledger = Ledger(tmp_path / "state.git")
        self.committer = heard(Committer(self.ledger, writer="thread"))
        self.committer.effects.on(Answer, lambda e, _sha: e.waiter.set_result(e.message))
        self.committer.effects.on(Wake, lambda _e, _sha: self.log.append("wake"))
        self.log: list[str] = []
        #: The earlier commit's effects go on taking time until this is set.
        self.released = False
        self.mirrored: list[str] = []
        if durable is not None:
            self.committer.durable = durable
            self.committer.on_durable = self._mirror
            self.committer.on_commit = lambda _change, _sha: self._pushed(durable)

    @staticmethod
    def _pushed(gate: Gate) -> None:
        gate.notified += 1  # the pusher hears of every commit; it lands when the test says

    def _mirror(self, change: Change, sha: str) -> None:
        self.mirrored.append(sha)
        self.log.append(f"mirror {sorted(change.instances)[0]}")

    def awards(self, name: str) -> Item:
        """A commit whose effects take many slices to carry out."""
        def make(view: View) -> Planned:
            submit(view, InstanceRecord(instance_id=name, spec=SPEC))

            def slow(_sha: str) -> None:
                if not self.released:  # the loop's time, not the writer thread's GIL
                    time.sleep(AFTER_SLICE_S / 2)
            return Planned(lines=[name], effects=[*[Then(slow)] * _SLOW,
                                                  Then(lambda _: self.log.append(f"{name} done"))])
        return Item(plan=make)

    def submission(self, name: str, done: asyncio.Future[Any], *, answer_last: bool = False
                   ) -> Item:
        def make(view: View) -> Planned:
            submit(view, InstanceRecord(instance_id=name, spec=SPEC))
            told = Then(lambda _: self.log.append(f"{name} told"))
            effects = [told, Answer(done, None)] if answer_last else [Answer(done, None), Wake(),
                                                                     told]
            return Planned(lines=[name], effects=effects)
        return Item(plan=make)


async def _after_landing(rig: _Rig, name: str) -> None:
    while name not in rig.ledger.state().instances:
        await asyncio.sleep(0.001)


async def test_a_submission_is_answered_while_earlier_awards_still_go_out(
        tmp_path: Path) -> None:
    rig = _Rig(tmp_path)
    runner = asyncio.create_task(rig.committer.run())
    done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    try:
        rig.committer.submit(rig.awards("awards"))
        await _after_landing(rig, "awards")
        rig.committer.submit(rig.submission("sub", done))
        await asyncio.wait_for(done, 10)
        assert "awards done" not in rig.log  # answered before the earlier effects all ran
        assert rig.log == ["wake"]  # ... and the next pass was woken with it
        rig.released = True
        await asyncio.wait_for(rig.committer.idle.wait(), 10)
        # what the plan listed after its answer kept commit order
        assert rig.log == ["wake", "awards done", "sub told"]
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        rig.committer.close()


async def test_an_answer_listed_after_another_effect_waits_for_it(tmp_path: Path) -> None:
    """What a plan tells before it answers (a cancel's event, say) is told first, so it waits
    behind the earlier commits as before."""
    rig = _Rig(tmp_path)
    runner = asyncio.create_task(rig.committer.run())
    done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    done.add_done_callback(lambda _: rig.log.append("answered"))
    try:
        rig.committer.submit(rig.awards("awards"))
        await _after_landing(rig, "awards")
        rig.committer.submit(rig.submission("cancel", done, answer_last=True))
        await _after_landing(rig, "cancel")
        await asyncio.sleep(0.05)
        assert not done.done()
        rig.released = True
        await asyncio.wait_for(rig.committer.idle.wait(), 10)
        await asyncio.sleep(0)
        assert rig.log == ["awards done", "cancel told", "answered"]
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        rig.committer.close()


@pytest.mark.parametrize("earlier", [False, True])
async def test_with_ha_the_answer_waits_for_the_push_and_the_mirror(
        tmp_path: Path, earlier: bool) -> None:
    """A leader answers only once a push covering the commit was accepted, and the KV mirror
    heard of it first; not behind the earlier commits' awards (`earlier`)."""
    gate = Gate()
    rig = _Rig(tmp_path, durable=gate)
    runner = asyncio.create_task(rig.committer.run())
    done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    try:
        if earlier:
            rig.committer.submit(rig.awards("awards"))
            await _after_landing(rig, "awards")
        rig.committer.submit(rig.submission("sub", done))
        await _after_landing(rig, "sub")
        await asyncio.sleep(0.05)
        assert not done.done() and "wake" not in rig.log and rig.mirrored == []
        gate.land()
        await asyncio.wait_for(done, 10)
        assert "awards done" not in rig.log
        mirrors = ["mirror awards", "mirror sub"] if earlier else ["mirror sub"]
        assert rig.log[:len(mirrors) + 1] == [*mirrors, "wake"]
        rig.released = True
        await asyncio.wait_for(rig.committer.idle.wait(), 10)
        assert rig.log[-1] == "sub told"
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        rig.committer.close()
