"""The order book: every node's cached answer to every request shape, bidders in award order.

Rule 1: a cached answer is exactly what `shared.strategies.answer` returned for the node's
current view — `answer` is a pure function of (strategy, request, view), and the request
enters it only through its shape (cpu, memory, ports, labels), so the answer stays valid
until that node's own state changes. Then, and only then, `Books.update` asks again.
Rule 2: ``ranked`` holds ``(load, node index)`` of every bidding node, sorted; since index
order is id order, ``ranked[0]`` is the award rule's winner over all bids of the shape.
``codes`` mirrors the declines as an array (the reason's index in `REASONS`, -1 for none),
so a round can ask which declines the network lost without a Python loop over nodes.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from gavel.shared.feasibility import NodeView
from gavel.shared.messages import Bid, Decline, Request
from gavel.shared.reasons import Reason
from gavel.shared.strategies import Strategy, answer

__all__ = ["REASONS", "BidBook", "Books", "reason_code"]

#: decline reasons by code; a reason outside `Reason` gets a new code when first seen
REASONS: list[str] = [r.value for r in Reason]
_CODES = {r: i for i, r in enumerate(REASONS)}


def reason_code(reason: str) -> int:
    code = _CODES.get(reason)
    if code is None:
        code = _CODES[reason] = len(REASONS)
        REASONS.append(reason)
    return code

Answer = Bid | Decline


class BidBook:
    """One request shape: each node's answer, the bidders ranked, declines counted."""

    __slots__ = ("answers", "codes", "declines", "ranked", "request")

    def __init__(self, request: Request, size: int) -> None:
        self.request = request
        self.answers: list[Answer | None] = [None] * size
        self.ranked: list[tuple[float, int]] = []
        self.declines: Counter[str] = Counter()
        self.codes: npt.NDArray[np.int16] = np.full(size, -1, dtype=np.int16)

    def set(self, idx: int, new: Answer | None) -> None:
        old = self.answers[idx]
        if old is not None:
            if isinstance(old, Bid):
                ranked = self.ranked
                del ranked[bisect_left(ranked, (old.load, idx))]
            else:
                self.declines[old.reason] -= 1
                self.codes[idx] = -1
        self.answers[idx] = new
        if new is not None:
            if isinstance(new, Bid):
                insort(self.ranked, (new.load, idx))
            else:
                self.declines[new.reason] += 1
                self.codes[idx] = reason_code(new.reason)

    def decline_counts(self) -> dict[str, int]:
        return {r: n for r, n in self.declines.items() if n > 0}


class Books:
    """One `BidBook` per shape, kept current node by node."""

    def __init__(self, requests: Sequence[Request], size: int) -> None:
        self.books = [BidBook(r, size) for r in requests]

    def __getitem__(self, shape: int) -> BidBook:
        return self.books[shape]

    def update(self, idx: int, strategy: Strategy, view: NodeView | None) -> None:
        """Re-ask node `idx` for every shape; None removes it (it cannot answer)."""
        if view is None:
            for book in self.books:
                book.set(idx, None)
            return
        for book in self.books:
            book.set(idx, answer(strategy, book.request, view))
