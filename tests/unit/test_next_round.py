"""The next round goes out as the last one closes: when an auction is decided and work is
waiting, the next auction is opened there and then (not after the loop's other work) and
its RFBs are written to the socket at once; reentry through an auction that closes as it
opens (no candidates) never auctions an instance twice."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gavel.broker.ledger.plan import View, submit
from gavel.broker.service import Broker, Config
from gavel.shared import subjects
from gavel.shared.messages import Bid, BidReply, Capacity, Heartbeat, Spec
from gavel.shared.records import InstanceRecord
from gavel.shared.timing import Timing
from gavel.transport import wire
from tests.unit.fuzzkit import Msg

SPEC = Spec(name="web", command=["true"], cpu=0.1, memory_mb=16)
NODES = ("n1", "n2", "n3")
_enc = msgspec.msgpack.Encoder()


def _broker(root: Path, queued: int, nodes: tuple[str, ...], **kw: int) -> Broker:
    b = Broker(Config(nats_url="nats://127.0.0.1:1", state_dir=root, timing=Timing(), **kw))
    view = View(b.ledger.state())
    for k in range(queued):
        submit(view, InstanceRecord(instance_id=f"web-{k}", spec=SPEC))
    b.ledger.apply(view.change, "seed", None)
    for n in nodes:
        b._on_heartbeat(Msg(subjects.HEARTBEAT.format(node=n), _enc.encode(Heartbeat(
            node_id=n, strategy="least-loaded", port_range=[20000, 20999],
            capacity=Capacity(cpu=4.0, memory_mb=4096, ports=1000)))))
    return b


async def test_closing_a_round_opens_the_next_at_once(tmp_path: Path) -> None:
    b = _broker(tmp_path, queued=4, nodes=NODES, batch_max=2, max_auctions=1)
    a = b.auctioneer
    a.reconcile(b.now())
    [(first, auction)] = a.auctions.items()
    for n in NODES:
        a.on_bids(Msg(subjects.BIDS.format(node=n), _enc.encode(BidReply(
            auction_id=first, node_id=n,
            answers=[Bid(shape=i, load=0.1, step=0.01, strategy="x")
                     for i in range(len(auction.shapes))]))))
    # No await since: the loop has not run, yet the next round is open.
    assert first not in a.auctions and len(a.auctions) == 1 and a.auctions_total == 2
    [second] = a.auctions.values()
    assert {r.instance_id for r in second.requests} == {"web-2", "web-3"}


async def test_an_auction_that_closes_as_it_opens_does_not_auction_twice(
        tmp_path: Path) -> None:
    b = _broker(tmp_path, queued=3, nodes=(), batch_max=1, max_auctions=3)
    b.auctioneer.reconcile(b.now())  # no node: each auction closes as it opens
    assert b.auctioneer.auctions_total == 3
    assert b.auctioneer.core.inflight == {"web-0", "web-1", "web-2"}


async def test_a_rounds_rfbs_are_written_as_it_opens(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[list[str]] = []

    def write_now(nc: object, batch: list[tuple[str, bytes]]) -> bool:
        written.append([s for s, _ in batch])
        return True

    monkeypatch.setattr(wire, "write_now", write_now)
    b = _broker(tmp_path / "a", queued=2, nodes=NODES, batch_max=2, max_auctions=1)
    b.auctioneer.reconcile(b.now())
    assert written == [[subjects.RFB]] and b.outbox.queued == []  # on the wire as it opened

    written.clear()
    b = _broker(tmp_path / "b", queued=4, nodes=NODES, batch_max=2, max_auctions=2)
    b.outbox._sending = True  # the sender is mid-batch: what it holds goes first
    b.auctioneer.reconcile(b.now())
    assert written == [] and [s for s, _ in b.outbox.queued] == [subjects.RFB] * 2
    b.outbox._sending = False
    b.outbox.flush()
    assert written == [[subjects.RFB] * 2] and b.outbox.queued == []


async def test_the_next_rounds_rfbs_go_out_before_the_closed_rounds_bookkeeping(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reply that closes a round opens the next; its RFBs are on the wire before the
    closed round's events are recorded and its decisions handed to the committer."""
    done: list[str] = []

    def write_now(nc: object, batch: list[tuple[str, bytes]]) -> bool:
        done.extend(s for s, _ in batch)
        return True

    monkeypatch.setattr(wire, "write_now", write_now)
    b = _broker(tmp_path, queued=4, nodes=NODES, batch_max=2, max_auctions=1)
    a = b.auctioneer
    a.reconcile(b.now())
    [(first, auction)] = a.auctions.items()
    emit, submit = b.events.emit, b.committer.submit
    monkeypatch.setattr(b.events, "emit", lambda iid, type_, **kw: (
        done.append(f"{type_} {iid}"), emit(iid, type_, **kw)))
    monkeypatch.setattr(b.committer, "submit", lambda item: (
        done.append("to the committer"), submit(item)))
    done.clear()
    for n in NODES:
        a.on_bids(Msg(subjects.BIDS.format(node=n), _enc.encode(BidReply(
            auction_id=first, node_id=n,
            answers=[Bid(shape=i, load=0.1, step=0.01, strategy="x")
                     for i in range(len(auction.shapes))]))))
    assert a.auctions_total == 2
    assert done == [subjects.RFB, "scheduled web-0", "scheduled web-1", "to the committer"]


async def test_an_auction_closing_as_it_opens_wakes_the_next_pass_for_its_room(
        tmp_path: Path) -> None:
    """The pass that opened it counted its room as taken; the loop's next pass gets it."""
    b = _broker(tmp_path, queued=2, nodes=(), batch_max=1, max_auctions=1)
    b._wake.clear()
    b.auctioneer.reconcile(b.now())
    assert b.auctioneer.auctions_total == 1 and b._wake.is_set()
    b.auctioneer.reconcile(b.now())  # the pass the wake brings
    assert b.auctioneer.auctions_total == 2
