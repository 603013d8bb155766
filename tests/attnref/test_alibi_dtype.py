"""``alibi_dtype``: ALiBi as an adapter's additive bias, each row shifted by its top and rounded to a dtype (SDPA's
fused kernels take a bias only in the query dtype), in the forward and the backward of the reference.

Checked against an independent float64 autograd of the same rounded bias, over the masking modes, with and without
sinks; the rounding must be visible in bf16 and the exact penalty kept with ``alibi_dtype`` the computation dtype.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnref import AttnOptions, Numerics, attention_varlen, attention_varlen_backward, row_bounds

F64 = torch.float64
LENS = [(20, 300), (33, 33), (9, 4)]  # (9, 4) without causal: rows whose nearest key is off the diagonal
H, HK, D = 4, 2, 8
MODES = {
    "full": AttnOptions(),
    "causal": AttnOptions(causal=True),
    "window_7_3": AttnOptions(window=(7, 3)),
    "chunk16_causal": AttnOptions(chunk=16, causal=True),
    "window_right_only": AttnOptions(window=(None, 2)),
}


def _inputs(sinks: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    tq, tk = sum(s for s, _ in LENS), sum(k for _, k in LENS)
    q = torch.randn(tq, H, D, generator=gen, dtype=F64) * 3  # large scores: far keys carry weight
    k = torch.randn(tk, HK, D, generator=gen, dtype=F64)
    v = torch.randn(tk, HK, D, generator=gen, dtype=F64)
    dout = torch.randn(tq, H, D, generator=gen, dtype=F64)
    slopes = 2.0 ** -(torch.arange(1, H + 1, dtype=F64) * 0.75)  # not powers of two: ALiBi not exact in bf16
    sink = (torch.randn(H, generator=gen, dtype=F64) + 2.0) if sinks else None
    cu_q = torch.tensor([0] + [sum(s for s, _ in LENS[: i + 1]) for i in range(len(LENS))], dtype=torch.int32)
    cu_k = torch.tensor([0] + [sum(k for _, k in LENS[: i + 1]) for i in range(len(LENS))], dtype=torch.int32)
    return q, k, v, dout, slopes, sink, cu_q, cu_k


def _explicit(q, k, v, dout, slopes, sink, cu_q, cu_k, options: AttnOptions, dtype):
    """out, lse, dq, dk, dv by float64 autograd, ALiBi the row-shifted bias rounded to ``dtype`` (None: exact)."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    outs, lses = [], []
    for b, (sq, sk) in enumerate(LENS):
        qs, ks, vs = q[cu_q[b] : cu_q[b + 1]], k[cu_k[b] : cu_k[b + 1]], v[cu_k[b] : cu_k[b + 1]]
        kr, vr = ks.repeat_interleave(H // HK, 1), vs.repeat_interleave(H // HK, 1)
        s = torch.einsum("ihd,jhd->hij", qs, kr) / math.sqrt(D)
        lo, hi = row_bounds(torch.arange(sq), sq, sk, options)
        j = torch.arange(sk)[None, :]
        visible = (j >= lo[:, None]) & (j < hi[:, None])
        bias = -slopes[:, None, None] * (torch.arange(sq)[:, None] + sk - sq - j).abs().to(F64)
        bias = bias.masked_fill(~visible, -math.inf)
        parts = bias if sink is None else torch.cat([bias, sink[:, None, None].expand(H, sq, 1)], dim=-1)
        if dtype is not None:
            top = parts.amax(-1, keepdim=True)
            top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
            parts = (parts - top).to(dtype).to(F64) + top
        logits = torch.cat([s, torch.zeros(H, sq, 1, dtype=F64)], -1) if sink is not None else s
        has = (visible.any(-1) if sink is None else torch.ones(sq, dtype=torch.bool))[None, :, None]
        logits = torch.where(has, logits + parts, 0.0)  # a row without keys: output 0, LSE -inf, no gradient
        lse = torch.where(has[..., 0], torch.logsumexp(logits, -1), -math.inf)
        p = torch.exp(logits - logits.logsumexp(-1, keepdim=True))[..., :sk] * has
        outs.append(torch.einsum("hij,jhd->ihd", p, vr))
        lses.append(lse)
    out = torch.cat(outs)
    (out * dout).sum().backward()
    return out.detach(), torch.cat(lses, -1).detach(), q.grad, k.grad, v.grad


def _ref(q, k, v, dout, slopes, sink, cu_q, cu_k, options, dtype):
    kw = dict(options=options, alibi_slopes=slopes, sinks=sink, numerics=Numerics(F64), alibi_dtype=dtype)
    fwd = attention_varlen(q, k, v, cu_q, cu_k, **kw)
    g = attention_varlen_backward(q, k, v, dout, cu_q, cu_k, **kw)
    return fwd.out, fwd.lse, g.dq, g.dk, g.dv


@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("mode", list(MODES))
def test_alibi_dtype_matches_the_rounded_bias(mode: str, sinks: bool) -> None:
    args = _inputs(sinks, seed=len(mode))
    options = MODES[mode]
    got = _ref(*args, options, torch.bfloat16)
    want = _explicit(*args, options, torch.bfloat16)
    exact = _ref(*args, options, None)
    for name, g, w, e in zip(("out", "lse", "dq", "dk", "dv"), got, want, exact):
        fin = torch.isfinite(w)
        assert torch.equal(fin, torch.isfinite(g)), (name, mode)
        assert torch.allclose(g[fin], w[fin], rtol=1e-9, atol=1e-9), (name, mode, float((g - w)[fin].abs().max()))
        assert float((g - e)[fin].abs().max()) > 1e-4, (name, mode)  # the bf16 rounding is there


@pytest.mark.parametrize("mode", list(MODES))
def test_alibi_dtype_of_the_computation_dtype_is_the_exact_penalty(mode: str) -> None:
    """Shifted by the row's top, rounded to float64 and the top added back: the exact ALiBi (the LSE too)."""
    args = _inputs(True, seed=3)
    for g, e in zip(_ref(*args, MODES[mode], F64), _ref(*args, MODES[mode], None)):
        fin = torch.isfinite(e)
        assert torch.allclose(g[fin], e[fin], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("call", ["forward", "backward"])
def test_alibi_dtype_must_be_a_float_dtype(call: str) -> None:
    q, k, v, dout, slopes, _, cu_q, cu_k = _inputs(False)
    with pytest.raises(ValueError, match="^alibi_dtype must be one of"):
        if call == "forward":
            attention_varlen(q, k, v, cu_q, cu_k, alibi_slopes=slopes, alibi_dtype=torch.int8)
        else:
            attention_varlen_backward(q, k, v, dout, cu_q, cu_k, alibi_slopes=slopes, alibi_dtype=torch.int8)
