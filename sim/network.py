"""The network between the broker and the nodes: lost and late replies, and how long a round takes.

Rules:
1. A reply is missing (lost, or slower than the bid deadline) with probability
   ``q = loss + (1 - loss) * P(latency > deadline)``, independently per node and auction.
   Whether node i's reply to auction k is missing is a fixed function of (key, k, i), where
   the key is drawn once from the injected `random.Random`: the fast path, which looks only
   at the best few bidders, and the naive path, which looks at every node, see the same
   missing replies and so award the same winners.
2. A round closes at the deadline if any eligible node is silent, else when the slowest of
   its n replies arrives: drawn in one step as the quantile ``F(D) * U^(1/n)`` of the
   latency distribution (the maximum of n draws conditioned on all beating the deadline).
   The round's length is reported as placement latency; it does not delay the state.
"""

from __future__ import annotations

import random

import numpy as np
import numpy.typing as npt

from gavel.sim.distributions import LatencyDist

__all__ = ["NetworkModel"]

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of `x`."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK
    return x ^ (x >> 31)


class NetworkModel:
    def __init__(self, latency: LatencyDist, loss: float, deadline_s: float,
                 rng: random.Random) -> None:
        self.latency = latency
        self.deadline = deadline_s
        self.within = latency.cdf(deadline_s)  # P(latency <= deadline)
        self.missing = loss + (1.0 - loss) * (1.0 - self.within)
        self._key = rng.getrandbits(64)
        self._rng = rng
        self._threshold = int(self.missing * (1 << 64))

    @classmethod
    def perfect(cls) -> NetworkModel:
        """A central scheduler's view: nothing lost, no delay."""
        from gavel.sim.distributions import Constant

        return cls(Constant(value=0.0), 0.0, 1.0, random.Random(0))

    @property
    def lossy(self) -> bool:
        return self._threshold > 0

    def lost(self, auction: int, node: int) -> bool:
        """Rule 1: is node `node`'s reply to auction number `auction` missing?"""
        if self._threshold <= 0:
            return False
        key = (self._key + auction * _GOLDEN + node * 0xD1B54A32D192ED03) & _MASK
        return _mix(key) < self._threshold

    def lost_among(self, auction: int, nodes: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """`lost` for many nodes at once (the same hash, in wrapping uint64 arithmetic)."""
        if self._threshold <= 0:
            return np.zeros(len(nodes), dtype=np.bool_)
        base = np.uint64((self._key + auction * _GOLDEN) & _MASK)
        x = base + nodes.astype(np.uint64) * np.uint64(0xD1B54A32D192ED03)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
        return x < np.uint64(min(self._threshold, _MASK))

    def round_s(self, answering: int, any_silent: bool) -> float:
        """Rule 2: how long the round took, given `answering` replies and whether any is missing."""
        if any_silent:
            return self.deadline
        if answering <= 0:
            return 0.0
        u = self._rng.random() ** (1.0 / answering)
        return min(self.latency.quantile(self.within * u), self.deadline)

    def p_all_answer(self, answering: int) -> float:
        """Probability that none of `answering` further replies is missing."""
        return (1.0 - self.missing) ** answering

    def draw(self) -> float:
        return self._rng.random()
