"""Suites: sizes, unique ids, stable order, feature coverage."""

from __future__ import annotations

import pytest

from conformance.cases.case import FEATURES, AttentionCase
from conformance.cases.suites import get_suite, suite_names

SIZES = {
    "smoke": (80, 170),
    "default": (1500, 6000),
    "full": (10000, 40000),
    "perf": (20, 200),
    "engines": (10, 2000),
    "models": (300, 3000),
    "graphs": (20, 100),
    "limits": (300, 1000),
    "training": (30, 60),
}


@pytest.mark.parametrize("name", suite_names())
def test_suite_size_and_unique_ids(name: str) -> None:
    cases = get_suite(name)
    lo, hi = SIZES[name]
    assert lo <= len(cases) <= hi
    ids = [c.id for c in cases]
    assert len(set(ids)) == len(ids)
    assert ids == [c.id for c in get_suite(name)]  # stable order
    assert all(bool(c.engine) == (name == "engines") for c in cases), "engine cases live in the engines suite"


@pytest.mark.parametrize("name", ["smoke", "default"])
def test_suite_covers_every_feature(name: str) -> None:
    covered = set().union(*(c.features() for c in get_suite(name)))
    missing = set(FEATURES) - covered - {"fp32"}
    assert not missing, f"{name} never exercises {sorted(missing)}"


def test_sweep_axes_required_by_the_design() -> None:
    full = get_suite("full")
    assert {1, 16, 32, 64, 128, 256} <= {c.block_size for c in full if c.paged}
    assert max(k for c in full for _, k in c.requests) >= 32768
    assert {32, 64, 96, 128, 256} <= {c.head_dim for c in full}
    ratios = {c.num_heads // c.num_kv_heads for c in full}
    assert {1, 2, 4, 8} <= ratios
    smoke = get_suite("smoke")
    assert all(max(k for _, k in c.requests) <= 300 for c in smoke)


def test_cases_round_trip_through_json() -> None:
    for case in get_suite("smoke"):
        assert AttentionCase.from_json(case.to_json()).id == case.id


def test_unknown_suite_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="suite must be one of"):
        get_suite("nope")
