"""Every simulated round goes through `shared.auction.Auction` — the broker's own object.

Rules:
1. `run_round` feeds replies to a real `Auction` and returns its `decide` — the simulator
   never picks a winner itself.
2. The fast path feeds only the replies that can change the outcome, found by `leaders`.
   The award rule (`shared.award`) takes the lowest ``(load, node_id)`` that fits and
   reports a tie when the next that fits has the same load, so the best bid plus the next
   one *with the same load* (if any) decide winner and tie alike. `leaders` walks the
   order book's ranking, which is the award rule's order (`sim.book` rule 2, `sim.cluster`:
   index order is id order), and differs from the rule's own walk in exactly two things:
   it never passes a bid over for want of room (a book's load is what the node bid on its
   own free room, and the round is decided without `free`), and it passes over the replies
   the network lost. The rule itself is still the `Auction`'s: the round is decided by it,
   and the simulator checks the two agree. It exists because the rule's walk needs every
   bid as a `NodeBid`, sorted — thousands per round, where two decide it.
3. A request with soft affinities is ranked at each bid's load plus its node's adjustment
   (`shared.affinity.adjustment`, a node's labels never change): the fast path walks the
   book's row plus that fixed vector, and the round is decided by the `Auction` given the
   nodes' labels, so the broker's own adjustment decides and the two must agree.
4. An unschedulable round's reason depends only on how often each decline reason occurs
   (a shared one, "all full", or the most frequent, ties by name). `reduced_declines`
   keeps that order with counts K, K-1, ..., 1 for the K reasons present, so a handful of
   replies yields the same reason as thousands.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from gavel.shared.auction import Auction, Awarded, Decision
from gavel.shared.messages import Bid, BidReply, Decline, Request

__all__ = ["leaders", "reduced_declines", "run_round", "winner_of"]

Answer = Bid | Decline


def leaders(ranked: Iterable[tuple[float, int]], lost: Callable[[int, int], bool] | None,
            no: int = 0) -> tuple[int, int, int, bool]:
    """Rule 2: the winner and the bid that ties it among ``(load, index)`` bids in award
    order, passing over those ``lost(no, index)`` says the network lost in round `no`; the
    walk ends at the first bid that can no longer tie. Returns the winner's index and the
    tie's (-1: none), the bids looked at (the lost ones included), and whether one was
    lost."""
    winner = tie = -1
    best = 0.0
    walked = 0
    lost_any = False
    for load, idx in ranked:
        if winner >= 0 and load != best:
            break
        walked += 1
        if lost is not None and lost(no, idx):
            lost_any = True
            continue
        if winner < 0:
            winner, best = idx, load
        else:
            tie = idx
            break
    return winner, tie, walked, lost_any


def run_round(auction_id: str, request: Request, replies: Sequence[tuple[str, Answer]],
              silent: Sequence[str], opened: float, deadline_s: float,
              closed: float, labels: Mapping[str, Mapping[str, str]] | None = None
              ) -> Decision:
    """Open an auction for `request`, deliver `replies`, let `silent` nodes say nothing;
    `labels`: the nodes' labels, which a request's soft affinities rank the bids by (the
    `Auction`'s own adjustment, `shared.affinity`)."""
    eligible = [node for node, _ in replies]
    eligible.extend(silent)
    auction = Auction(auction_id, [request], eligible, opened, deadline_s)
    for node, ans in replies:
        auction.receive(BidReply(auction_id=auction_id, node_id=node, answers=[ans]), opened)
    return auction.decide(min(closed, opened + deadline_s), labels=labels)[0]


def reduced_declines(counts: Mapping[str, int], request: Request) -> list[tuple[str, Answer]]:
    """Rule 4: stand-in declines that give the same unschedulable reason as `counts`."""
    kinds = sorted((r for r, n in counts.items() if n > 0), key=lambda r: (-counts[r], r))
    out: list[tuple[str, Answer]] = []
    for rank, reason in enumerate(kinds):
        for copy in range(len(kinds) - rank):
            out.append((f"~{reason}~{copy}",
                        Decline(shape=0, reason=reason)))
    return out


def winner_of(decision: Decision) -> str | None:
    return decision.winner.node_id if isinstance(decision, Awarded) else None
