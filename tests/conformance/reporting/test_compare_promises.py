"""compare's promises that the rule tests of test_compare.py leave open (found by `nox -s mutation`): each test is
named after the promise it checks."""

from __future__ import annotations

import dataclasses

import pytest

from conformance.records import Timing
from conformance.reporting.compare import compare_results
from tests.conformance.reporting.test_compare import rec


def _timed(r, p20: float, median: float, p80: float):
    return dataclasses.replace(r, timing=Timing(median_ms=median, p20_ms=p20, p80_ms=p80, reps=50, method="test"))


def test_auto_margin_is_the_p20_p80_spread_relative_to_the_median() -> None:
    """Spread (p80 - p20) / median: 0.8 / 2.0 = 0.4, not 0.8 x 2.0; the larger of the two sides counts."""
    old = [_timed(rec(f"c{i}"), 1.6, 2.0, 2.4) for i in range(3)]
    new = [_timed(rec(f"c{i}"), 1.9, 2.0, 2.1) for i in range(3)]
    cmp = compare_results(old, new)
    assert cmp.margin_auto and cmp.margin == pytest.approx(0.4)


def test_auto_margin_of_a_zero_median_is_no_spread() -> None:
    """A timing of 0 ms (a kernel below the clock's resolution) has no spread: the margin is the 2 % floor."""
    old = [_timed(rec(f"c{i}"), 0.0, 0.0, 0.0) for i in range(3)]
    cmp = compare_results(old, old)
    assert cmp.margin == pytest.approx(0.02) and not cmp.perf_regressions
