"""Every simulated round goes through `shared.auction.Auction` — the broker's own object.

Rules:
1. `run_round` feeds replies to a real `Auction` and returns its `decide` — the simulator
   never picks a winner itself.
2. The fast path feeds only the replies that can change the outcome. The award rule takes
   the lowest ``(load, node_id)`` and reports a tie when another bid has the same load, so
   the best bid plus the next one *with the same load* (if any) decide winner and tie alike.
3. An unschedulable round's reason depends only on how often each decline reason occurs
   (a shared one, "all full", or the most frequent, ties by name). `reduced_declines`
   keeps that order with counts K, K-1, ..., 1 for the K reasons present, so a handful of
   replies yields the same reason as thousands.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gavel.shared.auction import Auction, Awarded, Decision
from gavel.shared.messages import Bid, BidReply, Decline, Request

__all__ = ["reduced_declines", "run_round", "winner_of"]

Answer = Bid | Decline


def run_round(auction_id: str, request: Request, replies: Sequence[tuple[str, Answer]],
              silent: Sequence[str], opened: float, deadline_s: float,
              closed: float) -> Decision:
    """Open an auction for `request`, deliver `replies`, let `silent` nodes say nothing."""
    eligible = [node for node, _ in replies]
    eligible.extend(silent)
    auction = Auction(auction_id, [request], eligible, opened, deadline_s)
    for node, ans in replies:
        auction.receive(BidReply(auction_id=auction_id, node_id=node, answers=[ans]), opened)
    return auction.decide(min(closed, opened + deadline_s))[0]


def reduced_declines(counts: Mapping[str, int], request: Request) -> list[tuple[str, Answer]]:
    """Rule 3: stand-in declines that give the same unschedulable reason as `counts`."""
    kinds = sorted((r for r, n in counts.items() if n > 0), key=lambda r: (-counts[r], r))
    out: list[tuple[str, Answer]] = []
    for rank, reason in enumerate(kinds):
        for copy in range(len(kinds) - rank):
            out.append((f"~{reason}~{copy}",
                        Decline(shape=0, reason=reason)))
    return out


def winner_of(decision: Decision) -> str | None:
    return decision.winner.node_id if isinstance(decision, Awarded) else None
