"""Where a bid reply goes when its auction is not the auctioneer's own.

Rules:
1. A dry run's auction (`broker.planner`) is registered by its id while the plan waits;
   a reply for that id is the plan's, handed the time it arrived.
2. Otherwise each taker given at construction (re-auction: `broker.reauction`) is asked in
   the order it registered; the first that answers True took the reply.
3. A reply nobody took is the auctioneer's. The routes are built before the auctioneer and
   the parts that register with it, so nothing is attached after construction.
"""

from __future__ import annotations

from collections.abc import Callable

from gavel.shared.messages import BidReply


class ReplyRoutes:
    def __init__(self) -> None:
        #: Dry runs' auctions by id (rule 1).
        self.dry: dict[str, Callable[[BidReply, float], None]] = {}
        self._takers: list[Callable[[BidReply], bool]] = []

    def add(self, taker: Callable[[BidReply], bool]) -> None:
        """Rule 2: `taker` is asked for every reply not a dry run's."""
        self._takers.append(taker)

    def take(self, reply: BidReply, now: Callable[[], float]) -> bool:
        """True when the reply went elsewhere than the auctioneer (rules 1-3)."""
        if self.dry and (dry := self.dry.get(reply.auction_id)) is not None:
            dry(reply, now())
            return True
        return any(taker(reply) for taker in self._takers)
