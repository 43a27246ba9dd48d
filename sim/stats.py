"""Confidence intervals over seeds: a mean and a 95% Student t interval per figure.

Rules:
1. N seeds give N values of a figure; the interval is ``mean ± t(0.975, N-1) * s / sqrt(N)``
   with ``s`` the sample standard deviation. One value has no interval (``low`` and ``high``
   are None): a single seed cannot say how much a figure moves from seed to seed.
2. Two figures differ only when both have intervals and the intervals do not overlap; equal
   intervals, touching ones and missing ones are "no difference".
3. t quantiles come from a table for 1 to 30 degrees of freedom and from the Cornish-Fisher
   expansion above that (within 1e-4 of the exact value there), so no statistics package
   is needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import msgspec

__all__ = ["Interval", "differ", "interval", "t_quantile"]

#: t(0.975, df) for df = 1..30
_T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
         2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
         2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)
_Z975 = NormalDist().inv_cdf(0.975)


class Interval(msgspec.Struct, kw_only=True):
    """A figure over seeds: its mean, its 95% interval (None for one seed), every value."""

    mean: float
    low: float | None = None
    high: float | None = None
    values: list[float] = []

    @property
    def half(self) -> float | None:
        return None if self.high is None else self.high - self.mean


def t_quantile(df: int) -> float:
    """The 97.5th percentile of Student's t with `df` degrees of freedom (rule 3)."""
    if df < 1:
        raise ValueError("t needs at least one degree of freedom")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def _r(x: float) -> float:
    return round(x, 6)


def interval(values: Sequence[float]) -> Interval:
    """Rule 1: the mean and 95% interval of `values` (one per seed)."""
    n = len(values)
    if n == 0:
        raise ValueError("an interval needs at least one value")
    mean = math.fsum(values) / n
    if n == 1:
        return Interval(mean=_r(mean), values=[_r(v) for v in values])
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    half = t_quantile(n - 1) * math.sqrt(var / n)
    return Interval(mean=_r(mean), low=_r(mean - half), high=_r(mean + half),
                    values=[_r(v) for v in values])


def differ(a: Interval, b: Interval) -> bool:
    """Rule 2: do the two intervals leave a gap between them?"""
    if a.low is None or a.high is None or b.low is None or b.high is None:
        return False
    return a.high < b.low or b.high < a.low
