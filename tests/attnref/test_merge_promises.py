"""Promises of attnref.merge beyond the LSE rules of test_merge.py (mutmut found them unchecked: docs "Mutation
testing"): the refusal of a bad LSE shows the bad value, an output that is not ``(n, h, dv)`` is refused
instead of broadcast into a wrong shape, and half-precision LSEs are merged in fp32."""

from __future__ import annotations

import math

import pytest
import torch

from attnref import merge_many, merge_states


def _part(n: int = 6, h: int = 2, dv: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(n * 7 + h)
    return torch.randn(n, h, dv, generator=g), torch.randn(h, n, generator=g)


@pytest.mark.parametrize(("bad", "shown"), [(math.inf, "inf"), (math.nan, "nan")])
def test_rejected_lse_names_its_value(bad: float, shown: str) -> None:
    (oa, la), (ob, lb) = _part(), _part()
    lb[1, 4] = bad
    with pytest.raises(ValueError, match=rf"lses\[1\] must be finite or -inf \(an empty part\), got {shown} at"):
        merge_states(oa, la, ob, lb)


def test_output_without_a_value_dimension_is_refused() -> None:
    """A 2-D ``(n, h)`` output with a matching ``(h, n)`` LSE would broadcast to ``(n, n, h)``: refused."""
    (oa, la), (ob, lb) = _part(), _part()
    with pytest.raises(ValueError, match=r"part 0: out must be \(n, h, dv\) and lse \(h, n\), got \(6, 2\) and"):
        merge_many([oa[..., 0], ob[..., 0]], [la, lb])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_lses_merge_in_fp32(dtype: torch.dtype) -> None:
    """LSEs that are all fp16 (or all bf16) are merged in fp32, and the result is fp32."""
    (oa, la), (ob, lb) = _part(), _part()
    got = merge_states(oa, la.to(dtype), ob, lb.to(dtype))
    assert got.lse.dtype == torch.float32 and got.out.dtype == torch.float32
