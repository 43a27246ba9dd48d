"""The broker's planner (`broker.planner`) on a real broker with only NATS stood in for: a plan
broadcasts a dry-run RFB, decides by the award rule on the nodes' answers, and leaves git,
the auctioneer's reservations and its auctions as they were; an answer after it closed is
late, not a reject."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from gavel.shared import subjects
from gavel.shared.messages import RFB, ApiError, Bid, BidReply, Decline
from gavel.shared.planning import PlanReply, PlanRequest
from gavel.shared.reasons import Reason
from gavel.shared.spec import Spec
from tests.unit.fuzzkit import Msg
from tests.unit.test_fuzz_broker import NODES, SMALL, Rig

_enc = msgspec.msgpack.Encoder()
KEPT = ("head", "instances", "nodes", "pending", "auctions", "inflight", "retry_at",
        "reserved", "live")


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    try:
        yield r
    finally:
        r.close()


def reply(aid: str, node: str, load: float | None) -> Msg:
    answer = Bid(shape=0, load=load, strategy="s") if load is not None else \
        Decline(shape=0, reason=Reason.NO_ROOM_CPU)
    return Msg(subjects.BIDS.format(node=node), _enc.encode(
        BidReply(auction_id=aid, node_id=node, answers=[answer])))


def plan(rig: Rig, spec: Spec, loads: dict[str, float | None]) -> tuple[PlanReply, str]:
    task = rig.loop.create_task(rig.api.planner.plan(PlanRequest(spec=spec)))
    for _ in range(5):
        rig.loop.run_until_complete(asyncio.sleep(0))
    [rfb] = [msgspec.msgpack.decode(d, type=RFB) for s, d in rig.wire.sent
             if s == subjects.RFB]
    assert rfb.dry_run and rfb.auction_id.startswith("plan-")
    for node, load in loads.items():
        rig.b.auctioneer.on_bids(reply(rfb.auction_id, node, load))
    got = rig.run(task)
    assert isinstance(got, PlanReply)
    return got, rfb.auction_id


def test_a_plan_decides_on_a_dry_run_and_changes_nothing(rig: Rig) -> None:
    before = {k: v for k, v in rig.snapshot().items() if k in KEPT}
    replies = rig.b.auctioneer.replies_total
    got, _ = plan(rig, SMALL, {"n1": 0.5, "n2": 0.2, "n3": None})
    [placed] = got.placements
    assert placed.winner == "n2" and [b.node_id for b in placed.bids] == ["n2", "n1"]
    assert [d.node_id for d in placed.declines] == ["n3"]
    assert got.type == "job" and got.index == 0
    assert {k: v for k, v in rig.snapshot().items() if k in KEPT} == before
    assert rig.b.auctioneer.replies_total == replies  # the real rounds' count is theirs


def test_an_answer_after_the_plan_closed_is_late_not_a_reject(rig: Rig) -> None:
    _, aid = plan(rig, SMALL, dict.fromkeys(NODES, 0.1))
    rejected, late = rig.rejected(), rig.b.auctioneer.core.late_total
    rig.b.auctioneer.on_bids(reply(aid, "n1", 0.1))
    assert rig.rejected() == rejected and rig.b.auctioneer.core.late_total == late + 1


def test_a_plan_the_broker_would_refuse_is_refused_with_the_submit_sentence(rig: Rig) -> None:
    huge = Spec(name="huge", command=["true"], cpu=64.0)
    got = rig.run(rig.api.planner.plan(PlanRequest(spec=huge)))
    assert isinstance(got, ApiError)
    assert "no node could ever offer the requested resources" in got.error
    assert not [s for s, _ in rig.wire.sent if s == subjects.RFB]


def test_a_replayed_answer_to_an_open_plan_is_a_reject(rig: Rig) -> None:
    task = rig.loop.create_task(rig.api.planner.plan(PlanRequest(spec=SMALL)))
    for _ in range(5):
        rig.loop.run_until_complete(asyncio.sleep(0))
    [rfb] = [msgspec.msgpack.decode(d, type=RFB) for s, d in rig.wire.sent
             if s == subjects.RFB]
    rejected = rig.rejected()
    rig.b.auctioneer.on_bids(reply(rfb.auction_id, "n1", 0.1))
    rig.b.auctioneer.on_bids(reply(rfb.auction_id, "n1", 0.1))  # a replay
    assert rig.rejected() == rejected + 1
    for node in ("n2", "n3"):
        rig.b.auctioneer.on_bids(reply(rfb.auction_id, node, 0.3))
    got = rig.run(task)
    assert isinstance(got, PlanReply) and got.placements[0].winner == "n1"
