"""The peer suites: each is its source's own grid (sizes as products of the source's value lists), spot-checked
against the source's values, every point without a case counted by reason, registered as a suite."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections import Counter

import pytest

from conformance.cases.case import AttentionCase
from conformance.suites.peers import PEERS, PEER_SUITES
from conformance.suites.peers import fa3, fa4, sgl, vllm
from conformance.suites.peers.grid import REFUSED, SAME_CALL, Dropped, PeerSuite, walk, walk_part
from conformance.suites.registry import SUITES, get_suite


@pytest.fixture(scope="module")
def fa3_points():
    return fa3.PEER_FA3.points()


def _by_test(points, test):
    return [p for p in points if p.test == test]


def _digest(cases) -> str:
    """The SHA-256 of the cases' ids, in order, one a line: pins a suite's earlier cases, ids and order."""
    return hashlib.sha256("\n".join(c.id for c in cases).encode()).hexdigest()


# ----------------------------------------------------------------------------------------------- the grid walk
def test_walk_keeps_every_point_with_its_reason():
    """A skip has no point, a Dropped keeps its reason, a refusal its message, and the product runs first axis
    slowest."""

    def make(a, b):
        if a == 0 and b == "x":
            return None
        if a == 1 and b == "x":
            raise Dropped(SAME_CALL)
        return AttentionCase(((1, 4),), num_heads=2, num_kv_heads=2 if a != 2 else 3, head_dim=8)

    points = list(walk("t", (("a", (0, 1, 2)), ("b", ("x", "y"))), make))
    assert [p.values for p in points] == [
        {"a": 0, "b": "y"},
        {"a": 1, "b": "x"},
        {"a": 1, "b": "y"},
        {"a": 2, "b": "x"},
        {"a": 2, "b": "y"},
    ]
    assert [bool(p.case) for p in points] == [True, False, True, False, False]
    assert points[1].dropped == SAME_CALL
    assert points[3].dropped.startswith(f"{REFUSED}: num_heads (2) must be a positive multiple")


def test_a_grid_walked_in_two_parts_has_every_point_once_the_second_part_last():
    """walk_part over a predicate and over its negation: the points of walk, each part in grid order."""

    def make(a, b):
        if a == 0 and b == "x":
            return None  # the test's skip: no point in either part
        if a == 2 and b == "y":
            raise Dropped(SAME_CALL)
        return AttentionCase(((1, 4),), num_heads=2, num_kv_heads=2, head_dim=8 * (a + 1))

    axes = (("a", (0, 1, 2)), ("b", ("x", "y")))

    def late(a, b):
        return a == 1

    first = list(walk_part("t", axes, make, lambda **p: not late(**p)))
    second = list(walk_part("t", axes, make, late))
    assert [p.values for p in first] == [{"a": 0, "b": "y"}, {"a": 2, "b": "x"}, {"a": 2, "b": "y"}]
    assert [p.values for p in second] == [{"a": 1, "b": "x"}, {"a": 1, "b": "y"}]
    assert first[2].dropped == SAME_CALL and all(p.case is not None for p in second)
    assert sorted(first + second, key=repr) == sorted(walk("t", axes, make), key=repr)


def test_a_point_whose_case_another_point_has_is_the_same_call():
    """Two combinations that build one case: the second is kept as SAME_CALL, so a suite never repeats an id."""

    def grids():
        def make(a):
            return AttentionCase(((1, 4),), num_heads=2, num_kv_heads=2, head_dim=8 if a < 2 else 16)

        yield from walk("t", (("a", (0, 1, 2)),), make)

    suite = PeerSuite("peer-test-same", "here", ("sdpa-cpu",), grids)
    assert [p.dropped for p in suite.points()] == ["", SAME_CALL, ""]
    assert len(suite.cases()) == 2 and suite.dropped() == Counter({SAME_CALL: 1})
    assert "3 points of the peer's grid, 2 cases; without a case: same call as another point 1" in suite.summary()


# ----------------------------------------------------------------------------------------------- registration
def test_every_peer_suite_is_a_suite():
    assert (
        set(PEER_SUITES)
        == set(PEERS)
        == {
            "peer-fa2-kvcache",
            "peer-fa3",
            "peer-fa4",
            "peer-vllm-flash",
            "peer-vllm-flashmla",
            "peer-sgl",
        }
    )
    assert all(name in SUITES for name in PEERS)
    for suite in PEERS.values():
        assert suite.backends and suite.source


def test_cases_cli_prints_a_peer_suites_grid(tmp_path):
    """``attnconf cases --suite peer-vllm-flash`` lists the cases and one line of the grid's points."""
    out = subprocess.run(
        [sys.executable, "-m", "conformance", "cases", "--suite", "peer-vllm-flash", "--case", "*peervllmcascpre*"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    ).stdout
    assert "\n72 cases;" in out
    assert out.rstrip().splitlines()[-1].startswith("peer-vllm-flash: 296 points of the peer's grid, 296 cases;")


# ----------------------------------------------------------------------------------------------- peer-fa3
def test_fa3_output_is_the_forks_grid(fa3_points):
    """test_flash_attn_output: 12 (cp, causal, local) x 11 (d, dv, sink) x 20 pairs x 2 softcaps x 3 heads x 3 dtypes
    x 2 num_splits points; context parallelism without causal refused by the case model."""
    points = _by_test(fa3_points, "test_flash_attn_output")
    # (cp, causal, local): local F: 5 cp x 2 causal; local T: cp 1 only (the test's skip) x 2 causal
    # (d, dv, sink): no sink: 64, 96, 128, 256 + 192 with dv 128 and 192; sink: the five head dims
    assert len(points) == 12 * 11 * 20 * 2 * 3 * 3 * 2 == 95040
    refused = [p for p in points if p.case is None]
    assert len(refused) == 4 * 11 * 20 * 2 * 3 * 3 * 2  # cp > 1 without causal
    assert all(p.dropped.startswith(REFUSED) and "cp_world > 1 needs causal=True" in p.dropped for p in refused)
    assert all(p.values["cp"][0] > 1 and not p.values["causal"] for p in refused)
    cases = [p.case for p in points if p.case is not None]
    assert len(cases) == 63360
    assert {(c.num_heads, c.num_kv_heads) for c in cases} == {(16, 16), (16, 1), (16, 2)}
    assert {c.head_dim for c in cases} == set(fa3.HEAD_DIMS) == {64, 96, 128, 192, 256}
    assert {(c.head_dim, c.dv) for c in cases if c.dv != c.head_dim} == {(192, 128)}
    assert not any(c.sinks and c.dv != c.head_dim for c in cases)  # sinks: dv_vals = [d]
    assert {(c.cp_world, c.cp_rank) for c in cases} == {(1, 0), (8, 0), (8, 7), (4, 3), (2, 0)}
    assert all(c.causal and not c.has_window for c in cases if c.cp_world > 1)
    assert {c.num_splits for c in cases} == {1, 3} and {c.softcap for c in cases} == {None, 15.0}
    assert {(c.dtype, c.quant, c.descale) for c in cases} == {
        ("bf16", "none", None),
        ("fp16", "none", None),
        ("bf16", "fp8_e4m3", "head"),
    }
    for c in cases:
        (sq, sk), *rest = c.requests
        assert all(r == (sq, sk) for r in rest) and (sq, sk) in fa3.OUTPUT_SEQLENS
        assert c.batch == (9 if sk <= 2048 else 2)
        if c.has_window:
            assert all(w is not None and 0 <= w < sk for w in c.window) and (not c.causal or c.window[1] == 0)


def test_fa3_output_spot_check(fa3_points):
    """One point mapped as the test builds its call: (8, 7) context parallelism, (113, 203), gqa, fp8, sinks."""
    want = {
        "cp": (8, 7, 0), "seqlens": (113, 203), "test_sink": True, "d": 128, "causal": True, "local": False,
        "softcap": 15.0, "mha_type": "gqa", "dtype": "fp8_e4m3", "dv": None, "num_splits": 3,
    }  # fmt: skip
    (point,) = [p for p in _by_test(fa3_points, "test_flash_attn_output") if p.values == want]
    c = point.case
    assert c.requests == ((113, 203),) * 9 and (c.num_heads, c.num_kv_heads, c.head_dim, c.dv) == (16, 2, 128, 128)
    assert (c.cp_world, c.cp_rank, c.causal, c.window, c.sinks, c.softcap, c.num_splits) == (
        8, 7, True, (None, None), True, 15.0, 3,
    )  # fmt: skip
    assert (c.dtype, c.quant, c.descale, c.batch_name) == ("bf16", "fp8_e4m3", "head", "peerfa3out")


def test_fa3_varlen_is_the_forks_grid(fa3_points):
    """test_flash_attn_varlen_output: 4 (causal, local) x 11 x 20 pairs x 2 softcaps x 3 heads x 3 dtypes x 3
    num_splits; the padding masks drawn as generate_random_padding_mask draws them."""
    points = _by_test(fa3_points, "test_flash_attn_varlen_output")
    assert len(points) == 4 * 11 * 20 * 2 * 3 * 3 * 3 == 47520
    dropped = Counter(p.dropped for p in points if p.case is None)
    assert dropped == Counter({SAME_CALL: 3})  # (1, 1) and (2, 1) draw the same lengths three times
    cases = [p.case for p in points if p.case is not None]
    assert {(c.num_heads, c.num_kv_heads) for c in cases} == {(6, 6), (6, 1), (6, 2)}
    assert {c.num_splits for c in cases} == {1, 3, None}
    for p in points:
        if p.case is None:
            continue
        sq, sk = p.values["seqlens"]
        c = p.case
        assert c.batch == 9 and c.batch_name == "peerfa3var"
        assert all(max(1, sq - 20) <= q <= sq for q in c.q_lens)
        assert [c.kv_lens[b] for b in (0, 5, 8)] == [0, 0, 0]  # zero_lengths: every 5th and the last
        assert all(max(0, sk - 20) <= k <= sk for b, k in enumerate(c.kv_lens) if b not in (0, 5, 8))


def test_fa3_kvcache_is_the_forks_grid(fa3_points):
    """test_flash_attn_kvcache: 36 (pair, page size) the test runs x 864; its appends of other than seqlen_q new keys
    (append_len) and into an fp8 cache come after the other points, the varlen_q appends with a count of new keys per
    sequence (append_lens) last, none pending; seqlen_new_eq_seqlen_q=False without new keys or with a seqlen_new
    draw of seqlen_q the same call."""
    points = _by_test(fa3_points, "test_flash_attn_kvcache")
    pages = sum(1 for _, sk in fa3.KVCACHE_SEQLENS for page in fa3.KVCACHE_PAGE_SIZES if page is None or sk % page == 0)
    assert pages == 11 + 11 + 8 + 6
    # varlen_q 2 x seqlen_new_eq 2 x (causal, local) 3 x new_kv 2 x heads 3 x dtypes 2 x num_splits 3 x metadata 2
    assert len(points) == pages * 864 == 31104
    per = pages * 3 * 3 * 3 * 2  # (causal, local) x heads x num_splits x metadata, one dtype, one (varlen, eq) pair
    late = [fa3._late_append(**p.values) for p in points]
    assert late == sorted(late) and sum(late) == per * 7  # of the 8 (varlen_q, eq, dtype) appends, all but one
    uneven = [p.case is not None and bool(p.case.append_lens) for p in points]
    assert uneven == sorted(uneven) and sum(uneven) == 5934  # the uneven appends after every other point
    dropped = Counter(p.dropped for p in points if p.case is None)
    # SAME_CALL: no new_kv with eq False (both dtypes, both varlen_q), and 1,806 eq False draws of seqlen_new ==
    # seqlen_q (every one at seqlen_q 1); the varlen_q appends whose draws are neither q_len nor one count are cases
    assert dropped == Counter({SAME_CALL: per * 4 + 1806})
    for p in points:
        v, sq = p.values, p.values["seqlens"][0]
        if p.case is not None and p.case.append_lens:
            assert v["new_kv"] and v["varlen_q"] and sq > 1  # at seqlen_q 1 every sequence appends its 1 token
            assert "append_uneven" in p.case.features() and "_appendv" in p.case.id
        if p.dropped == SAME_CALL:
            assert not v["seqlen_new_eq_seqlen_q"]
        if v["new_kv"] and not v["seqlen_new_eq_seqlen_q"] and sq == 1:
            assert p.dropped == SAME_CALL  # seqlen_new = randint(1, 2) is seqlen_q
    cases = [p for p in points if p.case is not None]
    assert len(cases) == 15588 + 5934
    # the 9,720 cases the grid had before its appends became cases: their ids and order unchanged
    assert sum(1 for p in cases if not fa3._late_append(**p.values)) == 9720
    assert _digest(p.case for p in cases[:9720]) == "59dde6d5a94d9ca7188234dd3d4d73709c8c2639d867e913a1a3c4be8699b01f"
    # the 15,588 cases before the uneven appends became cases (append_lens): their ids and order unchanged
    assert _digest(p.case for p in cases[:15588]) == "82d79af4b300bc66ee528a288a478fa1a328ac239cbc63f0476676a09369f3e0"
    assert _digest(p.case for p in cases[15588:]) == "ec790ca60d780ad3e2186497b9e21a8ec7d128754f71ce18783021183d08d53e"
    assert {p.case.block_size for p in cases} == {None, 1, 4, 128}
    assert {p.case.scheduler_metadata for p in cases} == {False, True} and {p.case.num_splits for p in cases} == {
        1, 3, None,
    }  # fmt: skip
    assert sum(p.case.append_len is not None for p in cases) == 3264
    assert sum(bool(p.case.append_lens) for p in cases) == 5934
    assert sum(p.case.append and p.case.quant != "none" for p in cases) == 3912 + 2988
    for p in cases:
        c, v, (sq, sk) = p.case, p.values, p.values["seqlens"]
        assert c.batch == 5 and c.head_dim == 128 and c.batch_name == "peerfa3kv"
        assert c.block_size is None or sk % c.block_size == 0
        assert all(max(1, sq - 20) <= q <= sq for q in c.q_lens) if v["varlen_q"] else c.q_lens == [sq] * 5
        if c.append:  # cache_seqlens in [0, seqlen_k - seqlen_new], then the new keys
            new = c.new_kv_lens
            assert all(n <= k <= sk for n, k in zip(new, c.kv_lens))
            assert all(n < sq for n in new) if not v["seqlen_new_eq_seqlen_q"] else all(n <= sq for n in new)
            if v["varlen_q"]:  # each sequence its own count, within 20 of seqlen_new (key_new_padding_mask)
                assert max(new) - min(new) <= 20 and min(new) >= 1
            if v["seqlen_new_eq_seqlen_q"] and not v["varlen_q"]:
                assert c.append_len is None and not c.append_lens  # seqlen_q new keys
        else:
            assert all(1 <= k <= sk for k in c.kv_lens) and v["seqlen_new_eq_seqlen_q"]
        if v["dtype"] == "fp8_e4m3":
            assert (c.dtype, c.quant, c.descale) == ("bf16", "fp8_e4m3", None)
        else:
            assert c.quant == "none"
        assert c.causal == v["causal_local"][0] and c.has_window == v["causal_local"][1]


def _unique_stable_and_no_engine(name: str) -> None:
    """What test_suites.py checks of every other suite: unique ids, the same cases (batch labels included) in the same
    order on a second build, no engine case."""
    cases = get_suite(name)
    ids = [c.id for c in cases]
    assert len(set(ids)) == len(ids)
    again = get_suite(name)
    assert again == cases and [c.batch_name for c in again] == [c.batch_name for c in cases]
    assert not any(c.engine for c in cases)


def test_fa3_suite_size(fa3_points):
    cases = get_suite("peer-fa3")
    assert len(cases) == 63360 + 47517 + 15588 + 5934 == sum(1 for p in fa3_points if p.case is not None)
    # the 126,465 cases before the uneven appends became cases (append_lens): their ids and order unchanged
    assert _digest(cases[:126465]) == "9754460b1eb4dd8115ab87feb704efa0106fee03f3dc4748f6773b47b57e0465"
    assert all(c.append_lens for c in cases[126465:]) and not any(c.append_lens for c in cases[:126465])
    _unique_stable_and_no_engine("peer-fa3")


# ----------------------------------------------------------------------------------------------- peer-fa4
@pytest.fixture(scope="module")
def fa4_points():
    return fa4.PEER_FA4.points()


def test_fa4_output_is_its_grid_on_sm90(fa4_points):
    """test_flash_attn_output: 26 pairs x 5 (causal, local_enum) x 2 softcaps x 2 deterministic x 2 sinks x 3 heads x
    6 (d, dv) forward points (num_splits 1: sm90 skips 3), the deterministic ones the same call; a backward point
    where the test runs one on sm90; negative window sides refused by the case model."""
    points = _by_test(fa4_points, "test_flash_attn_output")
    forward = [p for p in points if p.values["call"] == "fwd"]
    backward = [p for p in points if p.values["call"] == "bwd"]
    assert len(forward) == 26 * 5 * 2 * 2 * 2 * 3 * 6 == 18720
    # backward: (64, 64), (96, 96), (128, 128), and (192, 128) with MHA; not with a mask when seqlen_k < seqlen_q
    short = sum(1 for sq, sk in fa4.OUTPUT_SEQLENS if sk < sq)
    per_pair = 2 * 2 * 2 * 3  # softcap x deterministic x sinks x heads
    assert short == 8 and len(backward) == per_pair * (26 + 4 * (26 - short)) * 3 + per_pair * (26 + 4 * 18) // 3
    assert all(p.dropped == SAME_CALL for p in forward if p.values["deterministic"])
    refused = [p for p in points if p.dropped.startswith(REFUSED)]
    assert refused and all(p.values["local_enum"] in (2, 3) and "window must be" in p.dropped for p in refused)
    cases = [p.case for p in points if p.case is not None]
    assert len(cases) == 11396 and sum(c.backward for c in cases) == 5216
    assert {(c.head_dim, c.dv) for c in cases} == {(64, 64), (96, 96), (128, 64), (128, 128), (192, 128), (256, 256)}
    assert {(c.head_dim, c.dv, c.num_kv_heads) for c in cases if c.backward and c.dv != c.head_dim} == {(192, 128, 6)}
    assert not any(c.backward and c.head_dim == 256 for c in cases)  # sm90 xfails the backward above 192
    for p in points:
        c = p.case
        if c is None:
            continue
        sq, sk = p.values["seqlens"]
        assert c.requests == ((sq, sk),) * (9 if sk <= 2048 else 2) and c.num_heads == 6
        assert not (c.causal and c.has_window)  # the test skips a window with causal
        if c.backward:
            assert c.num_splits is None and c.deterministic == p.values["deterministic"]
            assert not ((c.causal or c.has_window) and sk < sq)
        else:
            assert c.num_splits == 1 and not c.deterministic
        if p.values["local_enum"] == 2:
            assert c.window[0] is None and c.window[1] == 0  # (None, -r): only r == 0 is a case
        if p.values["local_enum"] == 3:
            assert c.window == (0, None)


def test_fa4_varlen_is_its_grid_on_sm90(fa4_points):
    """test_flash_attn_varlen_output: 21 pairs x 5 (causal, local_enum) x 2 x 2 x 3 heads x 3 modes x 4 zero-length
    pairs x 5 (d, dv), each a forward call without and with scheduler metadata, and the backward where it runs."""
    points = _by_test(fa4_points, "test_flash_attn_varlen_output")
    outer = 21 * 5 * 2 * 2 * 3 * 3 * 4
    forward = [p for p in points if p.values["call"] != "bwd"]
    assert len(forward) == outer * 5 * 2
    assert len(points) - len(forward) == outer * 2 + outer // 3  # (64, 64), (128, 128); (192, 128) with MHA

    def no_effect(v):  # deterministic in a forward call; zero_lengths_k where the keys take the queries' mask
        masked = v["causal"] or v["local_enum"] > 0
        return (v["call"] != "bwd" and v["deterministic"]) or (masked and v["zero_lengths"][1])

    same = [p for p in points if p.dropped == SAME_CALL]
    explicit = [p for p in same if no_effect(p.values)]
    backward_points = len(points) - len(forward)
    assert len(explicit) == outer * 5 + outer * 2 + backward_points * 2 // 5
    assert len(same) - len(explicit) == 880  # seeded draws that coincide (full mode, short pairs)
    assert all(p.case is not None for p in points if p.dropped == "")
    cases = [p for p in points if p.case is not None]
    assert len(cases) == 65648
    for p in cases:
        c, v = p.case, p.values
        sq, sk = v["seqlens"]
        if c.causal or c.has_window:
            sk = sq
            assert c.q_lens == c.kv_lens
        assert c.batch == (49 if sq <= 512 else 7) and c.batch_name == "peerfa4var"
        assert all(0 <= q <= sq for q in c.q_lens) and all(0 <= k <= sk for k in c.kv_lens)
        zq, zk = v["zero_lengths"]
        if zq:
            assert all(c.q_lens[b] == 0 for b in range(0, c.batch, 5)) and c.q_lens[-1] == 0
        if v["varlen_mode"] == "full" and not zq:
            assert c.q_lens == [sq] * c.batch
        assert c.scheduler_metadata == (v["call"] == "fwd_meta") and c.backward == (v["call"] == "bwd")
        assert all(w is None or 0 <= w < sk for w in c.window)


def test_fa4_kvcache_is_its_grid_on_sm90(fa4_points):
    points = _by_test(fa4_points, "test_flash_attn_kvcache")
    pages = sum(1 for _, sk in fa4.KVCACHE_SEQLENS for page in fa4.KVCACHE_PAGE_SIZES if page is None or sk % page == 0)
    # d 2 x varlen_q 2 x causal 2 x local 2 x sinks 2 x heads 3 x precompute_metadata 2
    assert pages == 8 + 8 + 6 + 4 and len(points) == pages * 192 and all(p.case is not None for p in points)
    for p in points:
        c, (sq, sk) = p.case, p.values["seqlens"]
        assert c.batch == 5 and c.num_splits == 1 and not c.append and all(1 <= k <= sk for k in c.kv_lens)
        assert all(max(1, sq - 20) <= q <= sq for q in c.q_lens) if p.values["varlen_q"] else c.q_lens == [sq] * 5
        assert c.causal == p.values["causal"] and c.has_window == p.values["local"]
        if c.causal and c.has_window:
            assert c.window[1] == 0


def test_fa4_suite_size(fa4_points):
    cases = get_suite("peer-fa4")
    assert len(cases) == 11396 + 65648 + 4992 == sum(1 for p in fa4_points if p.case is not None)
    # its ids in order (test_ids_golden.py pins every other suite but peer-fa3)
    assert _digest(cases) == "f7db7a1c3b03f62b98e5f8be5742f9043d9344e29e13a0f980fecc7bd70ead48"
    _unique_stable_and_no_engine("peer-fa4")


# ----------------------------------------------------------------------------------------------- peer-vllm-*
def test_vllm_varlen_is_vllms_grid():
    points = list(vllm.varlen_points())
    # 2 q_dtypes x 2 windows x 5 head sizes x 2 head layouts x 2 seq_lens lists
    assert len(points) == 80 and all(p.case is not None for p in points)
    cases = [p.case for p in points]
    assert {c.head_dim for c in cases} == {40, 72, 80, 128, 256}
    assert {c.window for c in cases} == {(None, None), (255, 0)}  # sliding_window 256: (255, 0)
    assert {c.requests for c in cases} == set(vllm.VARLEN_SEQ_LENS)
    assert all(c.causal and c.block_size == 16 and c.kv_layout == "NHD" and c.dtype == "bf16" for c in cases)
    assert {(c.quant, c.descale) for c in cases} == {("none", None), ("fp8_e4m3", "head")}


def test_vllm_cascade_is_its_three_kernel_calls():
    points = list(vllm.cascade_points())
    # 2 softcaps x 2 dtypes x 3 head sizes x 3 head layouts x 2 cases x 3 calls
    assert len(points) == 216 and all(p.case is not None for p in points)
    calls = {}
    for p in points:
        key = tuple((k, v) for k, v in p.params if k != "call")
        calls.setdefault(key, {})[p.values["call"]] = p.case
    for key, by_call in calls.items():
        seq_lens, prefix = dict(key)["seq_lens_and_common_prefix"]
        full, pre, suf = by_call["full"], by_call["prefix"], by_call["suffix"]
        assert full.requests == seq_lens and full.causal
        assert pre.requests == ((sum(q for q, _ in seq_lens), prefix),) and not pre.causal
        assert suf.requests == tuple((q, k - prefix) for q, k in seq_lens) and suf.causal
        assert all(c.block_size == 16 and c.num_splits is None for c in (full, pre, suf))
    assert {p.case.softcap for p in points} == {None, 50.0}
    assert {p.case.head_dim for p in points} == {128, 192, 256}


def test_vllm_flashmla_is_vllms_grid():
    points = list(vllm.mla_points())
    assert len(points) == 3 * 2 * 4 * 3 * 2 == 144 and all(p.case is not None for p in points)
    for p in points:
        c, v = p.case, p.values
        assert (c.head_dim, c.dv, c.qv, c.num_kv_heads, c.block_size, c.causal) == (64, 512, True, 1, 64, True)
        assert c.num_heads == v["h_q"] and c.batch == 128 and c.q_lens == [v["s_q"]] * 128
        if v["varlen"]:
            assert min(c.kv_lens) >= v["s_q"] and len(set(c.kv_lens)) > 1
        else:
            assert c.kv_lens == [v["mean_sk"]] * 128
        if v["torch_dtype"] == "fp8_e4m3":
            assert (c.dtype, c.quant, c.descale) == ("bf16", "fp8_e4m3", None)


# ----------------------------------------------------------------------------------------------- peer-sgl
def test_sgl_kvcache_is_sgl_kernels_grid():
    """11 pairs x 2 seqlen_new_eq x 2 new_kv x 2 sinks x 3 heads x 3 dv (256, 512 MLA-absorbed; 64) x 2 num_splits;
    the appends of seqlen_new = randint(1, seqlen_q + 1) new keys (append_len) after the other points."""
    points = list(sgl.kvcache_points())
    assert len(points) == 11 * 2 * 2 * 2 * 3 * 3 * 2
    per = 11 * 2 * 3 * 3 * 2  # pairs x sinks x heads x dv x num_splits
    short = [sgl._short_append(**p.values) for p in points]
    assert short == sorted(short) and sum(short) == per
    assert [p.values for p in points if not sgl._short_append(**p.values)] == [
        p.values for p in sgl.kvcache_points(short_appends=False)
    ]
    dropped = Counter(p.dropped for p in points if p.case is None)
    # SAME_CALL: eq False without new keys, and 98 draws of seqlen_new == seqlen_q (every one at seqlen_q 1)
    assert dropped == Counter({SAME_CALL: per + 98})
    assert all(p.values["seqlen_new_eq_seqlen_q"] is False for p in points if p.case is None)
    assert all(p.case is None for p, s in zip(points, short) if s and p.values["seqlens"][0] == 1)
    cases = [p for p in points if p.case is not None]
    assert len(cases) == 2 * per + 298
    for p in cases:
        c, (sq, sk), dv = p.case, p.values["seqlens"], p.values["dv"]
        assert (c.head_dim, c.dv, c.qv) == (64, dv, dv >= 256) and c.batch == 5 and not c.paged
        assert c.sinks == p.values["has_sink"] and c.num_splits == (1 if p.values["num_splits"] == 1 else None)
        assert c.q_lens == [sq] * 5
        if c.append:  # cache_seqlens in [0, seqlen_k - seqlen_new], then seqlen_new new keys
            assert all(c.new_kv_lens[0] <= k <= sk for k in c.kv_lens)
            assert (c.append_len is None) == p.values["seqlen_new_eq_seqlen_q"]
            assert c.append_len is None or 1 <= c.append_len < sq
        else:
            assert all(1 <= k <= sk for k in c.kv_lens)


def test_sgl_varlen_is_sgl_kernels_grid():
    points = list(sgl.varlen_points())
    assert len(points) == 20 * 2 * 3 * 2 and all(p.case is not None for p in points)
    assert {(p.case.num_heads, p.case.num_kv_heads) for p in points} == {(6, 6), (6, 1), (6, 2)}
    for p in points:
        c, (sq, sk) = p.case, p.values["seqlens"]
        assert c.batch == 9 and c.head_dim == 128 and c.softcap is None and not c.has_window
        assert all(max(1, sq - 20) <= q <= sq for q in c.q_lens)
        assert [c.kv_lens[b] for b in (0, 5, 8)] == [0, 0, 0]
        assert all(max(0, sk - 20) <= k <= sk for b, k in enumerate(c.kv_lens) if b not in (0, 5, 8))
    cases = get_suite("peer-sgl")
    assert len(cases) == 792 + 240 + 298  # kvcache, varlen, then the short appends
    # the cases before the short appends became cases (append_len): their ids and order unchanged
    assert _digest(cases[:1032]) == "3dcbc5f98451bf3a63fe62999faa87515f01c86bd503d507686d4d085c52e096"
    assert [p.test for p in PEERS["peer-sgl"].points() if p.case is not None] == (
        ["test_flash_attn_kvcache"] * 792 + ["test_flash_attn_varlen_output"] * 240 + ["test_flash_attn_kvcache"] * 298
    )


def test_peer_grids_are_deterministic(fa3_points):
    """Two walks of a grid give the same points (the suite's, cached, and a new one): the draws are seeded by the
    combination."""
    for suite in (PEERS["peer-vllm-flash"], PEERS["peer-vllm-flashmla"], PEERS["peer-sgl"]):
        assert list(suite.grids()) == list(suite.grids())
    assert list(fa3.kvcache_points()) == _by_test(fa3_points, "test_flash_attn_kvcache")
