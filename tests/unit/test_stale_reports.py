"""A late report of an earlier attempt (broker/promises.py rule 1), in memory on a real
broker (`Rig`: real ledger in a temp git repository, real committer and handlers).

Found by the full-size chaos run: an instance handed back because its node did not accept
the assignment in time was told to stop there, placed elsewhere, then placed on the same
node again; the first copy's stop, confirmed after that, ended the attempt running now as
`cancelled` - git said it had ended while its process ran on (fenced later, or alive on two
nodes). A report counts only for the attempt git places on the node; and a node's stop
names the attempt it stops, so the late stop of the attempt given up leaves the one placed
there since running."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import msgspec
import pytest

from gavel.broker.ledger.plan import View, place, requeue
from gavel.shared import subjects
from gavel.shared.auction import Awarded
from gavel.shared.award import NodeBid
from gavel.shared.messages import Award, Cancel, Event, Request, Spec
from gavel.shared.messages import InstanceState as S
from gavel.shared.reasons import Reason
from tests.unit.fuzzkit import Msg
from tests.unit.test_fuzz_broker import SPEC, Rig

_enc = msgspec.msgpack.Encoder()


def settle(rig: Rig) -> None:
    for _ in range(3):
        rig.run(rig.b.committer.idle.wait())


def report(rig: Rig, kind: str, attempt: int, node: str = "n1", **kw: object) -> None:
    rig.b.promises.on_report(Msg(subjects.REPORT.format(node=node), _enc.encode(
        Event(instance_id="web-1", type=kind, node_id=node, attempt=attempt, **kw))))
    settle(rig)


def placed_again_on_n1(rig: Rig) -> int:
    """web-1 handed back off n1 (not accepted in time) and placed on n1 again, as a later
    auction's commit would: the attempt it runs as now."""
    state = rig.b.ledger.state()
    view = View(state)
    assert requeue(view, "web-1", "n1", Reason.NOT_ACCEPTED) is not None
    won = Awarded(request=Request.of("web-1", SPEC), winner=NodeBid(
        node_id="n1", load=0.1, strategy="least-loaded"), tie_broken=False, bids=[],
        declines=[], silent=[])
    assert place(view, won, "auction-2", [20000, 20999]) is not None
    rig.b.ledger.apply(view.change, "place web-1 again", state.head)
    pl = rig.b.ledger.state().placement("web-1")
    assert pl is not None and rig.b.ledger.state().placement_of("web-1") == "n1"
    return pl.attempt


@pytest.mark.parametrize(("kind", "extra", "then"), [
    ("cancelled", {"reason": str(Reason.CANCELLED)}, S.CANCELLED),
    ("exited", {"exit_code": 0}, S.SUCCEEDED),
    ("failed", {"reason": str(Reason.DRIVER_FAILED)}, S.QUEUED),  # re-auctioned
])
def test_the_late_end_of_an_earlier_attempt_leaves_the_current_one_placed(
        rig: Rig, kind: str, extra: dict[str, object], then: S) -> None:
    first = rig.b.ledger.state().placement("web-1")
    assert first is not None
    now = placed_again_on_n1(rig)
    assert now > first.attempt
    head = rig.b.ledger.head()
    report(rig, kind, first.attempt, **extra)
    state = rig.b.ledger.state()
    assert state.placement_of("web-1") == "n1", "the current attempt is still placed"
    assert state.instances["web-1"].state in (S.QUEUED, S.UNSCHEDULABLE)
    assert rig.b.ledger.head() == head, "nothing was committed for the stale report"
    assert rig.b.rejects.counts.get("event for an earlier attempt of the instance")
    # The current attempt's own end still counts.
    report(rig, kind, now, **extra)
    state = rig.b.ledger.state()
    assert state.placement_of("web-1") is None
    assert state.instances["web-1"].state is then


def test_a_stop_of_an_earlier_attempt_leaves_the_attempt_held_running(tmp_path: Path) -> None:
    """The node's side: the stop the broker sent as it gave attempt 1 up arrives after
    attempt 2 was awarded here; attempt 2 keeps running, and a stop of attempt 2 (or of no
    attempt named) stops it."""
    from tests.unit.test_fuzz_worker import Rig as WorkerRig

    w = WorkerRig(tmp_path, "least-loaded")
    spec = Spec(name="sleeper", command=["sleep", "60"], cpu=0.1, memory_mb=16)
    cancel = subjects.CANCEL.format(node="n1")
    try:
        w.run(w.agent._on_award(Msg(subjects.AWARD.format(node="n1"), _enc.encode(Award(
            auction_id="a2", instance_id="s-1", node_id="n1", spec=spec, attempt=2)))))
        held = w.agent._supervisor._held["s-1"]
        assert held.attempt == 2
        w.run(w.agent._on_cancel(Msg(cancel, _enc.encode(
            Cancel(instance_id="s-1", node_id="n1", attempt=1)))))
        assert held.stopping is None, "a stale stop stopped the attempt held now"
        w.run(w.agent._on_cancel(Msg(cancel, _enc.encode(
            Cancel(instance_id="s-1", node_id="n1", attempt=2)))))
        assert held.stopping == Reason.CANCELLED
    finally:
        tasks = []
        for h in list(w.agent._supervisor._held.values()):
            if h.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(h.proc.proc.pid, signal.SIGKILL)  # the run's process
            if h.task is not None:
                h.task.cancel()
                tasks.append(h.task)
        w.run(asyncio.gather(*tasks, *w.agent._supervisor._stoppers.running,
                             return_exceptions=True))
        w.loop.close()
