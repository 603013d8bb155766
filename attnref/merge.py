"""Merging partial attention results by their log-sum-exp (cascade, split-KV, context parallel).

If keys are split into disjoint parts A and B, with ``(o_A, lse_A)`` and ``(o_B, lse_B)`` the
attention over each part, attention over all keys is::

    lse = log(exp(lse_A) + exp(lse_B))
    o   = o_A * exp(lse_A - lse) + o_B * exp(lse_B - lse)

computed max-shifted (``torch.logsumexp``; every weight ``exp(lse_p - lse)`` is at most 1), so
fp32 LSEs in the hundreds or thousands neither overflow nor underflow to a wrong answer.

Empty parts: a part where a row saw no key has ``lse = -inf`` (the package convention, and FA3's and
FA4's) and weight 0; a row that saw nothing in any part keeps output 0 and LSE ``-inf``.  FA2 writes
``+inf`` for an empty part (``../shared/SEMANTICS.md`` section 4); that spelling is *rejected* here
(``ValueError`` naming the part and the first position), as is NaN: ``+inf`` is also what an overflowed
LSE looks like, and reading it as "empty" would silently drop a part, reading it as a real value would
silently drop every other part.  Normalise a kernel's convention first, e.g.
``torch.where(torch.isposinf(lse), -torch.inf, lse)``.

Sinks must be added exactly once: give them to one part only.  Layout is the varlen one:
``out (n, h, dv)``, ``lse (h, n)``.  LSEs are merged in fp64 if any part's LSE is fp64, else in fp32;
the merged output has that dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .result import AttnResult

__all__ = ["merge_states", "merge_many"]


def _check_lse(i: int, lse: torch.Tensor) -> None:
    """Raise ``ValueError`` if part ``i``'s LSE holds ``+inf`` or NaN (see the module docstring)."""
    bad = torch.isposinf(lse) | torch.isnan(lse)
    if bool(bad.any()):
        head, token = (int(x) for x in torch.nonzero(bad)[0])
        value = float(lse[head, token])
        raise ValueError(
            f"lses[{i}] must be finite or -inf (an empty part), got {value} at (head {head}, token {token}) "
            f"in {int(bad.sum())} entries; FA2's +inf for an empty part: torch.where(torch.isposinf(lse), -inf, lse)"
        )


def merge_many(outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]) -> AttnResult:
    """Merge any number of partial results over disjoint key sets (rules in the module docstring)."""
    if len(outs) == 0 or len(outs) != len(lses):
        raise ValueError(f"outs and lses must be non-empty and of equal length, got {len(outs)} and {len(lses)}")
    for i, (o, l) in enumerate(zip(outs, lses)):
        if o.dim() != 3 or l.dim() != 2 or tuple(l.shape) != (o.shape[1], o.shape[0]):
            raise ValueError(
                f"part {i}: out must be (n, h, dv) and lse (h, n), got {tuple(o.shape)} and {tuple(l.shape)}"
            )
        if o.shape != outs[0].shape:
            raise ValueError(f"part {i}: out shape {tuple(o.shape)} differs from part 0 {tuple(outs[0].shape)}")
        _check_lse(i, l)
    ct = torch.float64 if any(l.dtype == torch.float64 for l in lses) else torch.float32
    stacked = torch.stack([l.to(ct) for l in lses])  # (p, h, n)
    total = torch.logsumexp(stacked, dim=0)  # max-shifted; -inf only where every part is -inf
    live = torch.isfinite(total)
    safe_total = torch.where(live, total, torch.zeros_like(total))
    weights = torch.where(live[None], torch.exp(stacked - safe_total[None]), torch.zeros_like(stacked))
    out = sum(o.to(ct) * w.transpose(0, 1)[..., None] for o, w in zip(outs, weights))
    return AttnResult(out, total)


def merge_states(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> AttnResult:
    """Merge two partial results (SGLang ``merge_state`` / vLLM ``merge_attn_states``); rules of :func:`merge_many`."""
    return merge_many([out_a, out_b], [lse_a, lse_b])
