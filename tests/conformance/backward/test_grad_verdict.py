"""The per-tensor gradient judgement, its tolerance table and the gradient cache (conformance/backward/)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from conformance.backward import gradients as grad_mod
from conformance.backward.verdict import DTYPE_DEFAULTS, SOFTCAP_ATOL, judge, resolve_grad
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import make_inputs
from conformance.verdict.tolerance import DTYPE_DEFAULTS as FORWARD

TOL = DTYPE_DEFAULTS["bf16"]


def tensors(seed: int = 0, shape=(6, 2, 4)):
    gen = torch.Generator().manual_seed(seed)
    ref = torch.randn(shape, generator=gen)
    base = ref + 1e-2 * torch.randn(shape, generator=gen)
    return ref, base


def test_within_the_bound_passes_beyond_it_fails_with_the_index() -> None:
    ref, base = tensors()
    stats, problems = judge("dq", base.clone(), ref, base, TOL)
    assert problems == [] and 0 < stats["error_ratio"] <= 1 and stats["failed"] == []
    bad = base.clone()
    bad[3, 1, 2] += 1.0
    stats, problems = judge("dq", bad, ref, base, TOL)
    assert stats["worst"] == "(token 3, head 1, dim 2)" and stats["error_ratio"] > 1
    assert problems[0].startswith("backward dq: max error ") and "at (token 3, head 1, dim 2) > allowed " in problems[0]
    assert "(2 x baseline " in problems[0] and "1 of 48 elements over" in problems[0]


def test_nonfinite_fails_whatever_the_tolerance_and_a_nonfinite_baseline_never_widens() -> None:
    ref, base = tensors()
    bad = base.clone()
    bad[0, 0, 0] = math.nan
    loose = dataclasses.replace(TOL, atol=math.inf, mean_atol=math.inf)
    stats, problems = judge("dv", bad, ref, base, loose)
    assert stats["nonfinite"] == 1 and "nonfinite" in stats["failed"]
    assert "first at (key 0, kv head 0, dim 0)" in problems[0]
    inf_base = base.clone()
    inf_base[1, 1, 1] = math.inf
    stats, _ = judge("dv", base, ref, inf_base, TOL)
    assert math.isfinite(stats["baseline_max_abs"])


def test_mean_and_cosine_checks() -> None:
    ref, base = tensors()
    shifted = ref + 0.9 * (base - ref).abs().max()  # every element near the bound: the mean check trips
    stats, problems = judge("dk", shifted, ref, base, TOL)
    assert "mean_error" in stats["failed"] and any("mean error" in p for p in problems)
    flipped = -ref
    stats, problems = judge("dk", flipped, ref, base, dataclasses.replace(TOL, rtol=3.0, mean_atol=10.0))
    assert stats["failed"] == ["cosine"] and stats["cosine"] < 0


def test_shape_mismatch_and_sinks_layout() -> None:
    ref, base = tensors()
    stats, problems = judge("dk", ref[:3], ref, base, TOL)
    assert stats["failed"] == ["shape"] and problems == [
        "backward dk: shape (3, 2, 4) != reference (6, 2, 4) (key, kv head, dim)"
    ]
    r, b = torch.ones(4), torch.ones(4)
    g = r.clone()
    g[2] = 5
    assert "at (head 2)" in judge("dsinks", g, r, b, TOL)[1][0]


def test_tolerance_table_follows_the_forward_and_flash_attention() -> None:
    for dtype, tol in DTYPE_DEFAULTS.items():
        fwd = FORWARD[dtype]
        assert (tol.factor, tol.atol, tol.mean_atol, tol.min_cosine) == (2, fwd.atol, fwd.mean_atol, fwd.min_cosine)
    case = AttentionCase(requests=((4, 4),), num_heads=2, num_kv_heads=1, head_dim=8, backward=True, softcap=30.0)
    capped = resolve_grad(case)
    assert capped.factor == 3 and capped.atol == FORWARD["bf16"].atol + SOFTCAP_ATOL
    assert resolve_grad(case.replace(softcap=None)) == TOL


def test_gradients_are_cached_per_case_inputs() -> None:
    case = AttentionCase(
        requests=((9, 9), (3, 12)), num_heads=2, num_kv_heads=1, head_dim=8, causal=True, backward=True
    )
    inputs = make_inputs(case, 0)
    first = grad_mod.gradients(case, inputs)
    clones = dataclasses.replace(inputs, q=inputs.q.clone(), dout=inputs.dout.clone())
    assert grad_mod.gradients(case, clones) is first
    other = grad_mod.gradients(case, make_inputs(case, 1))
    assert other is not first
    # the baseline is in the case dtype, near the fp32 reference but not equal to it
    assert first.base.dq.dtype == torch.bfloat16 and first.ref.dq.dtype == torch.float32
    err = (first.base.dq.float() - first.ref.dq).abs().max()
    assert 0 < err < 0.05 * first.ref.dq.abs().max()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gradients_on_cuda_match_the_cpu_ones() -> None:
    case = AttentionCase(
        requests=((40, 40), (7, 90)), num_heads=4, num_kv_heads=2, head_dim=64, causal=True, sinks=True, backward=True
    )
    cpu, gpu = grad_mod.gradients(case, make_inputs(case, 0)), grad_mod.gradients(case, make_inputs(case, 0, "cuda"))
    for name in ("dq", "dk", "dv", "dsinks"):
        ref_c, ref_g = getattr(cpu.ref, name), getattr(gpu.ref, name).cpu()
        assert torch.allclose(ref_c, ref_g, atol=1e-4, rtol=1e-4), name  # strict fp32 on both (no TF32)
        base_c, base_g = getattr(cpu.base, name).float(), getattr(gpu.base, name).float().cpu()
        assert (base_c - base_g).abs().max() <= 2 * (base_c - ref_c).abs().max() + 1e-3, name


def test_a_true_zero_gradient_is_not_judged_by_its_direction() -> None:
    """One visible key per row: dS = 0 exactly, the reference holds rounding noise; exact zeros pass."""
    gen = torch.Generator().manual_seed(3)
    noise = 1e-6 * torch.randn(6, 2, 4, generator=gen)
    stats, problems = judge("dq", torch.zeros(6, 2, 4), noise, torch.zeros(6, 2, 4), TOL)
    assert problems == [] and stats["cosine_judged"] is False and stats["cosine"] == 0.0
    ref, base = tensors()
    stats, problems = judge("dq", -ref, ref, base, dataclasses.replace(TOL, rtol=3.0, mean_atol=10.0))
    assert stats["cosine_judged"] and stats["failed"] == ["cosine"]


def test_sdpa_cpu_passes_a_window_of_one_key() -> None:
    """Measured on default's covering cases: sdpa-cpu returns exact zeros where dQ and dK vanish (w0-0)."""
    from attnfast.registry import get_backend
    from conformance.records import Status
    from conformance.verdict.check import check_backend, prepare_context

    case = AttentionCase(requests=((6, 6), (1, 1), (3, 9)), num_heads=4, num_kv_heads=2, head_dim=32, window=(0, 0))
    r = check_backend(prepare_context(case.replace(backward=True)), get_backend("sdpa-cpu"))
    assert r.status is Status.PASS, r.reason
    assert r.extra["backward"]["tensors"]["dq"]["cosine_judged"] is False


def test_the_atol_grows_with_the_gradient_magnitude_as_flash_attention_tests_do():
    """flash-attention's dq_atol: twice the rounding noise of the reference in the case dtype (bf16 in [16, 32): half
    an ulp is 0.0625)."""
    import torch

    from conformance.backward.verdict import DTYPE_DEFAULTS, judge, rounding_atol

    ref = torch.linspace(16, 31, 1000, dtype=torch.float64)
    assert rounding_atol(ref, torch.bfloat16) == 0.125
    assert rounding_atol(torch.linspace(0.25, 0.5, 100), torch.bfloat16) <= DTYPE_DEFAULTS["bf16"].atol
    assert rounding_atol(ref, None) == 0.0
    got = ref.clone()
    got[7] += 0.1  # 0.1 off at ~16: within 2 x 0 + 0.125, far over 2^-8
    shape = (1000, 1, 1)
    stats, problems = judge(
        "dv", got.reshape(shape), ref.reshape(shape), ref.reshape(shape), DTYPE_DEFAULTS["bf16"], torch.bfloat16
    )
    assert problems == [] and stats["atol"] == 0.125
    _, problems = judge("dv", got.reshape(shape), ref.reshape(shape), ref.reshape(shape), DTYPE_DEFAULTS["bf16"])
    assert problems and "max error" in problems[0]  # the fixed atol alone (2^-8) does not cover it
