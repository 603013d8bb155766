"""Merging partial attention results by their log-sum-exp (cascade, split-KV, context parallel).

If keys are split into disjoint parts A and B, with ``(o_A, lse_A)`` and ``(o_B, lse_B)`` the
attention over each part, attention over all keys is::

    lse = log(exp(lse_A) + exp(lse_B))
    o   = o_A * exp(lse_A - lse) + o_B * exp(lse_B - lse)

A part where a row saw nothing has ``lse = -inf`` and weight 0; a row that saw nothing in any part
keeps output 0 and LSE ``-inf`` (the package convention).  Sinks must be added exactly once: give
them to one part only.  Layout is the varlen one: ``out (n, h, dv)``, ``lse (h, n)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .result import AttnResult

__all__ = ["merge_states", "merge_many"]


def merge_many(outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]) -> AttnResult:
    """Merge any number of partial results over disjoint key sets."""
    if len(outs) == 0 or len(outs) != len(lses):
        raise ValueError(f"outs and lses must be non-empty and of equal length, got {len(outs)} and {len(lses)}")
    for i, (o, l) in enumerate(zip(outs, lses)):
        if o.dim() != 3 or l.dim() != 2 or tuple(l.shape) != (o.shape[1], o.shape[0]):
            raise ValueError(
                f"part {i}: out must be (n, h, dv) and lse (h, n), got {tuple(o.shape)} and {tuple(l.shape)}"
            )
        if o.shape != outs[0].shape:
            raise ValueError(f"part {i}: out shape {tuple(o.shape)} differs from part 0 {tuple(outs[0].shape)}")
    stacked = torch.stack(
        [l.to(torch.float64 if l.dtype == torch.float64 else torch.float32) for l in lses]
    )  # (p, h, n)
    total = torch.logsumexp(stacked, dim=0)
    finite = torch.isfinite(total)
    safe_total = torch.where(finite, total, torch.zeros_like(total))
    weights = torch.where(finite[None], torch.exp(stacked - safe_total[None]), torch.zeros_like(stacked))
    out = sum(o.to(weights.dtype) * w.transpose(0, 1)[..., None] for o, w in zip(outs, weights))
    return AttnResult(out, total)


def merge_states(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> AttnResult:
    """Merge two partial results (SGLang ``merge_state`` / vLLM ``merge_attn_states``)."""
    return merge_many([out_a, out_b], [lse_a, lse_b])
