"""Suites: sizes, unique ids, stable order, feature coverage."""

from __future__ import annotations

import pytest

from conformance.cases.case import FEATURES, AttentionCase
from conformance.suites.peers.fa2 import SEQLENS as _PEER_SEQLENS
from conformance.suites.registry import get_suite, suite_names

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
    "peer-fa2-kvcache": (13964, 13964),
    "peer-vllm-flash": (296, 296),
    "peer-vllm-flashmla": (144, 144),
    "peer-sgl": (1330, 1330),
}


#: the two large peer grids (120,597 and 82,036 cases) are checked the same way in test_peers.py, beside their
#: grids, so a test process builds them once
IN_TEST_PEERS = ("peer-fa3", "peer-fa4")


@pytest.mark.parametrize("name", [name for name in suite_names() if name not in IN_TEST_PEERS])
def test_suite_size_and_unique_ids(name: str) -> None:
    cases = get_suite(name)
    lo, hi = SIZES[name]
    assert lo <= len(cases) <= hi
    ids = [c.id for c in cases]
    assert len(set(ids)) == len(ids)
    # stable order: the same cases, batch labels included (an id is a function of the two), in the same order; a
    # peer suite is built once per process, so its second list holds the same objects (compared without rehashing
    # 120,000 ids; tests/conformance/cases/test_peers.py walks its grids twice)
    again = get_suite(name)
    assert again == cases and [c.batch_name for c in again] == [c.batch_name for c in cases]
    assert all(bool(c.engine) == (name == "engines") for c in cases), "engine cases live in the engines suite"


#: features a suite of its own exercises, not smoke and default: their case lists (ids and counts) predate the
#: feature and stay as they were (test_ids_golden.py)
ELSEWHERE = {"append_uneven": "peer-fa3"}


@pytest.mark.parametrize("name", ["smoke", "default"])
def test_suite_covers_every_feature(name: str) -> None:
    covered = set().union(*(c.features() for c in get_suite(name)))
    missing = set(FEATURES) - covered - {"fp32"} - set(ELSEWHERE)
    assert not missing, f"{name} never exercises {sorted(missing)}"


def test_a_feature_left_to_another_suite_is_exercised_there() -> None:
    for feature, suite in ELSEWHERE.items():
        assert any(feature in c.features() for c in get_suite(suite)), (feature, suite)


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


def test_peer_fa2_kvcache_is_flash_attentions_own_grid():
    """Every combination of test_flash_attn_kvcache's expressible parameters (v2.8.3), none refused by the case
    model, each mapped as the test builds it."""
    import itertools

    everything = get_suite("peer-fa2-kvcache")
    # 9 (seqlen_q, seqlen_k) x 6 d x 2 paged x 2 causal x 2 local x 2 alibi x 2 new_kv x 3 mha x 2 num_splits
    n_eq = 9 * 6 * 2 * 2 * 2 * 2 * 2 * 3 * 2
    cases, short = everything[:n_eq], everything[n_eq:]
    assert all(c.append_len is None for c in cases)
    # seqlen_new_eq_seqlen_q=False, appended: the appending combinations with seqlen_q > 1 (the 2 pairs with
    # seqlen_q = 1 draw seqlen_new = 1 = seqlen_q) whose seqlen_new draw fell below seqlen_q
    assert short and all(c.append and 1 <= c.append_len < c.q_lens[0] for c in short)
    assert len(short) < 7 * 6 * 2 * 2 * 2 * 2 * 3 * 2  # 7 pairs with seqlen_q > 1; alibi, local, causal, paged, ...
    for c in short:  # cache_seqlens in [0, seqlen_k - seqlen_new], then the seqlen_new new keys
        assert all(c.append_len <= k <= max(sk for sq, sk in _PEER_SEQLENS if sq == c.q_lens[0]) for k in c.kv_lens)
    assert any(k < c.q_lens[0] for c in short for k in c.kv_lens)  # an empty cache: fewer keys than query rows
    assert {c.head_dim for c in cases} == {32, 59, 64, 80, 128, 256} and {c.dtype for c in cases} == {"fp16"}
    assert {(c.num_heads, c.num_kv_heads) for c in cases} == {(6, 6), (6, 1), (6, 3)}
    assert {c.num_splits for c in cases} == {1, None} and {c.block_size for c in cases} == {None, 256}
    for c in cases:
        assert c.batch == 2 and len(set(c.q_lens)) == 1
        sq = c.q_lens[0]
        if c.append:  # seqlen_new == seqlen_q new keys after a cache of 0 .. seqlen_k - seqlen_q
            assert all(sq <= k for k in c.kv_lens)
        else:
            assert all(k >= 1 for k in c.kv_lens)
        if c.causal and c.window != (None, None):
            assert c.window[1] == 0  # causal sets the right side to 0
    pairs = {(c.q_lens[0], max(c.kv_lens)) for c in itertools.islice(cases, 0, None, 97)}
    assert all(k <= 20000 for _, k in pairs)  # the 128k pairs are left out (module docstring)
