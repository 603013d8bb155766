"""Every reference feature against the independent float64 oracle (``oracle.py``).

fp64 reference vs oracle: 1e-10 (only summation order differs); fp32 reference: 1e-5 relative.
The oracle itself is pinned first against hand-written masks and hand-computed softmaxes, so a
shared misunderstanding of the rule cannot make both agree on a wrong answer.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch
from oracle import build_paged_cache, options_kwargs, oracle_attention, oracle_batch, oracle_mask
from refhelpers import assert_close_to, check_against_oracle, make_packed

from attnref import AttnOptions, Numerics, attention_padded, attention_paged, attention_varlen

FP64 = Numerics(dtype=torch.float64)
FP32 = Numerics(dtype=torch.float32)
NUMERICS = [pytest.param(FP64, id="fp64"), pytest.param(FP32, id="fp32")]

# Lengths that exercise the edges: empty queries, empty keys, single tokens, sq > sk (top rows see
# nothing under causal), sq < sk (decode-like), and a longer sequence.
LENS = [(5, 9), (0, 4), (1, 1), (7, 3), (4, 0), (13, 13), (1, 17), (20, 37)]


# --- the oracle pinned by hand ------------------------------------------------------------------


def _rows(*rows: str) -> np.ndarray:
    return np.array([[c == "1" for c in r] for r in rows])


@pytest.mark.parametrize(
    "sq, sk, kwargs, expected",
    [
        (2, 5, {"causal": True}, _rows("11110", "11111")),
        (4, 2, {"causal": True}, _rows("00", "00", "10", "11")),  # sq > sk: top rows see nothing
        (3, 3, {"left": 1, "right": 0}, _rows("100", "110", "011")),
        (3, 3, {"left": 0, "right": 0}, _rows("100", "010", "001")),
        (3, 4, {"left": None, "right": 1}, _rows("1110", "1111", "1111")),
        (3, 4, {"left": 1, "right": None}, _rows("1111", "0111", "0011")),
        # chunk 2, sq=sk=5: chunks [0,2), [2,4), [4,6), causal inside
        (5, 5, {"causal": True, "chunk": 2}, _rows("10000", "11000", "00100", "00110", "00001")),
        # sq > sk with a chunk: p = i - 2 is negative for the top rows; floor modulo puts p = -1
        # in chunk [-2, 0) (nothing visible) rather than [0, 2)
        (4, 2, {"chunk": 2}, _rows("00", "00", "11", "11")),
    ],
)
def test_oracle_mask_literals(sq: int, sk: int, kwargs: dict, expected: np.ndarray) -> None:
    np.testing.assert_array_equal(oracle_mask(sq, sk, **kwargs), expected)


def test_oracle_softmax_by_hand() -> None:
    # One query, two keys, d=1, scale 1: scores 1 and 2; values 10 and 20.
    q = torch.tensor([[[1.0]]], dtype=torch.float64)
    k = torch.tensor([[[1.0]], [[2.0]]], dtype=torch.float64)
    v = torch.tensor([[[10.0]], [[20.0]]], dtype=torch.float64)
    out, lse = oracle_attention(q, k, v, scale=1.0)
    p2 = math.exp(2) / (math.exp(1) + math.exp(2))
    assert out.item() == pytest.approx(10 * (1 - p2) + 20 * p2, rel=1e-14)
    assert lse.item() == pytest.approx(math.log(math.exp(1) + math.exp(2)), rel=1e-14)
    # Sink 0.5 joins the denominator only; ALiBi slope 1 moves key 0 (distance 1) down by 1.
    out, lse = oracle_attention(q, k, v, scale=1.0, sinks=torch.tensor([0.5]), alibi=torch.tensor([1.0]))
    denom = math.exp(0) + math.exp(2) + math.exp(0.5)
    assert out.item() == pytest.approx((10 * math.exp(0) + 20 * math.exp(2)) / denom, rel=1e-14)
    assert lse.item() == pytest.approx(math.log(denom), rel=1e-14)
    # Soft-cap 1: tanh applied to the scaled scores.
    out, lse = oracle_attention(q, k, v, scale=1.0, softcap=1.0)
    assert lse.item() == pytest.approx(math.log(math.exp(math.tanh(1)) + math.exp(math.tanh(2))), rel=1e-14)


def test_oracle_fully_masked_rows() -> None:
    q = torch.ones(3, 2, 4, dtype=torch.float64)
    k = torch.ones(1, 1, 4, dtype=torch.float64)
    v = torch.ones(1, 1, 4, dtype=torch.float64)
    out, lse = oracle_attention(q, k, v, causal=True)
    assert out[:2].abs().max() == 0 and torch.isneginf(lse[:, :2]).all()
    out, lse = oracle_attention(q, k, v, causal=True, sinks=torch.tensor([0.25, -3.0]))
    assert out[:2].abs().max() == 0
    assert lse[:, :2].tolist() == [[0.25, 0.25], [-3.0, -3.0]]


# --- the reference against the oracle -----------------------------------------------------------


def _alibi_h(h: int) -> torch.Tensor:
    return torch.linspace(0.05, 0.8, h, dtype=torch.float32)


FEATURES = {
    "plain": (AttnOptions(), None, None),
    "causal": (AttnOptions(causal=True), None, None),
    "win0_0": (AttnOptions(window=(0, 0)), None, None),
    "win3_none": (AttnOptions(window=(3, None)), None, None),
    "winnone_2": (AttnOptions(window=(None, 2)), None, None),
    "win3_1": (AttnOptions(window=(3, 1)), None, None),
    "causal_win4": (AttnOptions(causal=True, window=(4, 0)), None, None),
    "win_ge_seq": (AttnOptions(window=(100, 100)), None, None),
    "chunk4": (AttnOptions(chunk=4), None, None),
    "causal_chunk3": (AttnOptions(causal=True, chunk=3), None, None),
    "win2_2_chunk5": (AttnOptions(window=(2, 2), chunk=5), None, None),
    "softcap": (AttnOptions(softcap=2.5), None, None),
    "scale": (AttnOptions(scale=0.37), None, None),
    "alibi_h": (AttnOptions(), "h", None),
    "alibi_bh_causal": (AttnOptions(causal=True), "bh", None),
    "sinks": (AttnOptions(), None, "sinks"),
    "sinks_causal_win": (AttnOptions(causal=True, window=(5, 0)), None, "sinks"),
    "everything": (AttnOptions(causal=True, window=(6, 0), softcap=3.0, scale=0.3, chunk=8), "bh", "sinks"),
}


@pytest.mark.parametrize("numerics", NUMERICS)
@pytest.mark.parametrize("feature", list(FEATURES))
def test_varlen_features(feature: str, numerics: Numerics) -> None:
    options, alibi_kind, sink_kind = FEATURES[feature]
    gen = torch.Generator().manual_seed(zlib.crc32(feature.encode()))
    h, hk = 4, 2
    p = make_packed(gen, LENS, h, hk, 16, 12, q_scale=3.0 if options.softcap else 1.0)
    alibi = None
    if alibi_kind == "h":
        alibi = _alibi_h(h)
    elif alibi_kind == "bh":
        alibi = torch.rand(len(LENS), h, generator=gen)
    sinks = torch.randn(h, generator=gen) + 1.0 if sink_kind else None
    res = attention_varlen(
        p.q, p.k, p.v, p.cu_q, p.cu_k, options=options, alibi_slopes=alibi, sinks=sinks, numerics=numerics
    )
    assert res.out.shape == (p.q.shape[0], h, 12) and res.lse.shape == (h, p.q.shape[0])
    check_against_oracle(res, p, options, numerics.dtype, alibi=alibi, sinks=sinks)


def test_fully_masked_rows_are_exact() -> None:
    """Rows that see nothing are exactly 0 with LSE -inf (or the sink), not merely close."""
    gen = torch.Generator().manual_seed(1)
    p = make_packed(gen, [(6, 2), (3, 0)], 2, 1, 8)
    res = attention_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, options=AttnOptions(causal=True))
    dead = [0, 1, 2, 3, 6, 7, 8]  # sq - sk = 4 top rows of seq 0; every row of seq 1
    assert torch.equal(res.out[dead], torch.zeros_like(res.out[dead]))
    assert torch.isneginf(res.lse[:, dead]).all()
    sinks = torch.tensor([0.5, -2.0])
    res = attention_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, options=AttnOptions(causal=True), sinks=sinks)
    assert torch.equal(res.out[dead], torch.zeros_like(res.out[dead]))
    assert torch.equal(res.lse[:, dead], sinks[:, None].expand(2, len(dead)))


@pytest.mark.parametrize("h, hk", [(4, 4), (8, 2), (6, 1), (12, 3)], ids=["mha", "gqa4", "mqa", "gqa4_12"])
def test_gqa_mqa(h: int, hk: int) -> None:
    gen = torch.Generator().manual_seed(h * 100 + hk)
    p = make_packed(gen, LENS[:4], h, hk, 16)
    options = AttnOptions(causal=True)
    alibi = _alibi_h(h)  # per query head: catches a slope indexed by kv head
    sinks = torch.randn(h, generator=gen)
    res = attention_varlen(
        p.q, p.k, p.v, p.cu_q, p.cu_k, options=options, alibi_slopes=alibi, sinks=sinks, numerics=FP64
    )
    check_against_oracle(res, p, options, torch.float64, alibi=alibi, sinks=sinks)


@pytest.mark.parametrize(
    "d, dv",
    [
        (8, 8),
        (16, 16),
        (64, 64),
        (128, 128),
        (256, 256),
        (512, 512),
        (64, 128),
        (192, 128),
        (32, 512),
        (8, 24),
    ],
)
@pytest.mark.parametrize("numerics", NUMERICS)
def test_head_dims(d: int, dv: int, numerics: Numerics) -> None:
    gen = torch.Generator().manual_seed(d * 1000 + dv)
    p = make_packed(gen, [(9, 14), (3, 3)], 2, 1, d, dv)
    options = AttnOptions(causal=True)
    res = attention_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, options=options, numerics=numerics)
    check_against_oracle(res, p, options, numerics.dtype)


def test_default_scale_uses_qk_head_dim() -> None:
    """With d != dv the default scale is 1/sqrt(d), not 1/sqrt(dv)."""
    gen = torch.Generator().manual_seed(5)
    p = make_packed(gen, [(4, 6)], 2, 2, 16, 64)
    res = attention_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, numerics=FP64)
    want_out, want_lse = oracle_batch(p.qs, p.ks, p.vs, scale=0.25)
    assert_close_to(res.out, res.lse, want_out, want_lse, torch.float64)


@pytest.mark.parametrize("numerics", NUMERICS)
def test_varlen_seqused_k(numerics: Numerics) -> None:
    """seqused_k limits keys inside the cu_seqlens_k spans; alone it reads a flattened padded batch."""
    gen = torch.Generator().manual_seed(7)
    used = [5, 0, 3]
    full = make_packed(gen, [(4, 8), (2, 6), (3, 3)], 4, 2, 16)
    options = AttnOptions(causal=True)
    res = attention_varlen(
        full.q,
        full.k,
        full.v,
        full.cu_q,
        full.cu_k,
        seqused_k=torch.tensor(used, dtype=torch.int32),
        options=options,
        numerics=numerics,
    )
    want_out, want_lse = oracle_batch(
        full.qs,
        [k[:n] for k, n in zip(full.ks, used)],
        [v[:n] for v, n in zip(full.vs, used)],
        **options_kwargs(options),
    )
    assert_close_to(res.out, res.lse, want_out, want_lse, numerics.dtype)
    # No cu_seqlens_k: k is (b * width, hk, d), sequence b starting at b * width.
    width = 8
    kp = torch.randn(3 * width, 2, 16, generator=gen)
    vp = torch.randn(3 * width, 2, 16, generator=gen)
    res = attention_varlen(full.q, kp, vp, full.cu_q, seqused_k=torch.tensor(used), options=options, numerics=numerics)
    ks = [kp[b * width : b * width + n] for b, n in enumerate(used)]
    vs = [vp[b * width : b * width + n] for b, n in enumerate(used)]
    want_out, want_lse = oracle_batch(full.qs, ks, vs, **options_kwargs(options))
    assert_close_to(res.out, res.lse, want_out, want_lse, numerics.dtype)


@pytest.mark.parametrize("numerics", NUMERICS)
@pytest.mark.parametrize(
    "options", [AttnOptions(causal=True), AttnOptions(window=(2, 1), softcap=4.0)], ids=["causal", "win_cap"]
)
def test_padded_with_seqlens_k(options: AttnOptions, numerics: Numerics) -> None:
    gen = torch.Generator().manual_seed(11)
    b, sq, sk, h, hk, d = 3, 5, 9, 4, 2, 16
    q = torch.randn(b, sq, h, d, generator=gen)
    k = torch.randn(b, sk, hk, d, generator=gen)
    v = torch.randn(b, sk, hk, d, generator=gen)
    seqlens = [9, 0, 4]
    alibi = torch.rand(b, h, generator=gen)
    sinks = torch.randn(h, generator=gen)
    res = attention_padded(
        q,
        k,
        v,
        seqlens_k=torch.tensor(seqlens),
        options=options,
        alibi_slopes=alibi,
        sinks=sinks,
        numerics=numerics,
    )
    assert res.out.shape == (b, sq, h, d) and res.lse.shape == (b, h, sq)
    for i in range(b):
        want_out, want_lse = oracle_attention(
            q[i],
            k[i, : seqlens[i]],
            v[i, : seqlens[i]],
            alibi=alibi[i],
            sinks=sinks,
            **options_kwargs(options),
        )
        assert_close_to(res.out[i], res.lse[i], want_out, want_lse, numerics.dtype)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("block_size", [1, 16, 32, 64, 128, 256])
def test_paged(block_size: int, layout: str) -> None:
    gen = torch.Generator().manual_seed(block_size * 7 + (layout == "HND"))
    # Key lengths cross block boundaries (bs - 1, bs, bs + 1) and include 0.
    lens = [
        (3, block_size + 1),
        (1, block_size),
        (2, 0),
        (5, max(block_size - 1, 1)),
        (4, 2 * block_size + 3),
    ]
    options = AttnOptions(causal=True, window=(block_size, 0))
    seqused = torch.tensor([sk for _, sk in lens], dtype=torch.int32)
    for dv in (8, 16):  # dv != d, then K and V stacked as one (2, ...) cache (needs dv == d)
        p = make_packed(gen, lens, 4, 2, 16, dv, dtype=torch.float64)
        k_cache, v_cache, table = build_paged_cache(p.ks, p.vs, block_size, layout, gen)
        sinks = torch.randn(4, generator=gen)
        res = attention_paged(
            p.q,
            k_cache,
            v_cache,
            table,
            seqused,
            p.cu_q,
            layout=layout,
            options=options,
            sinks=sinks,
            numerics=FP64,
        )
        check_against_oracle(res, p, options, torch.float64, sinks=sinks)
    stacked = torch.stack([k_cache, v_cache])
    res2 = attention_paged(
        p.q, stacked, None, table, seqused, p.cu_q, layout=layout, options=options, sinks=sinks, numerics=FP64
    )
    assert torch.equal(res2.out, res.out) and torch.equal(res2.lse, res.lse)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_paged_fp32_alibi(layout: str) -> None:
    gen = torch.Generator().manual_seed(3)
    lens = [(3, 40), (6, 6), (1, 17)]
    p = make_packed(gen, lens, 4, 1, 32)
    k_cache, v_cache, table = build_paged_cache(p.ks, p.vs, 16, layout, gen)
    options = AttnOptions(causal=True, softcap=5.0)
    alibi = torch.rand(3, 4, generator=gen)
    seqused = torch.tensor([sk for _, sk in lens])
    res = attention_paged(
        p.q,
        k_cache,
        v_cache,
        table,
        seqused,
        p.cu_q,
        layout=layout,
        options=options,
        alibi_slopes=alibi,
        numerics=FP32,
    )
    check_against_oracle(res, p, options, torch.float32, alibi=alibi)


def test_seqused_k_may_run_past_its_cu_seqlens_span() -> None:
    """FA3/FA4: with both given, sequence b reads seqused_k[b] keys from cu_seqlens_k[b], even past
    cu_seqlens_k[b + 1] (read from FA3 hopper/seqlen.h: the length comes from seqused_k, only the
    start from cu_seqlens_k); only total_k bounds it."""
    gen = torch.Generator().manual_seed(13)
    p = make_packed(gen, [(3, 4), (2, 6)], 2, 1, 8, dtype=torch.float64)
    used = [7, 2]  # sequence 0 reads its 4 keys and the first 3 of sequence 1
    res = attention_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, seqused_k=torch.tensor(used), numerics=FP64)
    want_out, want_lse = oracle_batch(p.qs, [p.k[:7], p.k[4:6]], [p.v[:7], p.v[4:6]])
    assert_close_to(res.out, res.lse, want_out, want_lse, torch.float64)
    with pytest.raises(ValueError, match=r"seqused_k\[1\] = 7 exceeds the capacity of sequence 1 \(6\)"):
        attention_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, seqused_k=torch.tensor([1, 7]))
