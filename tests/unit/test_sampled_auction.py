"""A sampled auction (d = 2) in a real broker asks only the nodes that could take the request:
a labelled request in a fleet where few nodes carry the label is asked of those nodes, a
drain (git's or the node's own) takes a node out, and a request no node could ever take is
unschedulable at once with the nodes' own reason, nothing sent."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import msgspec
import pytest

from gavel.broker.auctioneer import Auctioneer
from gavel.broker.ledger.plan import View, set_draining, submit
from gavel.broker.service import Broker, Config
from gavel.shared import subjects
from gavel.shared.auction import Auction
from gavel.shared.messages import Bid, BidReply, Capacity, Decline, Heartbeat, Spec
from gavel.shared.reasons import Reason
from gavel.shared.records import InstanceRecord
from gavel.shared.timing import Timing
from gavel.transport import wire
from tests.unit.fuzzkit import Msg

NODES = tuple(f"n{i:02d}" for i in range(40))
GPUS = ("n07", "n23", "n31")
GPU_JOB = Spec(name="train", command=["true"], cpu=1.0, memory_mb=64, labels={"gpu": "yes"})
WEB = Spec(name="web", command=["true"], cpu=1.0, memory_mb=64)
_enc = msgspec.msgpack.Encoder()


def beat(b: Broker, node: str, draining: bool = False) -> None:
    b._on_heartbeat(Msg(subjects.HEARTBEAT.format(node=node), _enc.encode(Heartbeat(
        node_id=node, strategy="least-loaded", port_range=[20000, 20999], draining=draining,
        labels={"gpu": "yes"} if node in GPUS else {},
        capacity=Capacity(cpu=4.0, memory_mb=4096, ports=1000)))))


def sampled_broker(root: Path, specs: dict[str, Spec]) -> Broker:
    b = Broker(Config(nats_url="nats://127.0.0.1:1", state_dir=root, timing=Timing(), sample_d=2,
                      batch_max=8))
    b.auctioneer.core.rng = random.Random(7)
    view = View(b.ledger.state())
    for iid, spec in specs.items():
        submit(view, InstanceRecord(instance_id=iid, spec=spec))
    b.ledger.apply(view.change, "seed", None)
    for n in NODES:
        beat(b, n)
    return b


@pytest.fixture
def written(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    out: list[str] = []

    def write_now(nc: object, batch: list[tuple[str, bytes]]) -> bool:
        out.extend(s for s, _ in batch)
        return True

    monkeypatch.setattr(wire, "write_now", write_now)
    return out


def rfbs(subjects_written: list[str]) -> list[str]:
    prefix = subjects.RFB_NODE.format(node="")
    return sorted(s.removeprefix(prefix) for s in subjects_written if s.startswith(prefix))


async def test_a_labelled_request_is_asked_of_nodes_that_carry_the_label(
        tmp_path: Path, written: list[str]) -> None:
    b = sampled_broker(tmp_path, {"train-1": GPU_JOB})
    b.auctioneer.reconcile(b.now())
    [auction] = b.auctioneer.auctions.values()
    assert set(auction.eligible) <= set(GPUS) and len(auction.eligible) == 2
    assert rfbs(written) == sorted(auction.eligible)


async def test_fewer_carriers_than_d_per_request_are_all_asked_and_drains_leave(
        tmp_path: Path, written: list[str]) -> None:
    b = sampled_broker(tmp_path, {"train-1": GPU_JOB, "train-2": GPU_JOB})
    beat(b, "n23", draining=True)  # the node says it drains
    view = View(b.ledger.state())
    set_draining(view, "n31", True)  # git says so; the node does not know yet
    b.ledger.apply(view.change, "drain n31", b.ledger.state().head)
    b.auctioneer.reconcile(b.now())
    [auction] = b.auctioneer.auctions.values()
    assert auction.eligible == {"n07"} and rfbs(written) == ["n07"]


async def test_a_request_no_node_can_take_is_unschedulable_at_once_with_their_reason(
        tmp_path: Path, written: list[str]) -> None:
    tpu = Spec(name="infer", command=["true"], cpu=1.0, memory_mb=64, labels={"tpu": "v5"})
    b = sampled_broker(tmp_path, {"infer-1": tpu})
    committer = asyncio.create_task(b.committer.run())
    try:
        b.auctioneer.reconcile(b.now())
        assert written == [] and b.auctioneer.auctions == {}
        for _ in range(2000):
            if b.auctioneer.recent("infer-1") is not None:
                break
            await asyncio.sleep(0.01)
    finally:
        committer.cancel()
    record = b.auctioneer.recent("infer-1")
    assert record is not None and record.reason == Reason.MISSING_LABEL
    assert record.summary == f"0/{len(NODES)} nodes bid: {len(NODES)} missing label tpu=v5"
    assert b.ledger.state().instances["infer-1"].state == "unschedulable"


def _all_full(a: Auctioneer, aid: str, auction: Auction) -> None:
    """Every node asked declines every shape: no room, or (off the gpu nodes) no gpu."""
    gpu = next((i for i, s in enumerate(auction.shapes) if s.labels), None)
    for n in sorted(auction.eligible):
        a.on_bids(Msg(subjects.BIDS.format(node=n), _enc.encode(BidReply(
            auction_id=aid, node_id=n, answers=[
                Decline(shape=i, reason=Reason.NO_ROOM_CPU, detail="1")
                if i != gpu or n in GPUS else
                Decline(shape=i, reason=Reason.MISSING_LABEL, detail="gpu=yes")
                for i in range(len(auction.shapes))]))))


async def test_what_the_sampled_nodes_cannot_place_is_asked_of_more_then_of_every_candidate(
        tmp_path: Path, written: list[str]) -> None:
    b = sampled_broker(tmp_path, {"train-1": GPU_JOB, "web-1": WEB})
    a = b.auctioneer
    a.reconcile(b.now())
    [(first, auction)] = a.auctions.items()
    assert len(auction.eligible) == 4  # d = 2 for each of two shapes
    _all_full(a, first, auction)
    [(second, wider)] = a.auctions.items()  # 8·d more: 16 of the 37 plain nodes, the 3 gpus
    assert second != first and {r.instance_id for r in wider.requests} == {"train-1", "web-1"}
    assert set(GPUS) <= wider.eligible and len(wider.eligible) == 16 + len(GPUS)
    assert written[-1] != subjects.RFB and a.core.inflight == {"train-1", "web-1"}
    _all_full(a, second, wider)
    [every] = a.auctions.values()  # the gpu job had every candidate asked: decided
    assert {r.instance_id for r in every.requests} == {"web-1"}
    assert every.eligible == set(NODES) and written[-1] == subjects.RFB  # all: a broadcast
    written.clear()
    b2 = sampled_broker(tmp_path / "b", {"train-1": GPU_JOB})
    b2.auctioneer.reconcile(b2.now())
    [(aid, only)] = b2.auctioneer.auctions.items()
    for n in sorted(only.eligible):
        b2.auctioneer.on_bids(Msg(subjects.BIDS.format(node=n), _enc.encode(BidReply(
            auction_id=aid, node_id=n,
            answers=[Decline(shape=0, reason=Reason.NO_ROOM_CPU, detail="1")]))))
    [again] = b2.auctioneer.auctions.values()
    assert again.eligible == set(GPUS) and rfbs(written[-3:]) == list(GPUS)


async def test_the_last_winner_of_a_shape_is_asked_in_its_next_round(
        tmp_path: Path, written: list[str]) -> None:
    b = sampled_broker(tmp_path, {"web-1": WEB, "web-2": WEB})
    b.auctioneer.batch_max = 1
    b.auctioneer.max_auctions = 1
    b.auctioneer.reconcile(b.now())
    [(first, auction)] = b.auctioneer.auctions.items()
    winner = min(auction.eligible)
    for n in sorted(auction.eligible):
        b.auctioneer.on_bids(Msg(subjects.BIDS.format(node=n), _enc.encode(BidReply(
            auction_id=first, node_id=n,
            answers=[Bid(shape=0, load=0.1 if n == winner else 0.5, strategy="x")]))))
    [nxt] = b.auctioneer.auctions.values()
    assert [r.instance_id for r in nxt.requests] == ["web-2"]
    assert winner in nxt.eligible and len(nxt.eligible) in (2, 3)
