"""The low-precision baseline: plain PyTorch attention in the inputs' own dtype.

This is flash-attention's test helper ``attention_ref(..., upcast=False)`` (``../shared/SEMANTICS.md``
section 7): it measures how far a *correct* implementation that works in bf16/fp16 lands from the
fp32 reference, and the tolerance model scales every allowed error by that distance.  Steps, per
sequence and per tile of query rows:

1. ``s = (q * scale) @ k^T`` in the input dtype (the scale applied to q first, as attention_ref does),
   plus ``(qv * scale) @ v^T`` with an MLA-absorbed ``qv`` (default scale ``1/sqrt(d + dv)``);
2. soft-cap in the input dtype: ``tanh(s / cap) * cap``;
3. to fp32; ALiBi ``-slope * |i + sk - sq - j|``; mask to ``-inf`` (:func:`attnref.row_bounds`);
4. softmax in fp32 with the sink in the denominator only; ``P`` cast to the input dtype, and for an
   fp8-quantized V through the fp8 format and back (``attention_ref``'s ``intermediate_dtype``: an
   fp8 kernel multiplies P by V in fp8, so the baseline rounds P as it does);
5. ``P @ V`` in the input dtype.

Fully masked rows give 0 output and LSE ``-inf`` (the sink's value with sinks), the reference's
convention.  The LSE is fp32, computed from the low-precision scores.  A quantized case's inputs are
its dequantized values (fp32), rounded here to the activation dtype like flash-attention's fp8
tests do.  Each tile holds at most
``MAX_TILE_ELEMS`` scores (heads x query rows x keys), so memory stays bounded for long sequences.
"""

from __future__ import annotations

import math

import torch

from attnref import row_bounds

from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs, cp_totals, host_ints
from conformance.verdict.reference import case_options, strict_fp32

__all__ = ["MAX_TILE_ELEMS", "baseline"]

MAX_TILE_ELEMS = 1 << 24


@torch.no_grad()
def baseline(case: AttentionCase, inputs: CaseInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Same-dtype PyTorch attention of ``case``.

    Returns ``out (total_q, h, dv)`` in the case dtype and ``lse (h, total_q)`` fp32.
    """
    dt = case.torch_dtype
    dev = inputs.q.device
    h, hk, d, dv = case.num_heads, case.num_kv_heads, case.head_dim, case.dv
    group = h // hk
    scale = case.scale if case.scale is not None else 1.0 / math.sqrt(d + (dv if case.qv else 0))
    inter = None
    if inputs.quant is not None and inputs.quant.v is not None and inputs.quant.v.dtype.is_floating_point:
        inter = inputs.quant.v.dtype  # fp8 V: P goes through fp8 before P @ V
    options = case_options(case)
    totals = cp_totals(inputs, case)  # context parallel: each sequence's total keys, for the cp rule of its mask
    out = torch.zeros(case.total_q, h, dv, dtype=dt, device=dev)
    lse = torch.full((h, case.total_q), -math.inf, dtype=torch.float32, device=dev)
    sink = None if inputs.sinks is None else inputs.sinks.to(dev, torch.float32).reshape(h, 1)
    slopes = None if inputs.alibi_slopes is None else inputs.alibi_slopes.to(dev, torch.float32).reshape(h, 1, 1)
    cu_q, cu_k = host_ints(inputs.cu_seqlens_q), host_ints(inputs.cu_seqlens_k)  # known on the host: no read

    with strict_fp32():
        for b, (sq, sk) in enumerate(case.requests):
            q0, k0 = cu_q[b], cu_k[b]
            if sq == 0:
                continue
            if sk == 0:  # nothing to attend: output stays 0, LSE is the sink or -inf
                if sink is not None:
                    lse[:, q0 : q0 + sq] = sink
                continue
            # (h, sk, d): query head i reads kv head i // group
            kb = inputs.k[k0 : k0 + sk].to(dt).repeat_interleave(group, dim=1).permute(1, 0, 2)
            vb = inputs.v[k0 : k0 + sk].to(dt).repeat_interleave(group, dim=1).permute(1, 0, 2)
            qb = (inputs.q[q0 : q0 + sq].to(dt) * scale).permute(1, 0, 2)  # rounded to dt, like attention_ref
            qvb = None if inputs.qv is None else (inputs.qv[q0 : q0 + sq].to(dt) * scale).permute(1, 0, 2)
            cols = torch.arange(sk, device=dev)
            if totals is None:
                seq_options = options
            else:
                assert options.cp is not None  # set with the totals (cp_world > 1)
                seq_options = options.with_(cp=options.cp.with_total(totals[b]))
            tq = max(1, min(sq, MAX_TILE_ELEMS // (h * sk)))
            for t0 in range(0, sq, tq):
                t1 = min(sq, t0 + tq)
                o, l = _tile(
                    qb[:, t0:t1],
                    kb,
                    vb,
                    torch.arange(t0, t1, device=dev),
                    cols,
                    sq,
                    sk,
                    seq_options,
                    slopes,
                    sink,
                    None if qvb is None else qvb[:, t0:t1],
                    inter,
                )
                out[q0 + t0 : q0 + t1] = o.permute(1, 0, 2)
                lse[:, q0 + t0 : q0 + t1] = l
    return out, lse


def _tile(q, k, v, rows, cols, sq, sk, options, slopes, sink, qv=None, inter=None) -> tuple[torch.Tensor, torch.Tensor]:
    """One tile of query rows of one sequence: out (h, tq, dv) in the input dtype, lse (h, tq) fp32."""
    s = torch.matmul(q, k.transpose(-1, -2))  # (h, tq, sk), input dtype
    if qv is not None:
        s = s + torch.matmul(qv, v.transpose(-1, -2))
    if options.softcap is not None:
        s = torch.tanh(s / options.softcap) * options.softcap
    s = s.float()
    if slopes is not None:
        s = s - slopes * (rows[:, None] + (sk - sq) - cols[None, :]).abs().float()
    lo, hi = row_bounds(rows, sq, sk, options)
    hidden = (cols[None, :] < lo[:, None]) | (cols[None, :] >= hi[:, None])
    s = s.masked_fill(hidden, -math.inf)
    m = s.amax(dim=-1)
    if sink is not None:
        m = torch.maximum(m, sink)
    m = torch.where(torch.isneginf(m), 0.0, m)  # fully masked row: keep exp() finite
    e = torch.exp(s - m[..., None])
    denom = e.sum(dim=-1)
    if sink is not None:
        denom = denom + torch.exp(sink - m)
    live = denom > 0
    safe = torch.where(live, denom, 1.0)
    p = (e / safe[..., None]).to(v.dtype)
    if inter is not None:
        p = p.to(inter).to(v.dtype)
    o = torch.matmul(p, v)
    o = torch.where(live[..., None], o, 0.0)
    l = torch.where(live, m + torch.log(safe), -math.inf)
    return o, l
