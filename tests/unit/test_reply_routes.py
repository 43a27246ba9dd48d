"""`broker.replyroutes`: a dry run's id first, then the registered takers in order, else
the auctioneer's."""

from __future__ import annotations

from gavel.broker.replyroutes import ReplyRoutes
from gavel.shared.messages import BidReply


def _reply(aid: str) -> BidReply:
    return BidReply(auction_id=aid, node_id="n1", answers=[])


def test_dry_run_id_goes_to_its_plan_with_the_time() -> None:
    routes, got = ReplyRoutes(), []
    routes.dry["dry1"] = lambda reply, at: got.append((reply.auction_id, at))
    routes.add(lambda reply: got.append(("taker", 0.0)) is None)
    assert routes.take(_reply("dry1"), lambda: 7.5)
    assert got == [("dry1", 7.5)]


def test_takers_asked_in_order_first_true_wins() -> None:
    routes, asked = ReplyRoutes(), []

    def first(reply: BidReply) -> bool:
        asked.append("first")
        return reply.auction_id.startswith("re-")

    def second(reply: BidReply) -> bool:
        asked.append("second")
        return True

    routes.add(first)
    routes.add(second)
    assert routes.take(_reply("re-1"), lambda: 0.0)
    assert asked == ["first"]


def test_reply_nobody_takes_is_the_auctioneers() -> None:
    routes = ReplyRoutes()
    routes.add(lambda reply: False)
    assert not routes.take(_reply("a1"), lambda: 0.0)
