"""Bitwise comparison of two kernel outputs (the invariance and graph-vs-eager verdicts).

Tolerances have no place here: an engine that promises batch invariance or a graph replay equal to its eager call
promises the same bits.  NaN equals NaN only where both outputs hold it at the same place (a row neither wrote is
still the same row).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from attnfast.base import KernelOutput

__all__ = ["Diff", "diff_rows"]


@dataclass(frozen=True)
class Diff:
    """How two outputs differ: rows (query tokens) whose output or LSE differs in any bit, the largest absolute
    difference among finite values, and whether the LSE was compared (both sides had one)."""

    rows: int
    total_rows: int
    max_abs: float
    lse_compared: bool

    @property
    def equal(self) -> bool:
        return self.rows == 0

    def describe(self) -> str:
        if self.equal:
            return "bitwise equal"
        return f"{self.rows} of {self.total_rows} rows differ, max |diff| {self.max_abs:.3g}"

    def to_json(self) -> dict[str, Any]:
        return {"equal": self.equal, "rows": self.rows, "total_rows": self.total_rows, "max_abs": self.max_abs}


def _row_mask(a: torch.Tensor, b: torch.Tensor, row_dim: int) -> tuple[torch.Tensor, float]:
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    other = [d for d in range(a.dim()) if d != row_dim]
    # no mutate: torch 2.13's all(dim=[]) reduces nothing, as the else branch does; the branch does not rely on it
    # (an empty dim list reduces every dimension in other reductions, sum(dim=[]))
    differs = ~same.all(dim=other) if other else ~same  # pragma: no mutate
    both = torch.isfinite(a) & torch.isfinite(b)
    gap = (a.double() - b.double()).abs()[both]
    return differs, float(gap.max()) if gap.numel() else 0.0


def diff_rows(a: KernelOutput, b: KernelOutput) -> Diff:
    """Compare ``out`` ``(rows, h, dv)`` bit for bit, and ``lse`` ``(h, rows)`` where both have one."""
    if a.out.shape != b.out.shape:
        raise ValueError(f"outputs of different shapes: {tuple(a.out.shape)} vs {tuple(b.out.shape)}")
    rows, gap = _row_mask(a.out, b.out.to(a.out.dtype), 0)
    lse_compared = a.lse is not None and b.lse is not None
    if a.lse is not None and b.lse is not None:  # (lse_compared, spelt out for the type checker)
        lrows, lgap = _row_mask(a.lse.float(), b.lse.float(), 1)
        rows, gap = rows | lrows, max(gap, lgap)
    return Diff(int(rows.sum()), int(a.out.shape[0]), gap, lse_compared)
