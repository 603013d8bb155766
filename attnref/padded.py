"""Padded batches ``(b, s, h, d)``: every sequence has ``sq`` queries; keys may be limited per
sequence by ``seqlens_k`` (FA2 ``flash_attn_with_kvcache``'s ``cache_seqlens``)."""

from __future__ import annotations

import torch

from .core import attend_sequence
from .options import AttnOptions, Numerics
from .result import AttnResult
from .validate import check_alibi, check_head_vector, check_qkv, check_qv, check_seqlens
from .varlen import sequence_slopes

__all__ = ["attention_padded"]


@torch.no_grad()
def attention_padded(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    seqlens_k: torch.Tensor | None = None,
    options: AttnOptions = AttnOptions(),
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    qv: torch.Tensor | None = None,
    numerics: Numerics = Numerics(),
) -> AttnResult:
    """Reference attention over a padded batch.

    Args:
        q: (b, sq, h, d).  k: (b, sk, hk, d).  v: (b, sk, hk, dv).
        seqlens_k: (b,) keys used per sequence (<= sk); None = all ``sk``.
        qv: (b, sq, h, dv) MLA-absorbed query part scored against V (:mod:`attnref.mla`).

    Returns:
        ``AttnResult(out (b, sq, h, dv), lse (b, h, sq))``.
    """
    h, hk, d, dv = check_qkv(q, k, v, token_dims=2)
    batch, sq = q.shape[:2]
    if k.shape[0] != batch:
        raise ValueError(f"k batch ({k.shape[0]}) must equal q batch ({batch})")
    sk = k.shape[1]
    lens = [sk] * batch if seqlens_k is None else check_seqlens("seqlens_k", seqlens_k, batch, sk)
    check_alibi(alibi_slopes, batch, h, q.device)
    check_head_vector("sinks", sinks, h, q.device)
    check_qv(qv, q, dv)
    out = torch.zeros(batch, sq, h, dv, dtype=numerics.dtype, device=q.device)
    lse = torch.full((batch, h, sq), float("-inf"), dtype=numerics.dtype, device=q.device)
    for b in range(batch):
        slopes = sequence_slopes(alibi_slopes, b)
        out[b], lse[b] = attend_sequence(
            q[b],
            k[b, : lens[b]],
            v[b, : lens[b]],
            options,
            alibi_slopes=slopes,
            sinks=sinks,
            qv=None if qv is None else qv[b],
            numerics=numerics,
        )
    return AttnResult(out, lse)
