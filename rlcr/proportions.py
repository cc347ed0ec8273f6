"""Intervals for a rate from its counts (k events of n chances), for rates whose events are rare.

The evaluation's intervals resample tasks (rlcr/stats.py), which is right for success and tokens but
says nothing sensible about a rate with few or no events: a run with 0 false approvals of 6 checked
ones resamples to 0.00 every time and reads 0.00 [0.00, 0.00], as if six observations had proved the
rate is zero. The score interval of Wilson (1927) reads the same counts as 0.00 [0.00, 0.39]: it is
never empty at 0 or n, stays inside [0, 1], and covers close to its level at small n. The difference
of two rates takes Newcombe's hybrid score interval (Newcombe 1998, method 10), built from the two
Wilson intervals, which keeps those properties where the Wald interval (estimate +- z * standard
error) collapses.

Both treat the n chances as independent draws. Events that cluster (several hires of one episode)
make the real spread wider than these intervals; the report says which counts it pooled.
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054
"""The standard normal's 97.5% quantile: two-sided 95% intervals."""


def _check(k: float, n: float) -> None:
    if n <= 0:
        raise ValueError(f"a rate needs at least one chance (n = {n})")
    if not 0 <= k <= n:
        raise ValueError(f"events must lie between 0 and the chances: k = {k}, n = {n}")


def wilson(k: float, n: float, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval (low, high) of the rate k / n."""
    _check(k, n)
    p = k / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2.0 * n)) / denom
    half = z * math.sqrt(p * (1.0 - p) / n + z * z / (4.0 * n * n)) / denom
    return (0.0 if k == 0 else max(0.0, centre - half)), (1.0 if k == n else min(1.0, centre + half))


def newcombe_diff(k1: float, n1: float, k2: float, n2: float, z: float = Z95) -> tuple[float, float, float]:
    """(k1/n1 - k2/n2, low, high): Newcombe's hybrid score interval of the difference of two rates."""
    l1, u1 = wilson(k1, n1, z)
    l2, u2 = wilson(k2, n2, z)
    p1, p2 = k1 / n1, k2 / n2
    d = p1 - p2
    return d, d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


__all__ = ["Z95", "newcombe_diff", "wilson"]
