"""Long reads in steps (`broker.steps`): a service's plan over every replica yields between
runs of replicas, the committer gives the loop a turn between its slices, and the result is
the one the same computation gives run in one go."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gavel.broker import steps
from gavel.broker.ledger.committer import Committer, Item, Planned, and_then
from gavel.broker.ledger.plan import View, submit
from gavel.broker.ledger.repository import Ledger
from gavel.broker.ledger.state import Change, State
from gavel.broker.serviceplans import Clocks, KeepInputs, plan_keep, plan_keep_in_steps
from gavel.broker.steps import Steps, at_once, drive
from gavel.shared.messages import Spec
from gavel.shared.records import (
    Assignment,
    InstanceRecord,
    NodeFile,
    ServiceRecord,
    ServiceVersion,
)
from tests.unit.commitkit import Then, heard

SPEC = Spec(name="web", command=["true"], type="service")


def _counted(n: int, log: list[str]) -> Steps[int]:
    for k in range(n):
        log.append(f"step {k}")
        yield
    return n * 10


async def _turns_while(work: asyncio.Future[object] | asyncio.Task[object],
                       log: list[str]) -> None:
    """Note each turn of the loop another task gets until `work` is done."""
    while not work.done():
        log.append("turn")
        await asyncio.sleep(0)


def test_run_at_once_a_computation_returns_what_it_returns() -> None:
    log: list[str] = []
    assert at_once(_counted(3, log)) == 30
    assert log == ["step 0", "step 1", "step 2"]


async def test_driven_the_loop_runs_between_slices_and_the_result_is_the_same() -> None:
    log: list[str] = []
    work = asyncio.ensure_future(drive(_counted(3, log), slice_s=0.0))
    await _turns_while(work, log)
    got, ran = work.result()
    assert got == 30 and ran >= 0.0
    steps_at = [i for i, e in enumerate(log) if e.startswith("step")]
    assert any(log[i] == "turn" for i in range(steps_at[0], steps_at[-1])), log


async def test_a_long_slice_runs_every_step_in_one_go() -> None:
    log: list[str] = []
    work = asyncio.ensure_future(drive(_counted(3, log), slice_s=60.0))
    await _turns_while(work, log)
    assert [e for e in log if e != "turn"] == ["step 0", "step 1", "step 2"]
    first, last = log.index("step 0"), log.index("step 2")
    assert "turn" not in log[first:last]


# -- a service's plan -------------------------------------------------------------------
def _web(count: int, placed: int, live: int) -> tuple[View, Clocks]:
    """Service ``web`` of `count` with `live` replicas, the first `placed` on nodes (and
    healthy for a while, half of those), the rest waiting."""
    st = State(head="h")
    st.put_service("web", ServiceRecord(
        name="web", versions=[ServiceVersion(version=1, spec=SPEC)], version=1, count=count))
    on: dict[str, dict[str, Assignment]] = {}
    first_seen, healthy = {}, {}
    for k in range(live):
        iid = f"web-{k:05d}"
        st.put_instance(iid, InstanceRecord(instance_id=iid, spec=SPEC, service="web",
                                            version=1))
        first_seen[iid] = float(k % 7)
        if k < placed:
            on.setdefault(f"n{k % 3}", {})[iid] = Assignment(instance_id=iid, auction_id="a",
                                                             attempt=1)
            if k % 2:
                healthy[iid] = 1.0
    for node, held in on.items():
        st.put_node(node, NodeFile(node_id=node, instances=held))
    return View(st, Change()), Clocks(first_seen, healthy)


def _kept(view: View, clocks: Clocks, stepped: bool) -> tuple[Planned | None, int]:
    """plan_keep on `view`, at once or step by step: its result and the steps it took."""
    inputs = KeepInputs(now=50.0, stamp="2026-01-01T00:00:00.000Z", epoch=1, seed=7,
                        start_chunk=100, clocks=clocks)
    if not stepped:
        return plan_keep(view, "web", inputs), 0
    gen = plan_keep_in_steps(view, "web", inputs)
    n = 0
    while True:
        try:
            next(gen)
        except StopIteration as done:
            return done.value, n
        n += 1


@pytest.mark.parametrize(("count", "placed", "live"), [(60, 10, 40), (20, 30, 45),
                                                       (45, 45, 45)])
def test_a_service_plan_in_steps_is_the_plan_at_once(monkeypatch: pytest.MonkeyPatch,
                                                     count: int, placed: int,
                                                     live: int) -> None:
    """Starts (60 of 40), stops (20 of 45), nothing (45 of 45): the same change, lines and
    effects either way, the stepped one yielding every few replicas read."""
    monkeypatch.setattr(steps, "EVERY", 4)
    at_once_view, clocks = _web(count, placed, live)
    stepped_view, _ = _web(count, placed, live)
    want, _ = _kept(at_once_view, clocks, stepped=False)
    got, n = _kept(stepped_view, clocks, stepped=True)
    assert got == want
    assert stepped_view.change.instances == at_once_view.change.instances
    assert n >= 2 * live // 4  # its records, then the keeper's view of them
    assert (want is None) == (count == live)


# -- the committer -----------------------------------------------------------------------
async def test_the_committer_drives_a_plan_in_steps_with_the_loop_running_between(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(steps, "SLICE_S", 0.0)  # a turn of the loop after every step
    ledger = Ledger(tmp_path / "state.git")
    committer = heard(Committer(ledger, writer="thread"))
    runner = asyncio.create_task(committer.run())
    log: list[str] = []

    def plan(view: View) -> Steps[Planned | None]:
        for k in range(5):
            log.append(f"step {k}")
            yield
        submit(view, InstanceRecord(instance_id="made", spec=SPEC))
        return Planned(lines=["made in steps"])

    try:
        committer.submit(Item(plan=lambda v: and_then(
            v, plan=plan, effects=(Then(lambda sha: log.append(f"landed {bool(sha)}")),))))
        idle = asyncio.ensure_future(asyncio.wait_for(committer.idle.wait(), 30))
        await asyncio.sleep(0)
        await _turns_while(idle, log)
    finally:
        runner.cancel()
        committer.close()
    steps_at = [i for i, e in enumerate(log) if e.startswith("step")]
    assert len(steps_at) == 5
    assert "turn" in log[steps_at[0]:steps_at[-1]], log
    assert "landed True" in log[steps_at[-1]:]
    assert "made" in ledger.state().instances and committer.commits == 1

