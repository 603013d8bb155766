"""A naive float64 attention written in differentiable torch ops, whose autograd is the gradient oracle.

Independent of :mod:`attnref` like :mod:`oracle` (whose numpy mask it reuses): one full (h, sq, sk) score matrix,
the SEMANTICS.md section 3 order (``scale * q.k``, soft-cap, mask, ALiBi ``-slope * |i + sk - sq - j|``), a sink
column that joins only the denominator, and a max-shifted softmax that leaves a fully masked row at output 0 (its
LSE ``-inf``, or the sink).  GQA expands K/V to the query heads with ``repeat_interleave`` so that autograd, not
this code, sums dK/dV over each group.  Gradients: :func:`oracle_grads` (``torch.autograd.grad`` of
``sum(out * dout)``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from oracle import oracle_mask

__all__ = ["naive_attention", "oracle_grads", "oracle_grads_batch"]


def naive_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    left: int | None = None,
    right: int | None = None,
    softcap: float | None = None,
    scale: float | None = None,
    chunk: int | None = None,
    alibi: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence, float64, differentiable in q, k, v and sinks: out (sq, h, dv), lse (h, sq)."""
    sq, h, d = q.shape
    sk, hk, dv = v.shape
    group = h // hk
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    mask = torch.from_numpy(oracle_mask(sq, sk, left=left, right=right, causal=causal, chunk=chunk))
    kx = k.repeat_interleave(group, dim=1).transpose(0, 1)  # (h, sk, d)
    vx = v.repeat_interleave(group, dim=1).transpose(0, 1)  # (h, sk, dv)
    s = sc * torch.matmul(q.transpose(0, 1), kx.transpose(1, 2))  # (h, sq, sk)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~mask, -math.inf)
    if alibi is not None:
        dist = (torch.arange(sq)[:, None] + sk - sq - torch.arange(sk)[None, :]).abs().to(torch.float64)
        s = s - alibi.reshape(h, 1, 1) * dist
    extra = torch.full((h, sq, 1), -math.inf, dtype=torch.float64) if sinks is None else sinks.reshape(h, 1, 1)
    full = torch.cat([s, extra.expand(h, sq, 1)], dim=-1)  # the sink column joins the denominator only
    top = full.detach().amax(dim=-1, keepdim=True)
    top = torch.where(torch.isneginf(top), torch.zeros_like(top), top)
    e = torch.exp(full - top)
    denom = e.sum(-1, keepdim=True)
    safe = torch.where(denom > 0, denom, torch.ones_like(denom))
    out = torch.matmul(e[..., :sk] / safe, vx)  # (h, sq, dv)
    lse = (top + torch.log(denom)).squeeze(-1)
    return out.transpose(0, 1), lse


def oracle_grads(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    *,
    alibi: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(dq, dk, dv, dsinks) of ``sum(out * dout)`` for one sequence, by autograd in float64."""
    leaves = [t.detach().to(torch.float64).requires_grad_(True) for t in (q, k, v)]
    sink_leaf = None if sinks is None else sinks.detach().to(torch.float64).requires_grad_(True)
    al = None if alibi is None else alibi.to(torch.float64)
    out, _ = naive_attention(*leaves, alibi=al, sinks=sink_leaf, **kwargs)
    wrt = leaves + ([] if sink_leaf is None else [sink_leaf])
    if out.numel() == 0:
        zeros = [torch.zeros_like(t) for t in wrt]
        return (*zeros[:3], zeros[3] if sink_leaf is not None else None)
    grads = torch.autograd.grad((out * dout.to(torch.float64)).sum(), wrt, allow_unused=True)
    grads = [torch.zeros_like(w) if g is None else g for g, w in zip(grads, wrt)]
    return grads[0], grads[1], grads[2], grads[3] if sink_leaf is not None else None


def oracle_grads_batch(
    qs: Sequence[torch.Tensor],
    ks: Sequence[torch.Tensor],
    vs: Sequence[torch.Tensor],
    douts: Sequence[torch.Tensor],
    *,
    alibi: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Varlen layout of per-sequence oracle gradients; ``dsinks`` summed over the sequences."""
    parts = []
    for b, (q, k, v, do) in enumerate(zip(qs, ks, vs, douts)):
        slopes = None if alibi is None else (alibi if alibi.dim() == 1 else alibi[b])
        parts.append(oracle_grads(q, k, v, do, alibi=slopes, sinks=sinks, **kwargs))
    dsinks = None if sinks is None else torch.stack([p[3] for p in parts]).sum(0)
    return tuple(torch.cat([p[i] for p in parts], 0) for i in range(3)) + (dsinks,)
