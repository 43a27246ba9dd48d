"""A sampled auction (d = 2) in a real broker takes a preempting offer only once every
candidate was asked: a node with room that was not asked comes before any eviction
(`shared.auctioneer` rule 11)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from gavel.broker.auctioneer import Auctioneer
from gavel.shared import subjects
from gavel.shared.auction import Auction
from gavel.shared.messages import BidReply, Decline, Spec, Victim
from gavel.shared.reasons import Reason
from tests.unit.fuzzkit import Msg
from tests.unit.test_sampled_auction import NODES, sampled_broker, written

__all__ = ["written"]  # the fixture, used by name

URGENT = Spec(name="urgent", command=["true"], cpu=1.0, memory_mb=64, priority=80)
_enc = msgspec.msgpack.Encoder()


def _offers(a: Auctioneer, aid: str, auction: Auction) -> None:
    """Every node asked is full and offers to stop one instance of its own."""
    for n in sorted(auction.eligible):
        a.on_bids(Msg(subjects.BIDS.format(node=n), _enc.encode(BidReply(
            auction_id=aid, node_id=n, answers=[Decline(
                shape=0, reason=Reason.NO_ROOM_CPU, detail="1", evict_load=0.5,
                evict=[Victim(instance_id=f"low-{n}", priority=10, cpu=1.0,
                              memory_mb=64)])]))))


async def test_a_sampled_round_asks_every_candidate_before_it_displaces(
        tmp_path: Path, written: list[str]) -> None:
    b = sampled_broker(tmp_path, {"urgent-1": URGENT})
    a = b.auctioneer
    a.reconcile(b.now())
    [(first, auction)] = a.auctions.items()
    assert len(auction.eligible) == 2
    _offers(a, first, auction)
    [(second, wider)] = a.auctions.items()  # not awarded: asked of 8·d more
    assert second != first and len(wider.eligible) == 16
    _offers(a, second, wider)
    [(third, every)] = a.auctions.items()
    assert every.eligible == set(NODES)
    assert a.core.inflight == {"urgent-1"} and not a.core.reserved
    _offers(a, third, every)  # every candidate asked: the cheapest displacement wins
    assert not a.auctions and set(a.core.reserved) == {"n00"}  # equal offers: the lowest node id
