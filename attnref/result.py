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
