"""The reference against torch's ``scaled_dot_product_attention`` (math backend) where SDPA can
express the feature: explicit boolean masks (bottom-right causal, windows, chunks), ALiBi as a float
bias, GQA through repeated heads, custom scale, and sinks as an extra zero key/value whose bias is
the sink logit.  Soft-cap has no SDPA spelling and is covered by the oracle tests only.

SDPA returns NaN on rows whose mask is all False; those rows are compared only as "the reference
gives exactly 0 and LSE -inf".  LSE is checked against torch's CPU flash kernel, which returns it.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from oracle import options_kwargs, oracle_mask
from refhelpers import make_packed, tolerance
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnref import AttnOptions, Numerics, attention_varlen

FP64 = Numerics(dtype=torch.float64)
FP32 = Numerics(dtype=torch.float32)
LENS = [(6, 11), (9, 4), (1, 1), (12, 12), (3, 0)]

CASES = {
    "plain": AttnOptions(),
    "causal": AttnOptions(causal=True),
    "win3_0": AttnOptions(window=(3, 0)),
    "win2_5": AttnOptions(window=(2, 5)),
    "win0_0": AttnOptions(window=(0, 0)),
    "winnone_1": AttnOptions(window=(None, 1)),
    "causal_chunk4": AttnOptions(causal=True, chunk=4),
    "chunk3": AttnOptions(chunk=3),
    "scale": AttnOptions(causal=True, scale=0.61),
}


def _bias(sq: int, sk: int, options: AttnOptions, slopes: torch.Tensor | None, h: int) -> torch.Tensor:
    """Float (h, sq, sk) additive mask: 0 or -slope * |i + sk - sq - j| where visible, -inf elsewhere."""
    kw = options_kwargs(options)
    visible = torch.from_numpy(
        oracle_mask(sq, sk, left=kw["left"], right=kw["right"], causal=kw["causal"], chunk=kw["chunk"])
    )
    bias = torch.zeros(h, sq, sk, dtype=torch.float64)
    if slopes is not None:
        i = torch.arange(sq)[:, None]
        j = torch.arange(sk)[None, :]
        bias = -slopes.to(torch.float64)[:, None, None] * (i + sk - sq - j).abs().to(torch.float64)
    return bias.masked_fill(~visible, -math.inf)


def _sdpa_sequence(q, k, v, options: AttnOptions, slopes=None, sinks=None, gqa_via_repeat: bool = True):
    """SDPA over one sequence in float64; returns out (sq, h, dv) and the bias used."""
    sq, h, d = q.shape
    sk, hk, dv = v.shape
    q64, k64, v64 = (t.to(torch.float64).transpose(0, 1) for t in (q, k, v))  # (heads, s, d)
    bias = _bias(sq, sk, options, slopes, h)
    if sinks is not None:
        # An extra key of zeros (score 0) whose bias is the sink and whose value is zero: it adds
        # exp(sink) to the denominator and nothing to the numerator.
        k64 = torch.cat([k64, k64.new_zeros(hk, 1, d)], 1)
        v64 = torch.cat([v64, v64.new_zeros(hk, 1, dv)], 1)
        bias = torch.cat([bias, sinks.to(torch.float64)[:, None, None].expand(h, sq, 1)], 2)
    if gqa_via_repeat:
        k64 = k64.repeat_interleave(h // hk, 0)
        v64 = v64.repeat_interleave(h // hk, 0)
        extra = {}
    else:
        extra = {"enable_gqa": True}
    scale = options.scale if options.scale is not None else 1.0 / math.sqrt(d)
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(
            q64[None], k64[None], v64[None], attn_mask=bias[None], scale=scale, **extra
        )[0]
    return out.transpose(0, 1), bias


def _compare(res, p, b: int, want: torch.Tensor, bias: torch.Tensor, dtype: torch.dtype) -> None:
    """Sequence ``b`` of ``res`` against SDPA's ``want``: rows that see a key (a finite ``bias`` entry)
    match it; the others are exactly 0 with LSE -inf (SDPA gives NaN there)."""
    q0, q1 = int(p.cu_q[b]), int(p.cu_q[b + 1])
    res_out, res_lse = res.out[q0:q1], res.lse[:, q0:q1]
    seen = torch.isfinite(bias).any(-1).transpose(0, 1)  # (sq, h)
    torch.testing.assert_close(res_out[seen].to(torch.float64), want[seen], **tolerance(dtype))
    dead = ~seen
    assert torch.equal(res_out[dead], torch.zeros_like(res_out[dead]))
    assert torch.isneginf(res_lse.transpose(0, 1)[dead]).all()


@pytest.mark.parametrize("numerics", [FP64, FP32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("name", list(CASES))
def test_masks_match_sdpa(name: str, numerics: Numerics) -> None:
    options = CASES[name]
    gen = torch.Generator().manual_seed(len(name) * 31 + numerics.dtype.itemsize)
    p = make_packed(gen, LENS, 4, 2, 16, 8)
    res = attention_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, options=options, numerics=numerics)
    for b in range(len(LENS)):
        want, bias = _sdpa_sequence(p.qs[b], p.ks[b], p.vs[b], options)
        _compare(res, p, b, want, bias, numerics.dtype)


@pytest.mark.parametrize("per_batch", [False, True], ids=["alibi_h", "alibi_bh"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_alibi_matches_sdpa_float_bias(per_batch: bool, causal: bool) -> None:
    gen = torch.Generator().manual_seed(17 + per_batch + 2 * causal)
    h = 4
    p = make_packed(gen, LENS, h, 1, 16)
    slopes = torch.rand(len(LENS), h, generator=gen) if per_batch else torch.tensor([0.5, 0.25, 0.125, 0.0625])
    options = AttnOptions(causal=causal)
    res = attention_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, options=options, alibi_slopes=slopes, numerics=FP64)
    for b in range(len(LENS)):
        s = slopes[b] if per_batch else slopes
        want, bias = _sdpa_sequence(p.qs[b], p.ks[b], p.vs[b], options, slopes=s)
        _compare(res, p, b, want, bias, torch.float64)


@pytest.mark.parametrize("h, hk", [(8, 2), (6, 1), (4, 4)])
def test_gqa_matches_sdpa(h: int, hk: int) -> None:
    gen = torch.Generator().manual_seed(h + 10 * hk)
    p = make_packed(gen, LENS, h, hk, 32, 16)
    options = AttnOptions(window=(4, 2))
    res = attention_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, options=options, numerics=FP64)
    for b in range(len(LENS)):
        for repeat in (True, False):  # repeated kv heads, and SDPA's own enable_gqa grouping
            want, bias = _sdpa_sequence(p.qs[b], p.ks[b], p.vs[b], options, gqa_via_repeat=repeat)
            _compare(res, p, b, want, bias, torch.float64)


def test_sinks_match_sdpa_extra_key() -> None:
    """With the sink key every row sees something, so fully masked rows are compared too (out 0)."""
    gen = torch.Generator().manual_seed(23)
    h = 4
    p = make_packed(gen, LENS, h, 2, 16)
    sinks = torch.randn(h, generator=gen) * 2
    options = AttnOptions(causal=True, window=(5, 0))
    res = attention_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, options=options, sinks=sinks, numerics=FP64)
    for b in range(len(LENS)):
        q0, q1 = int(p.cu_q[b]), int(p.cu_q[b + 1])
        want, _ = _sdpa_sequence(p.qs[b], p.ks[b], p.vs[b], options, sinks=sinks)
        torch.testing.assert_close(res.out[q0:q1], want, rtol=1e-10, atol=1e-10)


_cpu_flash = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


@pytest.mark.skipif(
    _cpu_flash is None, reason="this torch build has no aten._scaled_dot_product_flash_attention_for_cpu"
)
@pytest.mark.parametrize("name", ["plain", "causal", "win2_5", "causal_chunk4"])
def test_lse_matches_torch_cpu_flash(name: str) -> None:
    """LSE of rows that see a key, against torch's CPU flash kernel (it returns the natural-log LSE)."""
    options = CASES[name]
    gen = torch.Generator().manual_seed(41)
    p = make_packed(gen, LENS, 4, 4, 16, dtype=torch.float64)
    res = attention_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, options=options, numerics=FP64)
    for b in range(len(LENS)):
        q0, q1 = int(p.cu_q[b]), int(p.cu_q[b + 1])
        sq, sk = q1 - q0, p.ks[b].shape[0]
        if sq == 0 or sk == 0:
            continue
        bias = _bias(sq, sk, options, None, 4)
        out, lse = _cpu_flash(*(t.transpose(0, 1)[None] for t in (p.qs[b], p.ks[b], p.vs[b])), attn_mask=bias[None])
        seen = torch.isfinite(bias).any(-1)  # (h, sq)
        torch.testing.assert_close(res.lse[:, q0:q1][seen], lse[0][seen], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(
            res.out[q0:q1], out[0].transpose(0, 1).where(seen.T[..., None], 0.0), rtol=1e-10, atol=1e-10
        )
