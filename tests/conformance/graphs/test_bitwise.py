"""The bitwise comparison behind the invariance and graph-vs-eager verdicts (``conformance.graphs.bitwise``): equal
means the same bits in every row of ``out`` and, where both sides have one, of ``lse``; NaN equals NaN only at
the same place."""

from __future__ import annotations

import math

import pytest
import torch

from attnfast.base import KernelOutput
from conformance.graphs.bitwise import Diff, diff_rows

NAN, INF = float("nan"), float("inf")


def _out(rows: int = 4, h: int = 2, dv: int = 3, lse: bool = True) -> KernelOutput:
    g = torch.Generator().manual_seed(0)
    out = torch.randn(rows, h, dv, generator=g)
    return KernelOutput(out, torch.randn(h, rows, generator=g) if lse else None)


def _clone(o: KernelOutput) -> KernelOutput:
    return KernelOutput(o.out.clone(), None if o.lse is None else o.lse.clone())


def test_the_same_bits_are_equal() -> None:
    a = _out()
    d = diff_rows(a, _clone(a))
    assert d == Diff(rows=0, total_rows=4, max_abs=0.0, lse_compared=True)
    assert d.equal and d.describe() == "bitwise equal"
    assert d.to_json() == {"equal": True, "rows": 0, "total_rows": 4, "max_abs": 0.0}


@pytest.mark.parametrize("side", ["a", "b"])
@pytest.mark.parametrize("where", ["out", "lse"])
def test_bitwise_nan_on_one_side_only_differs(side: str, where: str) -> None:
    """A NaN where the other output holds a number is a difference, whichever side holds it: a kernel that
    writes NaN in one variant did not keep the promise."""
    a, b = _out(), _out()
    target = a if side == "a" else b
    (target.out if where == "out" else target.lse)[2 if where == "out" else 1, 2 if where == "lse" else 1] = NAN
    d = diff_rows(a, b)
    assert not d.equal and d.rows == 1 and d.total_rows == 4
    assert d.max_abs == 0.0  # the NaN is no finite difference; every other value is equal
    assert d.describe() == "1 of 4 rows differ, max |diff| 0"


def test_nan_at_the_same_place_on_both_sides_is_equal_at_different_places_is_not() -> None:
    a, b = _out(), _out()
    a.out[1, 0, 0] = b.out[1, 0, 0] = NAN  # a row neither wrote is still the same row
    a.lse[0, 3] = b.lse[0, 3] = NAN
    assert diff_rows(a, b).equal
    b.out[1, 0, 0], b.out[1, 0, 1] = 0.5, NAN  # NaN in the same row, another column
    d = diff_rows(a, b)
    assert d.rows == 1 and not d.equal


def test_infinities_are_equal_only_with_the_same_sign_and_never_enter_max_abs() -> None:
    a, b = _out(), _out()
    a.lse[0, 0] = b.lse[0, 0] = -INF  # an empty row's LSE on both sides
    assert diff_rows(a, b).equal
    b.lse[0, 0] = INF
    b.out[3, 1, 2] = a.out[3, 1, 2] + 0.25
    d = diff_rows(a, b)
    assert d.rows == 2 and d.max_abs == pytest.approx(0.25)


def test_rows_count_query_tokens_across_heads_and_lse() -> None:
    a, b = _out(rows=5, h=3), _out(rows=5, h=3)
    b.out[0, 2, 1] += 1.0  # row 0 through out, head 2
    b.lse[1, 0] -= 2.0  # row 0 again, through the LSE: still one row
    b.lse[0, 4] += 0.5  # row 4 through the LSE only
    d = diff_rows(a, b)
    assert (d.rows, d.total_rows) == (2, 5)
    assert d.max_abs == pytest.approx(2.0)  # the largest gap of out and LSE together
    assert d.describe() == "2 of 5 rows differ, max |diff| 2"
    assert d.to_json() == {"equal": False, "rows": 2, "total_rows": 5, "max_abs": d.max_abs}


def test_max_abs_is_the_gap_in_double_of_the_largest_difference() -> None:
    a, b = _out(), _out()
    b.out[2, 0, 0] = a.out[2, 0, 0] - 3.0
    b.out[3, 0, 0] = a.out[3, 0, 0] + 1.0
    d = diff_rows(a, b)
    assert d.rows == 2 and d.max_abs == pytest.approx(3.0, rel=1e-6)
    assert isinstance(d.max_abs, float)


def test_one_ulp_is_a_difference() -> None:
    a = _out()
    b = _clone(a)
    b.out[0, 0, 0] = torch.nextafter(a.out[0, 0, 0], torch.tensor(INF))
    d = diff_rows(a, b)
    assert d.rows == 1 and 0 < d.max_abs < 1e-6


@pytest.mark.parametrize("missing", ["a", "b", "both"])
def test_lse_is_compared_only_where_both_sides_have_one(missing: str) -> None:
    a, b = _out(), _out()
    b.lse[0, 1] += 1.0  # a difference the comparison must not see without both LSEs
    a = KernelOutput(a.out, None) if missing in ("a", "both") else a
    b = KernelOutput(b.out, None) if missing in ("b", "both") else b
    d = diff_rows(a, b)
    assert d.equal and d.lse_compared is False
    assert diff_rows(_out(), _out()).lse_compared is True


def test_b_is_compared_in_the_dtype_of_a() -> None:
    a = KernelOutput(_out().out.to(torch.bfloat16), None)
    assert diff_rows(a, KernelOutput(a.out.float(), None)).equal
    f32 = _out().out
    assert diff_rows(KernelOutput(f32, None), KernelOutput(f32.double() + 1e-12, None)).equal  # rounds away


def test_outputs_of_different_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match=r"outputs of different shapes: \(4, 2, 3\) vs \(5, 2, 3\)"):
        diff_rows(_out(rows=4), _out(rows=5))


def test_an_empty_output_is_equal_with_no_gap() -> None:
    d = diff_rows(_out(rows=0), _out(rows=0))
    assert d == Diff(0, 0, 0.0, True) and not math.isnan(d.max_abs)


def test_the_row_mask_of_a_vector_is_per_element() -> None:
    """A 1-D tensor has no other dimension to reduce: each element is its own row."""
    from conformance.graphs.bitwise import _row_mask

    differs, gap = _row_mask(torch.tensor([1.0, NAN, 2.0, 4.0]), torch.tensor([1.0, NAN, 3.0, NAN]), 0)
    assert differs.tolist() == [False, False, True, True] and gap == 1.0
