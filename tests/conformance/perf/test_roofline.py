"""The FLOP and byte models against brute force and hand counts; peaks and roofline figures."""

from __future__ import annotations

import random
import time

import pytest

from attnref import AttnOptions, visible_mask
from conformance.cases.case import AttentionCase
from conformance.perf.roofline import (
    PEAKS,
    attention_bytes,
    attention_flops,
    case_visible_pairs,
    match_peak,
    roofline,
    union_span,
    visible_pairs,
)
from conformance.suites.registry import get_suite


def brute_force(sq: int, sk: int, left: int | None, right: int | None, chunk: int | None) -> tuple:
    """Visible pairs and key union by walking every (i, j), written from SEMANTICS section 2 directly."""
    count, cols = 0, []
    for i in range(sq):
        p = i + sk - sq
        for j in range(sk):
            ok = (left is None or j >= p - left) and (right is None or j <= p + right)
            if chunk is not None:
                c0 = p - p % chunk  # Python's % is the floor modulo the rule uses
                ok = ok and c0 <= j < c0 + chunk
            if ok:
                count += 1
                cols.append(j)
    return count, ((min(cols), max(cols) + 1) if cols else (0, 0))


EDGES = [
    (0, 5),
    (5, 0),
    (0, 0),
    (1, 1),
    (1, 17),
    (17, 1),
    (9, 3),
    (3, 9),
    (16, 16),
    (40, 20),
    (20, 40),
]
MASKS = [
    (None, None, None),
    (None, 0, None),
    (0, 0, None),
    (1, 0, None),
    (3, 2, None),
    (None, 4, None),
    (5, None, None),
    (None, None, 4),
    (None, 0, 4),
    (2, 0, 3),
    (None, 1, 5),
    (7, 7, 1),
]


@pytest.mark.parametrize("sq,sk", EDGES)
@pytest.mark.parametrize("left,right,chunk", MASKS)
def test_pairs_and_union_match_brute_force_on_edges(sq, sk, left, right, chunk):
    count, union = brute_force(sq, sk, left, right, chunk)
    assert visible_pairs(sq, sk, left, right, chunk) == count
    assert union_span(sq, sk, left, right, chunk) == union


def test_pairs_and_union_match_brute_force_random():
    rng = random.Random(1234)
    for _ in range(1500):
        sq, sk = rng.randint(0, 24), rng.randint(0, 24)
        left = rng.choice([None, 0, 1, 2, 5, 13, 40])
        right = rng.choice([None, 0, 1, 3, 40])
        chunk = rng.choice([None, None, 1, 2, 5, 8])
        count, union = brute_force(sq, sk, left, right, chunk)
        got = (visible_pairs(sq, sk, left, right, chunk), union_span(sq, sk, left, right, chunk))
        assert got == (count, union), (sq, sk, left, right, chunk)


def test_pairs_agree_with_reference_mask():
    """The model counts what attnref masks: one rule, two implementations."""
    rng = random.Random(7)
    for _ in range(200):
        sq, sk = rng.randint(0, 30), rng.randint(0, 30)
        causal = rng.random() < 0.5
        left = rng.choice([None, 0, 3, 11])
        right = 0 if causal else rng.choice([None, 0, 2])
        chunk = rng.choice([None, 4, 7])
        opts = AttnOptions(causal=causal, window=(left, None if causal else right), chunk=chunk)
        assert visible_pairs(sq, sk, left, right, chunk) == int(visible_mask(sq, sk, opts).sum())


def test_case_flops_sum_requests_times_heads_and_both_products():
    case = AttentionCase(
        requests=((5, 9), (1, 30), (12, 4), (3, 0)),
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        head_dim_v=32,
        causal=True,
        window=(6, None),
    )
    pairs = sum(brute_force(sq, sk, 6, 0, None)[0] for sq, sk in case.requests)
    assert case_visible_pairs(case) == pairs
    assert attention_flops(case) == pairs * 8 * 2 * (64 + 32)


def test_anchor_exact_count_vs_semantics_formula():
    """SEMANTICS section 6 uses 4 b h s^2 d / 2; the exact causal count adds the diagonal 2 b h d s."""
    b, s, h, d = 4, 8192, 16, 128
    case = AttentionCase(requests=((s, s),) * b, num_heads=h, num_kv_heads=h, head_dim=d, causal=True)
    formula = 4 * b * h * s * s * d // 2
    assert attention_flops(case) - formula == 2 * b * h * d * s
    fig = roofline(case, 1.62, "NVIDIA H200")
    assert fig["tflops"] == pytest.approx(679, abs=0.5)  # the reported (exact) number
    assert formula / 1.62e-3 / 1e12 == pytest.approx(679, abs=0.5)  # SEMANTICS' number
    assert fig["bound"] == "compute"
    assert fig["roofline_pct"] == pytest.approx(100 * fig["tflops"] / 989.0)


def test_bytes_gqa_reads_kv_once_per_kv_head():
    # bf16, one prefill of 16 tokens, 8 query heads sharing 2 kv heads, d = dv = 64
    case = AttentionCase(requests=((16, 16),), num_heads=8, num_kv_heads=2, head_dim=64)
    m = attention_bytes(case)
    assert m.q == 16 * 8 * 64 * 2
    assert m.out == 16 * 8 * 64 * 2
    assert m.kv == 16 * 2 * (64 + 64) * 2
    assert m.metadata == 2 * 2 * 4  # cu_seqlens_q and cu_seqlens_k, batch + 1 int32 each
    assert m.total == m.q + m.out + m.kv + m.metadata
    more_q_heads = attention_bytes(case.replace(num_heads=16))
    assert more_q_heads.kv == m.kv and more_q_heads.q == 2 * m.q


def test_bytes_window_reads_only_the_union_and_lse_optional():
    # decode over 100 keys with a 10-token left window: 11 keys visible; d=128, dv=64, fp16
    case = AttentionCase(
        requests=((1, 100),),
        num_heads=4,
        num_kv_heads=1,
        head_dim=128,
        head_dim_v=64,
        dtype="fp16",
        causal=True,
        window=(10, None),
    )
    m = attention_bytes(case, lse=True)
    assert m.kv == 11 * 1 * (128 + 64) * 2
    assert m.lse == 4 * 1 * 4
    assert attention_bytes(case).lse == 0


def test_bytes_paged_counts_block_table_and_append_write():
    # keys 0..99 of a request in pages of 16: 7 pages; window (30, 0) on a 4-token chunk: keys 66..99
    case = AttentionCase(
        requests=((1, 100), (4, 100)),
        num_heads=2,
        num_kv_heads=2,
        head_dim=8,
        kv_layout="NHD",
        block_size=16,
        causal=True,
        window=(30, None),
        append=True,
    )
    m = attention_bytes(case)
    # request 0 sees keys 69..99 (31 keys, pages 4..6); request 1 sees 66..99 (34 keys, pages 4..6)
    assert m.kv == (31 + 34) * 2 * 16 * 2
    assert m.metadata == 2 * 3 * 4 + (3 + 3) * 4
    assert m.kv_append == 5 * 2 * 16 * 2  # the 5 new tokens written into the cache
    assert attention_bytes(case.replace(sinks=True, alibi=True)).metadata == m.metadata + 2 * 2 * 4


def test_empty_kv_and_sq_gt_sk():
    case = AttentionCase(requests=((5, 0), (4, 2)), num_heads=2, num_kv_heads=1, head_dim=4, causal=True)
    # (5, 0) sees nothing; (4, 2) causal: rows 0-1 see nothing, row 2 sees key 0, row 3 keys 0-1
    assert case_visible_pairs(case) == 3
    m = attention_bytes(case)
    assert m.kv == 2 * 1 * 8 * 2
    assert m.q == 9 * 2 * 4 * 2  # every query row is still read and its (zero) output written


def test_perf_suite_models_are_fast():
    """No sq x sk masks: the whole perf suite (32k prefill, 128k decode) is modelled in about a second."""
    cases = get_suite("perf")
    start = time.perf_counter()
    for case in cases:
        roofline(case, 1.0, "NVIDIA H100 80GB HBM3")
    long_chunk = AttentionCase(
        requests=((131072, 131072),), num_heads=1, num_kv_heads=1, head_dim=8, chunk=8192, causal=True
    )
    assert case_visible_pairs(long_chunk) == 16 * 8192 * 8193 // 2
    assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize(
    "name,key,bw",
    [
        ("NVIDIA H100 80GB HBM3", "H100 80GB HBM3", 3350.0),
        ("NVIDIA H200", "H200", 4800.0),
        ("NVIDIA H100 PCIe", "H100 PCIe", 2000.0),
        ("NVIDIA H200 NVL", "H200 NVL", 4800.0),
    ],
)
def test_match_peak(name, key, bw):
    got_key, peak = match_peak(name)
    assert got_key == key and peak.hbm_gbps == bw


def test_unknown_gpu_and_fp32_disable_roofline_pct_with_reason():
    case = AttentionCase(requests=((128, 128),), num_heads=2, num_kv_heads=2, head_dim=64, causal=True)
    fig = roofline(case, 0.5, "Tesla T4")
    assert fig["roofline_pct"] is None and fig["bound"] is None and "no peak" in fig["note"]
    assert fig["tflops"] == pytest.approx(attention_flops(case) / 0.5e-3 / 1e12)
    fig32 = roofline(case.replace(dtype="fp32"), 0.5, "NVIDIA H200")
    assert fig32["roofline_pct"] is None and "fp32" in fig32["note"]
    assert match_peak("cpu") == ("unknown", PEAKS["unknown"])


def test_paged_decode_is_memory_bound_and_reports_both_bandwidths():
    # SEMANTICS section 6: paged decode b16, 32k, 64/8 heads, d128 at ~3006 GB/s on an H100
    case = AttentionCase(
        requests=((1, 32768),) * 16,
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        causal=True,
        kv_layout="NHD",
        block_size=256,
    )
    kv = 16 * 32768 * 8 * 256 * 2
    t_ms = kv / 3006e9 * 1e3
    fig = roofline(case, t_ms, "NVIDIA H100 80GB HBM3", measured_copy_gbps=3019.0)
    assert fig["bound"] == "memory"
    assert fig["gbps"] == pytest.approx(3006, rel=2e-3)  # q, out and the block table add under 0.2%
    assert fig["roofline_pct"] == pytest.approx(100 * fig["bytes"] / 3350e9 / (t_ms * 1e-3))
    assert fig["pct_of_measured_bw"] == pytest.approx(100 * fig["gbps"] / 3019.0)


def test_roofline_rejects_nonpositive_time():
    case = AttentionCase(requests=((4, 4),), num_heads=1, num_kv_heads=1, head_dim=8)
    with pytest.raises(ValueError, match="time_ms"):
        roofline(case, 0.0, "NVIDIA H200")


def test_chunk_count_does_not_overflow_int32():
    # 128k x 128k in two 64k chunks: 2^33 pairs, summed over a vectorised row pass
    assert visible_pairs(131072, 131072, None, None, 65536) == 2 * 65536 * 65536
    assert visible_pairs(131072, 131072, 1000, 0, 65536) == 2 * (1001 * 65536 - 1000 * 1001 // 2)
