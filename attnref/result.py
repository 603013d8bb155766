"""The value every reference entry point returns."""

from __future__ import annotations

from typing import NamedTuple

import torch


class AttnResult(NamedTuple):
    """``out`` in the compute dtype, ``lse`` fp32/fp64 natural log.

    Layouts follow the kernels': varlen ``out (total_q, h, dv)`` with ``lse (h, total_q)``;
    padded ``out (b, sq, h, dv)`` with ``lse (b, h, sq)``.
    """

    out: torch.Tensor
    lse: torch.Tensor


class AttnGrads(NamedTuple):
    """Gradients of a loss ``sum(out * dout)`` with respect to the inputs of an attention call.

    Layouts follow the inputs': varlen ``dq (total_q, h, d)``, ``dk (total_k, hk, d)``, ``dv (total_k, hk, dv)``
    (for GQA/MQA summed over the query heads of each group); ``dsinks (h,)`` when the call had sinks, else None.
    """

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    dsinks: torch.Tensor | None = None
