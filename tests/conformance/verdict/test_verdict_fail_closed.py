"""The verdict fails closed on non-finite values (issue 17, item 5), and its other documented promises.

Each test here would pass a kernel that a guard of :mod:`conformance.verdict.compare` exists to fail:

* a NaN or +-inf output or LSE where the reference is finite fails, whatever the tolerance (also with
  the bound switched off by an infinite ``atol`` / ``lse_atol``);
* a row the reference says is empty (LSE ``-inf``) needs LSE exactly ``-inf``; with a sink its LSE is the
  sink (finite), so ``-inf`` there fails the numeric LSE check;
* a non-finite baseline (the same-dtype PyTorch attention) never widens a bound: its non-finite elements
  are left out of the baseline's max and mean error, and counted in ``extra["baseline_nonfinite"]``;
* cosine is skipped (NaN) only when the reference is all 0; an all-0 output against a non-zero reference
  has cosine 0; ``max_mismatch_frac`` allows exactly that fraction of elements over the bound.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from attnfast.base import KernelOutput
from attnref import AttnResult
from conformance.cases.case import AttentionCase
from conformance.records import Status
from conformance.verdict.check import check_backend, compare, prepare_context
from conformance.verdict.compare import compare_details
from conformance.verdict.tolerance import Tolerance
from tests.conformance import fakes

TOL = Tolerance(
    factor=2,
    atol=1e-3,
    atol_rel=math.inf,  # a fixed atol: these tests pin its arithmetic (the row cap: test_peer_bounds.py)
    rtol=0,
    mean_factor=2,
    mean_atol=1e-4,
    lse_factor=2,
    lse_atol=1e-3,
    lse_rtol=0,
    min_cosine=0.99,
    max_mismatch_frac=0,
)
NONFINITE = [math.nan, math.inf, -math.inf]
NONFINITE_IDS = ["nan", "+inf", "-inf"]


def hand_built() -> tuple[AttnResult, tuple[torch.Tensor, torch.Tensor]]:
    """4 tokens, 2 heads, dim 3; (token 3, head 0) is a fully masked row (out 0, LSE -inf)."""
    gen = torch.Generator().manual_seed(1)
    out = torch.randn(4, 2, 3, generator=gen)
    out[3, 0] = 0
    lse = torch.randn(2, 4, generator=gen) + 5
    lse[0, 3] = -math.inf
    base_out = out + 0.01 * torch.randn(4, 2, 3, generator=gen)
    base_out[3, 0] = 0
    base_lse = lse + 0.002 * torch.randn(2, 4, generator=gen)
    return AttnResult(out, lse), (base_out, base_lse)


def exact(ref: AttnResult, *, out: torch.Tensor | None = None, lse: torch.Tensor | None = None) -> KernelOutput:
    return KernelOutput(ref.out.clone() if out is None else out, ref.lse.clone() if lse is None else lse)


def test_hand_built_exact_kernel_passes():
    ref, base = hand_built()
    stats = compare(ref, base, exact(ref), TOL)
    assert stats.failed_checks == () and stats.nonfinite == 0 and stats.lse_max_abs == 0


# ---------------------------------------------------------------- output
@pytest.mark.parametrize("bad", NONFINITE, ids=NONFINITE_IDS)
@pytest.mark.parametrize("where", [(1, 1, 2), (3, 0, 1)], ids=["live_row", "masked_row"])
def test_nonfinite_output_where_reference_is_finite_fails(bad, where):
    ref, base = hand_built()
    out = ref.out.clone()
    out[where] = bad
    stats = compare(ref, base, exact(ref, out=out), TOL)
    assert stats.nonfinite == 1
    assert {"nonfinite", "max_error"} <= set(stats.failed_checks)
    assert stats.worst == where and stats.max_abs == math.inf and stats.error_ratio == math.inf
    assert math.isnan(stats.cosine)  # not judged on its own: nonfinite already fails
    if where[0] == 3:
        assert "masked_rows" in stats.failed_checks  # the reference row is exactly 0


@pytest.mark.parametrize("bad", NONFINITE, ids=NONFINITE_IDS)
def test_nonfinite_output_fails_even_with_the_error_bounds_switched_off(bad):
    ref, base = hand_built()
    out = ref.out.clone()
    out[0, 1, 0] = bad
    off = Tolerance(atol=math.inf, mean_atol=math.inf, min_cosine=-1).over(TOL)
    stats, details, _ = compare_details(ref, base, exact(ref, out=out), off)
    assert stats.failed_checks == ("nonfinite",)
    assert details == ["nonfinite: 1 NaN/Inf outputs where the reference is finite, first at (token 0, head 1, dim 0)"]


# ---------------------------------------------------------------- LSE
@pytest.mark.parametrize("bad", NONFINITE, ids=NONFINITE_IDS)
def test_nonfinite_lse_on_a_live_row_fails(bad):
    ref, base = hand_built()
    lse = ref.lse.clone()
    lse[1, 2] = bad
    stats, details, _ = compare_details(ref, base, exact(ref, lse=lse), TOL)
    assert stats.failed_checks == ("lse",)
    assert stats.lse_max_abs == math.inf
    assert details[0].startswith("lse: 1 NaN/Inf LSE where the reference is finite, first at (token 2, head 1)")


@pytest.mark.parametrize("bad", NONFINITE, ids=NONFINITE_IDS)
def test_nonfinite_lse_fails_even_with_the_lse_bound_switched_off(bad):
    ref, base = hand_built()
    lse = ref.lse.clone()
    lse[0, 0] = bad
    off = Tolerance(lse_atol=math.inf).over(TOL)
    stats = compare(ref, base, exact(ref, lse=lse), off)
    assert stats.failed_checks == ("lse",) and stats.lse_max_abs == math.inf
    ok = ref.lse.clone()
    ok[0, 0] += 1e6  # a finite error of any size passes a switched-off bound
    assert compare(ref, base, exact(ref, lse=ok), off).failed_checks == ()


@pytest.mark.parametrize("value", [0.0, 5.0, math.inf, math.nan], ids=["zero", "finite", "+inf", "nan"])
def test_lse_of_an_empty_row_must_be_minus_inf(value):
    """SEMANTICS.md section 4: an empty row's LSE is -inf after the adapter normalises FA2's +inf."""
    ref, base = hand_built()
    lse = ref.lse.clone()
    lse[0, 3] = value
    stats, details, _ = compare_details(ref, base, exact(ref, lse=lse), TOL)
    assert stats.failed_checks == ("masked_rows",)
    assert "1 rows with reference LSE -inf have another kernel LSE, first at (token 3, head 0)" in details[0]


def test_empty_row_with_a_sink_has_the_sink_as_its_lse():
    """With a sink an empty row's reference LSE is the sink (finite): -inf there is a wrong LSE, not a masked row."""
    ref, base = hand_built()
    lse_ref = ref.lse.clone()
    lse_ref[0, 3] = 0.7  # the sink logit of head 0
    base_lse = base[1].clone()
    base_lse[0, 3] = 0.7
    ref, base = AttnResult(ref.out, lse_ref), (base[0], base_lse)
    assert compare(ref, base, exact(ref), TOL).failed_checks == ()
    lse = lse_ref.clone()
    lse[0, 3] = -math.inf
    stats = compare(ref, base, exact(ref, lse=lse), TOL)
    assert stats.failed_checks == ("lse",) and stats.lse_max_abs == math.inf


def test_a_kernel_without_lse_is_not_judged_on_lse():
    ref, base = hand_built()
    stats = compare(ref, base, KernelOutput(ref.out.clone(), None), TOL)
    assert stats.failed_checks == () and stats.lse_max_abs is None and stats.lse_allowed is None


def test_all_rows_masked_needs_only_minus_inf():
    out = torch.zeros(2, 1, 3)
    lse = torch.full((1, 2), -math.inf)
    ref = AttnResult(out, lse)
    stats = compare(ref, (out.clone(), lse.clone()), exact(ref), TOL)
    assert stats.failed_checks == () and stats.lse_max_abs == 0 and math.isnan(stats.cosine)
    bad = lse.clone()
    bad[0, 1] = 1.0
    assert compare(ref, (out, lse), exact(ref, lse=bad), TOL).failed_checks == ("masked_rows",)


# ---------------------------------------------------------------- a non-finite baseline
@pytest.mark.parametrize("bad", NONFINITE, ids=NONFINITE_IDS)
def test_nonfinite_baseline_output_never_widens_the_bound(bad):
    ref, base = hand_built()
    clean = compare(ref, base, exact(ref), TOL)
    broken = base[0].clone()
    broken[0, 0, 0] = bad
    kept = (base[0] - ref.out).abs()
    kept[0, 0, 0] = 0
    stats, _, counts = compare_details(ref, (broken, base[1]), exact(ref), TOL)
    assert stats.baseline_max_abs == pytest.approx(float(kept.max()))
    assert stats.baseline_max_abs <= clean.baseline_max_abs and math.isfinite(stats.allowed_max_abs)
    assert stats.baseline_mean_abs == pytest.approx(float(kept.sum()) / kept.numel())
    assert counts == {"out": 1, "lse": 0}
    # the same kernel error fails with the broken baseline as with the clean one
    out = ref.out.clone()
    out[2, 1, 0] += 0.5
    assert "max_error" in compare(ref, base, exact(ref, out=out), TOL).failed_checks
    assert "max_error" in compare(ref, (broken, base[1]), exact(ref, out=out), TOL).failed_checks
    # a uniform shift under the max bound: the mean bound stays finite and fails it
    shifted = ref.out + 0.5 * stats.allowed_max_abs * torch.sign(ref.out)
    assert "mean_error" in compare(ref, (broken, base[1]), exact(ref, out=shifted), TOL).failed_checks


def test_an_all_nonfinite_baseline_leaves_atol_alone():
    ref, base = hand_built()
    broken = torch.full_like(base[0], math.inf)
    out = ref.out.clone()
    out[1, 0, 1] += 2e-3  # over atol 1e-3, far under any baseline-scaled bound
    stats, _, counts = compare_details(ref, (broken, base[1]), exact(ref, out=out), TOL)
    assert stats.baseline_max_abs == 0 and stats.allowed_max_abs == TOL.atol
    assert "max_error" in stats.failed_checks and counts["out"] == ref.out.numel()


@pytest.mark.parametrize("bad", NONFINITE, ids=NONFINITE_IDS)
def test_nonfinite_baseline_lse_never_widens_the_lse_bound(bad):
    ref, base = hand_built()
    broken = base[1].clone()
    broken[1, 1] = bad
    live = torch.isfinite(ref.lse)
    kept = torch.where(live, (base[1] - ref.lse).abs(), 0.0)
    kept[1, 1] = 0
    lse = ref.lse.clone()
    lse[0, 0] += 0.1
    stats, _, counts = compare_details(ref, (base[0], broken), exact(ref, lse=lse), TOL)
    assert stats.failed_checks == ("lse",)
    assert stats.lse_allowed == pytest.approx(2 * float(kept.max()) + TOL.lse_atol)
    assert counts == {"out": 0, "lse": 1}


def test_baseline_nonfinite_is_recorded_by_check_backend():
    case = AttentionCase(requests=((5, 9), (3, 0)), num_heads=2, num_kv_heads=1, head_dim=16, causal=True)
    ctx = prepare_context(case)
    assert check_backend(ctx, fakes.ExactBackend()).extra.get("baseline_nonfinite") is None
    out, lse = ctx.base[0].clone(), ctx.base[1].clone()
    out[0, 0, 0] = math.inf
    out[1, 1, 1] = math.nan
    lse[0, 2] = math.nan
    broken = dataclasses.replace(ctx, base=(out, lse), fingerprint=None)  # a context of its own
    result = check_backend(broken, fakes.ExactBackend())
    assert result.status is Status.PASS and result.extra["baseline_nonfinite"] == {"out": 2, "lse": 1}
    # and a real bug still fails against it
    assert check_backend(broken, fakes.NoisyBackend()).status is Status.FAIL


# ---------------------------------------------------------------- end to end: a kernel with a NaN LSE
def test_check_backend_fails_a_nan_lse_on_a_live_row():
    class NanLse(fakes.ExactBackend):
        name = "fake-nan-lse"

        def finish(self, case, out, lse):
            lse = lse.clone()
            lse[1, 0] = math.nan  # token 0 of a causal (5, 9) request sees 5 keys: live
            return KernelOutput(out.to(case.torch_dtype), lse.float())

    case = AttentionCase(requests=((5, 9),), num_heads=2, num_kv_heads=1, head_dim=16, causal=True)
    result = check_backend(prepare_context(case), NanLse())
    assert result.status is Status.FAIL and result.stats.failed_checks == ("lse",)
    assert result.reason.startswith("lse: 1 NaN/Inf LSE where the reference is finite, first at (token 0, head 1)")


# ---------------------------------------------------------------- cosine and mismatch_frac
def test_cosine_is_skipped_only_for_an_all_zero_reference():
    ref, base = hand_built()
    loose = Tolerance(factor=1e9, mean_factor=1e9).over(TOL)
    stats = compare(ref, base, exact(ref, out=torch.zeros_like(ref.out)), loose)
    assert stats.cosine == 0.0 and stats.failed_checks == ("cosine",)
    zero = AttnResult(torch.zeros_like(ref.out), ref.lse)
    stats = compare(zero, (torch.zeros_like(ref.out), base[1]), exact(zero), TOL)
    assert math.isnan(stats.cosine) and "cosine" not in stats.failed_checks


def test_cosine_threshold_is_inclusive_and_scale_free():
    ref, base = hand_built()
    loose = Tolerance(factor=1e9, mean_factor=1e9).over(TOL)
    stats = compare(ref, base, exact(ref, out=3 * ref.out), loose)
    assert stats.cosine == pytest.approx(1.0, abs=1e-12) and stats.failed_checks == ()
    at = Tolerance(min_cosine=stats.cosine).over(loose)
    assert compare(ref, base, exact(ref, out=3 * ref.out), at).failed_checks == ()


def test_mismatch_frac_allows_exactly_that_fraction():
    ref, base = hand_built()
    n = ref.out.numel()
    out = ref.out.clone()
    out[0, 0, 0] += 0.5
    out[2, 1, 2] -= 0.5
    one = Tolerance(max_mismatch_frac=1 / n).over(TOL)
    two = Tolerance(max_mismatch_frac=2 / n).over(TOL)
    stats = compare(ref, base, exact(ref, out=out), one)
    assert stats.mismatch_frac == pytest.approx(2 / n) and "max_error" in stats.failed_checks
    assert "2 of 24 elements over" in compare_details(ref, base, exact(ref, out=out), one)[1][0]
    assert "max_error" not in compare(ref, base, exact(ref, out=out), two).failed_checks


def test_masked_row_output_is_judged_against_atol_alone():
    """A fully masked row (reference output exactly 0) allows |out| <= atol, not the baseline-scaled bound."""
    ref, base = hand_built()
    for value, fails in ((0.9e-3, False), (1.1e-3, True)):
        out = ref.out.clone()
        out[3, 0, 2] = value
        stats = compare(ref, base, exact(ref, out=out), TOL)
        assert ("masked_rows" in stats.failed_checks) is fails
        assert "max_error" not in stats.failed_checks  # under 2 x baseline + atol


# ---------------------------------------------------------------- no pass carries a NaN/inf statistic (issue 29)
def test_check_backend_fails_one_nan_output_and_one_nan_lse_and_the_record_says_so():
    class NanBoth(fakes.ExactBackend):
        name = "fake-nan-both"

        def finish(self, case, out, lse):
            out, lse = out.clone(), lse.clone()
            out[2, 1, 3] = math.nan
            lse[0, 4] = math.nan  # token 4 of a causal (5, 9) request sees 9 keys: live
            return KernelOutput(out.to(case.torch_dtype), lse.float())

    case = AttentionCase(requests=((5, 9),), num_heads=2, num_kv_heads=1, head_dim=16, causal=True)
    result = check_backend(prepare_context(case), NanBoth())
    assert result.status is Status.FAIL is result.effective_status
    assert {"nonfinite", "max_error", "lse"} <= set(result.stats.failed_checks)
    assert result.stats.nonfinite == 1 and math.isinf(result.stats.max_abs) and math.isinf(result.stats.lse_max_abs)
    assert "max_abs=inf" in result.stats.nonfinite_fields() and "nonfinite=1" in result.stats.nonfinite_fields()


def test_check_backend_never_passes_nonfinite_statistics_a_sub_check_missed(monkeypatch):
    """Defence in depth: were a sub-check of compare() to miss a NaN statistic, check_backend still fails it."""
    from conformance.verdict import check as check_module

    real = check_module.compare_pending  # the comparison check_backend reads with the guard's fingerprints
    for field in ("max_abs", "mean_abs", "error_ratio", "max_rel", "lse_max_abs"):
        for bad in (math.nan, math.inf):

            def missed(*args, field=field, bad=bad, **kwargs):
                plan = real(*args, **kwargs)

                def finish(values):
                    stats, _, base = plan.finish(values)
                    return dataclasses.replace(stats, failed_checks=(), **{field: bad}), [], base

                return dataclasses.replace(plan, finish=finish)

            monkeypatch.setattr(check_module, "compare_pending", missed)
            case = AttentionCase(requests=((3, 3),), num_heads=1, num_kv_heads=1, head_dim=8)
            result = check_backend(prepare_context(case), fakes.ExactBackend())
            assert result.status is Status.FAIL, (field, bad)
            assert result.reason == f"nonfinite statistics: {field}={bad}"


def test_a_nan_cosine_of_an_all_zero_reference_is_not_a_nonfinite_statistic():
    ref, base = hand_built()
    zero = AttnResult(torch.zeros_like(ref.out), ref.lse)
    stats = compare(zero, (torch.zeros_like(ref.out), base[1]), exact(zero), TOL)
    assert math.isnan(stats.cosine) and stats.nonfinite_fields() == ()
    assert dataclasses.replace(stats, cosine=math.inf).nonfinite_fields() == ("cosine=inf",)
