"""Promises of conformance.verdict.compare that mutmut found unchecked (docs "Mutation testing").

Hand-built tensors of a few elements, with values chosen so every bound is exact in binary floating point:

* an empty output (no tokens) or a zero-width head gives neutral statistics (no error, worst ``(-1, -1, -1)``),
  not an exception or a made-up error;
* the baseline's mean error is the mean over every element, also for a single element;
* the bounds are inclusive: an error (output, masked-row output, LSE) exactly at its bound passes, the
  ``N of M over`` counts only elements past it;
* ``max_rel``, ``mean_abs`` and the failure texts carry the documented numbers (rtol term only when rtol is
  set, the mean-error ratio, ``masked_rows:`` joining its notes with ``"; "``);
* the LSE bound grows with ``lse_rtol * |lse|`` on live rows and has no such term on a fully masked row;
* everything is compared in the reference's dtype: a wider kernel output, baseline or LSE is rounded to it
  first (what rounds to the reference is exact; what overflows it is non-finite, and is counted as such);
* the baseline's part of the bounds (:class:`BaselineErrors`) leaves non-finite baseline elements out of the
  largest and summed error and counts them where the reference is finite; its LSE fields count live rows (finite
  reference) only, and are all None when the baseline has no LSE of the reference's shape;
* ``allowed_max_abs`` takes ``atol`` itself (not the ``atol_rel`` term) where the worst element lies on a fully
  masked row, and on an empty output;
* baseline errors given without their LSE part (an older caller's) are completed from the baseline: the same
  verdict and statistics as with the whole;
* the cosine similarity is 1 for parallel tensors, 0 for orthogonal ones or a zero output, NaN for a zero reference.
"""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

from attnfast.base import KernelOutput
from attnref import AttnResult
from conformance.verdict.compare import (
    BaselineErrors,
    _compare_lse,
    baseline_errors,
    compare_details,
    cosine_similarity,
)
from conformance.verdict.tolerance import Tolerance, is_resolved

TOL = Tolerance(
    factor=2,
    atol=0.5,
    atol_rel=math.inf,  # a fixed atol: these tests pin its arithmetic (the row cap: test_peer_bounds.py)
    rtol=0,
    mean_factor=2,
    mean_atol=10.0,
    lse_factor=2,
    lse_atol=0.5,
    lse_rtol=0,
    min_cosine=0.0,
    max_mismatch_frac=0,
)


def tol(**changes: float) -> Tolerance:
    return dataclasses.replace(TOL, **changes)


def ones_case(tokens: int = 1, heads: int = 1, dim: int = 2, lse: float = 10.0):
    """Reference out all 1 and LSE ``lse`` everywhere; the baseline equals the reference (baseline error 0)."""
    ref = AttnResult(torch.ones(tokens, heads, dim), torch.full((heads, tokens), lse))
    return ref, (ref.out.clone(), ref.lse.clone())


# ---------------------------------------------------------------- the tolerance it is given
@pytest.mark.parametrize("unset", [("lse_rtol",), ("factor", "min_cosine")])
def test_an_unresolved_tolerance_is_refused_naming_its_unset_fields(unset: tuple[str, ...]) -> None:
    ref, base = ones_case()
    partial = dataclasses.replace(TOL, **dict.fromkeys(unset))
    assert not is_resolved(partial) and is_resolved(TOL)
    want = f"tol must be resolved (conformance.verdict.tolerance.resolve); unset fields: {list(unset)}"
    with pytest.raises(ValueError, match=f"^{re.escape(want)}$"):
        compare_details(ref, base, KernelOutput(ref.out.clone(), ref.lse.clone()), partial)


# ---------------------------------------------------------------- degenerate shapes
def test_an_empty_output_has_neutral_statistics() -> None:
    ref = AttnResult(torch.zeros(0, 2, 3), torch.zeros(2, 0))
    stats, details, base_nonfinite = compare_details(
        ref, (ref.out.clone(), ref.lse.clone()), KernelOutput(ref.out.clone(), ref.lse.clone()), TOL
    )
    assert (details, base_nonfinite, stats.failed_checks) == ([], {}, ())
    assert stats.worst == (-1, -1, -1)
    assert (stats.max_abs, stats.max_rel, stats.mean_abs) == (0.0, 0.0, 0.0)
    assert (stats.error_ratio, stats.mismatch_frac) == (0.0, 0.0)
    assert (stats.baseline_max_abs, stats.baseline_mean_abs, stats.nonfinite) == (0.0, 0.0, 0)
    assert math.isnan(stats.cosine)  # an all-0 (here: no) reference skips cosine


def test_a_zero_width_head_is_compared_without_error() -> None:
    ref = AttnResult(torch.zeros(3, 2, 0), torch.ones(2, 3))
    stats, details, _ = compare_details(
        ref, (ref.out.clone(), ref.lse.clone()), KernelOutput(ref.out.clone(), ref.lse.clone()), TOL
    )
    assert details == [] and stats.failed_checks == ()
    assert stats.worst == (-1, -1, -1) and stats.max_abs == 0.0


def test_the_baseline_mean_error_of_one_element_is_that_error() -> None:
    ref, (base_out, base_lse) = ones_case(dim=1)
    base_out += 0.25
    stats, _, _ = compare_details(ref, (base_out, base_lse), KernelOutput(ref.out.clone()), TOL)
    assert stats.baseline_max_abs == 0.25 and stats.baseline_mean_abs == 0.25


# ---------------------------------------------------------------- output bounds and numbers
def test_an_error_exactly_at_the_bound_passes_and_is_not_counted_over() -> None:
    ref, base = ones_case(tokens=2)
    out = ref.out.clone()
    out[1, 0, 1] += 0.5  # |out - ref| == atol, baseline error 0
    stats, details, _ = compare_details(ref, base, KernelOutput(out), TOL)
    assert details == [] and stats.failed_checks == ()
    assert stats.error_ratio == 1.0 and stats.mismatch_frac == 0.0
    assert stats.worst == (1, 0, 1) and stats.max_abs == 0.5


def test_a_masked_row_exactly_at_atol_passes() -> None:
    ref, base = ones_case(tokens=2)
    ref.out[0, 0] = 0.0  # a fully masked row: reference output exactly 0
    base[0][0, 0] = 0.0
    out = ref.out.clone()
    out[0, 0, 1] = 0.5
    stats, details, _ = compare_details(ref, base, KernelOutput(out), TOL)
    assert details == [] and stats.failed_checks == ()
    out[0, 0, 1] = 0.75
    stats, details, _ = compare_details(ref, base, KernelOutput(out), TOL)
    assert "masked_rows" in stats.failed_checks


def test_max_rel_and_mean_abs_are_the_documented_ratios() -> None:
    """``max_rel = max |out-ref| / max(|ref|, atol)``; ``mean_abs = mean |out-ref|``."""
    ref = AttnResult(torch.tensor([[[2.0, 4.0, 0.25, 1.0]]]), torch.zeros(1, 1))
    base = (ref.out.clone(), ref.lse.clone())
    out = ref.out + torch.tensor([[[1.0, 1.0, 0.25, 0.0]]])
    stats, _, _ = compare_details(ref, base, KernelOutput(out), tol(atol=2.0))
    assert stats.max_rel == 0.5  # 1/2 (ref 2), 1/4 (ref 4), 0.25/max(0.25, atol 2)
    assert stats.mean_abs == 2.25 / 4


def test_max_error_text_without_rtol() -> None:
    ref, base = ones_case()
    out = ref.out + torch.tensor([[[2.0, 0.0]]])
    _, details, _ = compare_details(ref, base, KernelOutput(out), TOL)
    assert details[0] == (
        "max_error: |out-ref| 2.0e+00 at (token 0, head 0, dim 0) > allowed 5.0e-01 "
        "(2 x baseline 0.0e+00 + atol 5.0e-01); error ratio 4.00; 1 of 2 elements over (50.00%, allowed 0.00%)"
    )


def test_max_error_text_names_the_rtol_term() -> None:
    ref, base = ones_case()
    out = ref.out + torch.tensor([[[0.0, 2.0]]])
    _, details, _ = compare_details(ref, base, KernelOutput(out), tol(rtol=0.25))
    assert details[0] == (
        "max_error: |out-ref| 2.0e+00 at (token 0, head 0, dim 1) > allowed 7.5e-01 "
        "(2 x baseline 0.0e+00 + atol 5.0e-01 + rtol 0.25 x |ref| 1.0e+00); error ratio 2.67; "
        "1 of 2 elements over (50.00%, allowed 0.00%)"
    )


def test_mean_error_text_gives_the_ratio_to_its_bound() -> None:
    ref, base = ones_case()
    out = ref.out + torch.tensor([[[2.0, 0.0]]])  # mean error 1, allowed 2 x 0 + 0.25
    stats, details, _ = compare_details(ref, base, KernelOutput(out), tol(atol=4.0, mean_atol=0.25))
    assert stats.failed_checks == ("mean_error",)
    assert details == [
        "mean_error: mean|out-ref| 1.0e+00 > allowed 2.5e-01 (2 x baseline mean 0.0e+00 + mean_atol 2.5e-01); "
        "ratio 4.00"
    ]


def test_masked_rows_text_joins_output_and_lse_notes() -> None:
    ref, base = ones_case(tokens=2)
    ref.out[1, 0] = 0.0
    ref.lse[0, 1] = -math.inf
    base = (ref.out.clone(), ref.lse.clone())
    out, lse = ref.out.clone(), ref.lse.clone()
    out[1, 0, 0] = 1.0  # a masked row's output not 0 ...
    lse[0, 1] = 3.0  # ... and its LSE not -inf
    stats, details, _ = compare_details(ref, base, KernelOutput(out, lse), tol(max_mismatch_frac=1.0))
    assert stats.failed_checks == ("masked_rows",)
    assert details == [
        "masked_rows: 1 fully masked rows not 0, first at (token 1, head 0) with max|out| 1.0e+00 > atol 5.0e-01; "
        "1 rows with reference LSE -inf have another kernel LSE, first at (token 1, head 0): 3.0 "
        "(adapters must return -inf, SEMANTICS.md section 4)"
    ]


def test_a_kernel_without_lse_reports_no_nonfinite_baseline() -> None:
    ref, base = ones_case()
    _, _, base_nonfinite = compare_details(ref, base, KernelOutput(ref.out.clone()), TOL)
    assert base_nonfinite == {}


# ---------------------------------------------------------------- LSE
def lse_case(diffs: list[float]):
    """One head, one token per diff: reference LSE 10, kernel LSE 10 + diff; output exact."""
    ref, base = ones_case(tokens=len(diffs))
    lse = ref.lse + torch.tensor([diffs])
    return ref, base, KernelOutput(ref.out.clone(), lse)


def test_an_lse_error_exactly_at_the_bound_passes() -> None:
    ref, base, kernel = lse_case([0.25, 0.5])
    stats, details, _ = compare_details(ref, base, kernel, TOL)
    assert details == [] and stats.lse_max_abs == 0.5 and stats.lse_allowed == 0.5


def test_lse_failure_counts_only_rows_past_the_bound() -> None:
    ref, base, kernel = lse_case([0.5, 0.75, 0.0])  # ratios 1, 1.5, 0
    stats, details, _ = compare_details(ref, base, kernel, TOL)
    assert stats.failed_checks == ("lse",)
    assert details == [
        "lse: |lse-ref| 7.5e-01 at (token 1, head 0) > allowed 5.0e-01 (2 x baseline 0.0e+00 + lse_atol 5.0e-01 "
        "+ lse_rtol 0 x |lse| 1.0e+01); kernel 10.75 vs reference 10; 1 of 3 rows over"
    ]


def test_lse_rtol_widens_the_bound_on_live_rows() -> None:
    ref, base, kernel = lse_case([0.75])  # over lse_atol 0.5, within 0.5 + 0.05 x 10
    stats, details, _ = compare_details(ref, base, kernel, tol(lse_rtol=0.05))
    assert details == [] and stats.lse_allowed == pytest.approx(1.0)


def test_a_masked_rows_lse_bound_has_no_lse_term() -> None:
    """An exact kernel's worst LSE row is the first; a fully masked one is bounded by lse_atol alone."""
    ref, base = ones_case(tokens=2)
    ref.out[0, 0] = 0.0
    ref.lse[0, 0] = -math.inf
    base = (ref.out.clone(), ref.lse.clone())
    stats, details, _ = compare_details(ref, base, KernelOutput(ref.out.clone(), ref.lse.clone()), tol(lse_rtol=0.5))
    assert details == [] and stats.lse_max_abs == 0.0 and stats.lse_allowed == 0.5


def test_compare_lse_returns_empty_texts_when_nothing_fails() -> None:
    """``_compare_lse`` returns ``''`` (not None) for a passing LSE and when no row is masked (its docstring)."""
    ref, base, kernel = lse_case([0.25])
    assert _compare_lse(ref.lse, base[1], kernel.lse, TOL)[2:] == ("", "")


# ---------------------------------------------------------------- the reference's dtype
def test_a_wider_kernel_output_is_rounded_to_the_reference_dtype() -> None:
    """fp64 values that round to the fp32 reference are exact; one beyond fp32's range is non-finite."""
    ref, base = ones_case(tokens=2)
    out, lse = ref.out.double() + 1e-12, ref.lse.double() + 1e-12
    stats, details, _ = compare_details(ref, base, KernelOutput(out, lse), TOL)
    assert details == [] and stats.max_abs == 0.0 and stats.lse_max_abs == 0.0
    out[0, 0, 0] = 1e39
    stats, _, _ = compare_details(ref, base, KernelOutput(out), TOL)
    assert stats.nonfinite == 1 and "nonfinite" in stats.failed_checks


def test_a_wider_baseline_is_rounded_to_the_reference_dtype() -> None:
    ref, _ = ones_case(tokens=2)
    base_out, base_lse = ref.out.double() + 1e-12, ref.lse.double() + 1e-12
    exact = KernelOutput(ref.out.clone(), ref.lse.clone())
    stats, _, base_nonfinite = compare_details(ref, (base_out, base_lse), exact, tol(lse_atol=0.0))
    assert stats.baseline_max_abs == 0.0 and stats.baseline_mean_abs == 0.0
    assert stats.lse_allowed == 0.0 and base_nonfinite == {}
    base_out[1, 0, 1], base_lse[0, 0] = 1e39, 1e39  # finite in fp64, inf in the reference's fp32
    stats, _, base_nonfinite = compare_details(ref, (base_out, base_lse), exact, tol(lse_atol=0.0))
    assert base_nonfinite == {"out": 1, "lse": 1}
    assert stats.baseline_max_abs == 0.0 and stats.lse_allowed == 0.0  # left out of the bounds


def _col(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).reshape(-1, 1, 1)  # (tokens, heads = 1, dv = 1)


def test_baseline_errors_are_exact_and_leave_non_finite_elements_out() -> None:
    inf = math.inf
    ref = AttnResult(_col(1.0, 2.0, 3.0, 4.0, math.nan), torch.tensor([[0.0, -inf, 2.0, 5.0, 1.0]]))
    # out: errors 0.5, 0, nan (counted: the reference is finite), 2.0, and a nan where the reference is nan (not)
    base_out = _col(1.5, 2.0, math.nan, 6.0, math.nan)
    # lse: live rows 0, 2, 3, 4 (row 1's reference is -inf); row 2's baseline is inf (counted), row 1 is dead
    base_lse = torch.tensor([[0.25, 1.0, inf, 4.0, 1.0]])
    got = baseline_errors(ref, (base_out, base_lse))
    assert got == BaselineErrors(out_nonfinite=1, out_max=2.0, out_sum=2.5, lse_nonfinite=1, lse_max=1.0, lse_live=4)
    assert type(got.out_nonfinite) is int and type(got.lse_nonfinite) is int and type(got.lse_live) is int
    for no_lse in (None, base_lse[:, :4]):  # none, or not of the reference's shape
        assert baseline_errors(ref, (base_out, no_lse)) == BaselineErrors(out_nonfinite=1, out_max=2.0, out_sum=2.5)


def test_the_lse_part_is_the_same_read_alone() -> None:
    from conformance.verdict.compare import _lse_baseline

    ref_lse, base_lse = torch.tensor([[0.0, -math.inf, 2.0, 5.0]]), torch.tensor([[0.25, 1.0, math.inf, 7.0]])
    assert _lse_baseline(ref_lse, base_lse) == {"lse_nonfinite": 1, "lse_max": 2.0, "lse_live": 3}


def test_cosine_similarity() -> None:
    r = torch.tensor([1.0, 2.0, -2.0])
    assert cosine_similarity(2 * r, r) == 1.0
    assert cosine_similarity(torch.tensor([2.0, -1.0, 0.0]), r) == 0.0
    assert cosine_similarity(torch.tensor([0.0, 4.0, 3.0]), r) == pytest.approx(2 / 15, abs=0, rel=1e-15)
    assert cosine_similarity(torch.zeros(3), r) == 0.0
    assert math.isnan(cosine_similarity(r, torch.zeros(3)))


def test_allowed_max_takes_atol_on_a_masked_worst_row_and_on_an_empty_output() -> None:
    t = tol(atol_rel=0.25)  # a row cap below atol wherever |ref| < 2
    ref = AttnResult(torch.tensor([[[0.0, 0.0]], [[1.0, 1.0]]]), torch.tensor([[-math.inf, 1.0]]))
    kernel = KernelOutput(torch.tensor([[[0.375, 0.0]], [[1.0, 1.0]]]), ref.lse.clone())  # worst on the masked row
    stats, _, _ = compare_details(ref, (ref.out.clone(), ref.lse.clone()), kernel, t)
    assert stats.worst == (0, 0, 0) and stats.allowed_max_abs == 0.5
    empty = AttnResult(torch.zeros(0, 2, 3), torch.zeros(2, 0))
    stats, _, _ = compare_details(empty, (empty.out, empty.lse), KernelOutput(empty.out, empty.lse), t)
    assert stats.allowed_max_abs == 0.5


def test_baseline_errors_without_their_lse_part_are_completed() -> None:
    ref, base = ones_case(tokens=3, heads=2)
    base[1][1, 2] = 10.125  # a baseline LSE error of 0.125 on one row widens the LSE bound
    kernel = KernelOutput(ref.out + 0.25, ref.lse + 0.5)
    whole = baseline_errors(ref, base)
    partial = BaselineErrors(whole.out_nonfinite, whole.out_max, whole.out_sum)
    assert whole.lse_max == 0.125 and partial.lse_max is None
    got = compare_details(ref, base, kernel, TOL, known=partial)
    assert got == compare_details(ref, base, kernel, TOL, known=whole) == compare_details(ref, base, kernel, TOL)
    assert got[0].lse_allowed == 2 * 0.125 + 0.5
