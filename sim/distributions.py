"""Probability distributions a scenario names, as tagged msgspec Structs.

Rules: a distribution draws only from the `random.Random` it is handed (never a global
one), so a seed fixes every sample; continuous ones also give their ``cdf`` and inverse
(``quantile``), which the network model needs to draw the slowest of n replies in one step.
Request sizes are discrete (`Choice`): real operators ask for a few sizes, and a finite set
of request shapes is what lets the simulator cache every node's bid per shape.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from itertools import accumulate
from statistics import NormalDist
from typing import Annotated

import msgspec

__all__ = [
    "Choice",
    "Constant",
    "DurationDist",
    "Exponential",
    "Forever",
    "LatencyDist",
    "Lognormal",
    "Uniform",
    "pick_weighted",
]

PosFloat = Annotated[float, msgspec.Meta(gt=0.0)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0.0)]
_UNIT = NormalDist()


class _Dist(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True,
            tag_field="dist"):
    pass


class Constant(_Dist, tag="constant", frozen=True, kw_only=True):
    value: NonNegFloat

    def sample(self, rng: random.Random) -> float:
        del rng
        return self.value

    def cdf(self, x: float) -> float:
        return 1.0 if x >= self.value else 0.0

    def quantile(self, u: float) -> float:
        del u
        return self.value


class Uniform(_Dist, tag="uniform", frozen=True, kw_only=True):
    low: NonNegFloat
    high: NonNegFloat

    def sample(self, rng: random.Random) -> float:
        return self.quantile(rng.random())

    def cdf(self, x: float) -> float:
        if self.high <= self.low:
            return 1.0 if x >= self.low else 0.0
        return min(1.0, max(0.0, (x - self.low) / (self.high - self.low)))

    def quantile(self, u: float) -> float:
        return self.low + (self.high - self.low) * u


class Exponential(_Dist, tag="exponential", frozen=True, kw_only=True):
    mean: PosFloat

    def sample(self, rng: random.Random) -> float:
        return self.quantile(rng.random())

    def cdf(self, x: float) -> float:
        return 0.0 if x <= 0 else 1.0 - math.exp(-x / self.mean)

    def quantile(self, u: float) -> float:
        return -self.mean * math.log1p(-min(u, 1.0 - 1e-16))


class Lognormal(_Dist, tag="lognormal", frozen=True, kw_only=True):
    median: PosFloat
    sigma: NonNegFloat

    def sample(self, rng: random.Random) -> float:
        return self.quantile(rng.random())

    def cdf(self, x: float) -> float:
        if x <= 0:
            return 0.0
        if self.sigma == 0:
            return 1.0 if x >= self.median else 0.0
        return _UNIT.cdf(math.log(x / self.median) / self.sigma)

    def quantile(self, u: float) -> float:
        u = min(max(u, 1e-16), 1.0 - 1e-16)
        return self.median * math.exp(self.sigma * _UNIT.inv_cdf(u))


class Forever(_Dist, tag="forever", frozen=True, kw_only=True):
    """A long-running service: it never ends on its own."""

    def sample(self, rng: random.Random) -> float:
        del rng
        return math.inf


LatencyDist = Constant | Uniform | Exponential | Lognormal
DurationDist = Constant | Uniform | Exponential | Lognormal | Forever


class Choice(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A discrete size: one of `values`, with optional relative `weights` (default equal)."""

    values: Annotated[list[float], msgspec.Meta(min_length=1)]
    weights: list[NonNegFloat] = []

    def problem(self) -> str | None:
        """Why this choice is unusable, or None."""
        if self.weights and len(self.weights) != len(self.values):
            return f"weights has {len(self.weights)} entries, expected {len(self.values)}"
        if self.weights and sum(self.weights) <= 0:
            return "weights must not all be zero"
        if any(v <= 0 for v in self.values):
            return "values must be greater than zero"
        return None

    def table(self) -> tuple[list[float], list[float]]:
        """(values, cumulative weights) for `pick_weighted`."""
        weights = self.weights or [1.0] * len(self.values)
        return list(self.values), list(accumulate(weights))


def pick_weighted(rng: random.Random, cumulative: list[float]) -> int:
    """Index drawn with probability proportional to the weights behind `cumulative`."""
    return min(bisect_right(cumulative, rng.random() * cumulative[-1]), len(cumulative) - 1)
