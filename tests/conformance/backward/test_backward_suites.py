"""The suites' backward cases (conformance/suites/backward.py): valid, covering, listed by the CLI."""

from __future__ import annotations

import json

import pytest

from conformance.cases import space
from conformance.cases.case_tables import DATA
from conformance.cases.covering import coverage
from conformance.suites.backward import BACKWARD_SPACE, DEFAULT_BACKWARD, backward_covering
from conformance.suites.registry import backward_cases, get_suite
from conformance.cli import main


def test_smoke_backward_cases_are_few_small_and_varied() -> None:
    cases = backward_cases("smoke")
    assert 4 <= len(cases) <= 10
    assert all(c.backward and max(k for _, k in c.requests) <= 100 for c in cases)
    feats = set().union(*(c.features() for c in cases))
    assert {"backward", "bwd_deterministic", "gqa", "mqa", "causal", "softcap", "sinks", "alibi"} <= feats
    assert {c.dtype for c in cases} == {"bf16", "fp16"}
    assert {c.id for c in cases} <= {c.id for c in get_suite("smoke")}


@pytest.fixture(scope="module")
def default_backward():
    return backward_cases("default")


def test_default_backward_cases_cover_every_pair_of_the_backward_space(default_backward) -> None:
    assert all(c.backward for c in default_backward)
    assert len({c.id for c in default_backward}) == len(default_backward)
    covered, possible = coverage(default_backward, None, 2, within=BACKWARD_SPACE)
    assert covered == possible > 1000
    # every case stays inside the backward sub-space (a training call: contiguous, no quantization, ...)
    for point in map(space.classify, default_backward):
        assert all(point[a] in levels for a, levels in BACKWARD_SPACE.items() if a not in ("heads", "dims"))
    assert {c.data for c in default_backward} == set(DATA)
    assert sum(c.deterministic for c in default_backward) >= 6
    assert {c.num_heads // c.num_kv_heads for c in default_backward} >= {1, 2, 4, 8}
    assert any(c.dv != c.head_dim for c in default_backward)


def test_covering_only_adds_what_the_hand_picked_cases_miss(default_backward) -> None:
    hand = [c for sweep in DEFAULT_BACKWARD for c in sweep.cases()]
    added = backward_covering(hand)
    assert 0 < len(added) < 200 and [c.id for c in added] == [c.id for c in default_backward[-len(added) :]]
    assert backward_covering(default_backward) == ()  # complete: nothing left to add


def test_cases_json_lists_backward_cases(capsys: pytest.CaptureFixture) -> None:
    assert main(["cases", "--suite", "smoke", "--feature", "backward", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [c["id"] for c in listed] == [c.id for c in backward_cases("smoke")]
    assert all(c["case"]["backward"] and "backward" in c["features"] for c in listed)
