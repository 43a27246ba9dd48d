"""Effects as data: the committer is the one executor. It commits a plan's change and, once
the ref has moved, carries out its effects in commit order, then plan order — beside the
`after` callbacks of the parts not yet moved to effects."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest

from gavel.broker.awardplan import AwardLost, NotPlaced, Placed, Waits
from gavel.broker.effects import (
    Answer,
    Arm,
    Effects,
    Emit,
    Publish,
    Refuse,
    Release,
    Timer,
    Wake,
    world,
)
from gavel.broker.events import Events
from gavel.broker.integrity import Corrected, Uncorrected
from gavel.broker.ledger.committer import Committer, Item, Planned
from gavel.broker.ledger.plan import View, submit
from gavel.broker.ledger.repository import Ledger
from gavel.broker.onepass import Passed
from gavel.broker.outbox import Outbox
from gavel.broker.periodic import Ran, Unran
from gavel.broker.promises import Unacted, Unblocked
from gavel.broker.reauction import Finished, Moved, Over, Unfinished, Unmoved
from gavel.broker.retention import Forgotten
from gavel.broker.serviceplans import DeployEnded, EndsTaken, Started, SystemStarted
from gavel.broker.watchdog import Action, Kind, Timers
from gavel.shared.messages import ApiError, Cancel, EventType, Spec
from gavel.shared.reasons import Reason
from gavel.shared.records import InstanceRecord
from tests.unit.commitkit import Failed, heard
from tests.unit.test_fuzz_broker import Rig

SPEC = Spec(name="s", command=["true"])


@dataclass(frozen=True)
class Noted:
    """A part's own effect, as a part would define one."""

    what: str


async def test_effects_run_after_the_ref_moved_in_commit_then_plan_order(
        tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "state.git")
    committer = Committer(ledger, writer="thread")
    seen: list[tuple[str, str | None]] = []
    committer.effects.on(Noted, lambda e, sha: seen.append((e.what, ledger.state().head
                                                            if sha else None)))
    runner = asyncio.create_task(committer.run())

    def plan(k: int) -> Item:
        def make(view: View) -> Planned:
            submit(view, InstanceRecord(instance_id=f"i{k}", spec=SPEC))
            return Planned(lines=[f"submit i{k}"],
                           effects=[Noted(f"{k}a"), Noted(f"{k}b")])
        return Item(plan=make)

    try:
        for k in range(3):
            committer.submit(plan(k))
        await asyncio.sleep(0)
        await asyncio.wait_for(committer.idle.wait(), 10)
    finally:
        runner.cancel()
        committer.close()
    head = ledger.state().head
    assert head is not None and committer.commits == 1
    # each plan's effects in its order, plan by plan
    assert [w for w, _ in seen] == ["0a", "0b", "1a", "1b", "2a", "2b"]
    assert [h for _, h in seen] == [head] * 6  # durable first


async def test_a_plan_that_fails_to_commit_carries_out_only_what_giving_up_says(
        tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "state.git", ref="refs/tags/pinned")
    committer = heard(Committer(ledger, writer="thread"))
    seen: list[str] = []
    failed: list[tuple[str, str]] = []
    committer.effects.on(Noted, lambda e, _sha: seen.append(e.what))
    runner = asyncio.create_task(committer.run())

    def make(view: View) -> Planned:
        submit(view, InstanceRecord(instance_id="i", spec=SPEC))
        return Planned(lines=["submit i"], effects=[Noted("told")])
    try:
        committer.submit(Item(plan=make, gave_up=[
            Noted("given up"), Failed(lambda r, d: failed.append((r, d)))]))
        await asyncio.sleep(0)
        await asyncio.wait_for(committer.idle.wait(), 10)
    finally:
        runner.cancel()
        committer.close()
    assert seen == ["given up"]  # never "told"
    assert failed == [(Reason.PINNED, "refs/tags/pinned")]  # a `Why` hears why


def test_one_handler_per_kind_and_an_unhandled_effect_is_logged_not_raised(
        caplog: pytest.LogCaptureFixture) -> None:
    effects = Effects()
    got: list[object] = []
    effects.on(Noted, lambda e, _sha: got.append(e))
    with pytest.raises(ValueError, match="Noted"):
        effects.on(Noted, lambda e, _sha: None)
    effects.run(Release("i"), "abc")
    assert "no handler" in caplog.text
    effects.run(Noted("x"), "abc")
    assert got == [Noted("x")]


async def test_the_worlds_effects_reach_the_outbox_the_events_and_the_clocks() -> None:
    outbox = Outbox(lambda subject, exc: None)
    events = Events(outbox, clock=lambda: 5.0)
    timers = Timers(started=0.0)
    effects = Effects()
    woken: list[bool] = []
    world(effects, outbox, events, timers, now=lambda: 42.0, wake=lambda: woken.append(True))
    effects.run(Wake(), "sha")
    assert woken == [True]
    waiter: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    cancel = Cancel(instance_id="i", node_id="n1", epoch=3, attempt=2)
    for effect in (Publish("gavel.cancel.n1", cancel),
                   Emit("i", EventType.LOST, node_id="n1", reason="r", detail="d"),
                   Arm(Timer.CANCEL_GRACE, "i", "n1"),
                   Answer(waiter, cancel),
                   Answer(waiter, Cancel(instance_id="late", node_id="n1"))):
        effects.run(effect, "sha")
    subjects = [s for s, _ in outbox.queued]
    assert subjects[0] == "gavel.cancel.n1" and len(subjects) == 2
    [ev] = list(events)
    assert (ev.instance_id, ev.type, ev.node_id, ev.reason, ev.detail, ev.at) == (
        "i", EventType.LOST, "n1", "r", "d", 5.0)
    assert timers.cancel_at["i"] == ("n1", 42.0)
    assert waiter.result() is cancel  # the first answer stands
    refused: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    effects.run(Refuse(refused, reason=Reason.PINNED, detail="refs/tags/v1"), "")
    assert refused.result() == ApiError(error=f"{Reason.PINNED} (refs/tags/v1)")


def test_the_broker_handles_every_kind_of_effect_its_plans_return(rig: Rig) -> None:
    """The composition registers a handler for each kind the moved parts' plans return (a
    missing one would only be logged, after the commit landed)."""
    effects = rig.b.committer.effects
    for kind in (Publish, Emit, Answer, Refuse, Arm, Release, Wake, Forgotten, Corrected,
                 Uncorrected, Unacted, Started, SystemStarted, EndsTaken, DeployEnded, Passed,
                 Placed, NotPlaced, Waits, AwardLost, Ran, Unran, Moved, Finished, Unmoved,
                 Unfinished, Over, Unblocked):
        assert effects.handles(kind), kind.__name__
    promises = rig.b.promises
    action = Action(Kind.REVOKE, "web-1", "n1")
    promises.acting.add((action.kind, action.instance_id))
    effects.run(Unacted(action), "")  # given up: the watchdog may act on it again
    assert not promises.acting


def test_an_award_given_up_tells_each_instance_why(rig: Rig) -> None:
    """`AwardLost` (`broker.awardplan` rule 5): the committer fills in why, and each of the
    decisions' instances hears it as an error event."""
    from gavel.shared.auction import Awarded
    from gavel.shared.award import NodeBid
    from gavel.shared.messages import Request

    rec = rig.b.ledger.state().instances["tiny-1"]
    d = Awarded(request=Request.of("tiny-1", rec.spec), winner=NodeBid(node_id="n1", load=0.1),
                tie_broken=False, bids=[], declines=[], silent=[])
    rig.b.committer.effects.run(AwardLost((d,), reason=Reason.LEDGER_UNWRITABLE,
                                          detail="disk full"), "")
    told = [(e.instance_id, e.type, e.reason, e.detail) for e in rig.b.events]
    assert told[-1] == ("tiny-1", EventType.ERROR, Reason.LEDGER_UNWRITABLE, "disk full")
