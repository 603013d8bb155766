"""Input distributions beyond Gaussian (``AttentionCase.data``) and the upstream gradient of a backward case.

Random normal q, k and v give every softmax row a broad spread of comparable scores; bugs that only show on rows
of another shape pass them.  ``data`` picks one of :data:`~conformance.cases.case_tables.DATA`, applied to the fp32
draws of :func:`conformance.cases.inputs.make_inputs` before they are rounded to the case dtype:

* ``outliers``: one token row in 16 (of q and of k) scaled by 8, so some scores are 8 or 64 times the rest
  (large-magnitude rows: overflow of an unscaled exp, a max taken over the wrong tile);
* ``peaked``: q scaled by 8, every softmax row near one-hot (the derivative of a saturated softmax, dS small
  against P and dP);
* ``offset_v``: V shifted by +8, so every output row carries a large common component and in the backward pass
  ``dP_ij - rowsum(dO_i * O_i)`` cancels to a small difference of large numbers (where a kernel that computes the
  row sum in low precision, or from the wrong row, is far off).

The upstream gradient ``dout`` of a backward case (``(total_q, h, dv)``, the case dtype) is drawn from its own
generator, seeded from (case, seed) like the inputs but apart from them, so a backward case's forward inputs are
exactly those of the same case without ``backward``.
"""

from __future__ import annotations

import torch

__all__ = ["OUTLIER_EVERY", "OUTLIER_SCALE", "grad_out", "shape_data"]

#: One token row in ``OUTLIER_EVERY`` is an outlier, scaled by ``OUTLIER_SCALE`` (``outliers``).
OUTLIER_EVERY = 16
OUTLIER_SCALE = 8.0
#: ``peaked``: the factor on q.
PEAK_SCALE = 8.0
#: ``offset_v``: the common component added to V.
V_OFFSET = 8.0


def _outlier_rows(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    n = x.shape[0]
    if n == 0:
        return x
    pick = torch.randperm(n, generator=gen)[: max(1, n // OUTLIER_EVERY)]
    x = x.clone()
    x[pick] *= OUTLIER_SCALE
    return x


def shape_data(
    data: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v (fp32 draws, token-major) reshaped to the distribution ``data`` names; unchanged for ``""``."""
    if data == "":
        return q, k, v
    if data == "outliers":
        return _outlier_rows(q, gen), _outlier_rows(k, gen), v
    if data == "peaked":
        return q * PEAK_SCALE, k, v
    if data == "offset_v":
        return q, k, v + V_OFFSET
    raise ValueError(f"data must be one of '', 'outliers', 'peaked', 'offset_v'; got {data!r}")


def grad_out(case, seed: int) -> torch.Tensor:
    """The upstream gradient of ``case``'s output: standard normal ``(total_q, h, dv)`` in the case dtype, on the CPU
    (the caller moves it), from a generator of its own seeded from (case, seed)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + int(case.digest(), 16) + 7919)
    return torch.randn(case.total_q, case.num_heads, case.dv, generator=gen).to(case.torch_dtype)
