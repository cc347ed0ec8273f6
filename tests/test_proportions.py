"""Rate intervals from counts (rlcr/proportions.py): Wilson's score interval and Newcombe's interval for a
difference, checked against published values and scipy, and what they do where resampling fails (no events)."""

from __future__ import annotations

import pytest
from scipy.stats import binomtest

from rlcr.proportions import newcombe_diff, wilson


@pytest.mark.parametrize(("k", "n"), [(0, 6), (3, 54), (14, 177), (81, 263), (6, 6), (1, 2)])
def test_wilson_is_scipys_score_interval(k, n):
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert wilson(k, n) == pytest.approx((ci.low, ci.high), abs=1e-12)


def test_no_events_give_an_interval_from_zero_not_a_point():
    lo, hi = wilson(0, 6)
    assert lo == 0.0 and hi == pytest.approx(0.3903, abs=1e-4)  # six chances do not prove a rate of zero
    assert wilson(6, 6)[1] == 1.0
    assert wilson(0, 600)[1] < wilson(0, 6)[1] / 50  # the interval narrows with the chances


def test_newcombe_matches_the_papers_examples():
    # Newcombe (1998), Statistics in Medicine 17:873-890, table II, method 10
    d, lo, hi = newcombe_diff(56, 70, 48, 80)
    assert (d, lo, hi) == pytest.approx((0.2, 0.0524, 0.3339), abs=1e-4)
    assert newcombe_diff(9, 10, 3, 10)[1:] == pytest.approx((0.1705, 0.8090), abs=1e-4)


def test_a_difference_with_an_empty_side_is_wide_not_certain():
    # 3 of 54 before, 0 of 6 after: resampling tasks read this as -0.06 [-0.12, +0.00]
    d, lo, hi = newcombe_diff(0, 6, 3, 54)
    assert d == pytest.approx(-3 / 54) and lo < d < 0 < hi and hi > 0.3


@pytest.mark.parametrize(("k", "n"), [(1, 0), (-1, 5), (6, 5)])
def test_impossible_counts_are_refused(k, n):
    with pytest.raises(ValueError, match="chance|events"):
        wilson(k, n)
