"""SDPA adapters against the reference: sdpa-cpu end to end, sdpa-cuda's plan as pure functions.

Cases, oracle and check are shared with the flex tests (``torch_cases.py``).  The CUDA end-to-end
test runs only where CUDA is present.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings

from attnfast.base import Support
from attnfast.sdpa import (
    FUSED_LIMITS,
    SdpaCall,
    SdpaCpuBackend,
    SdpaCudaBackend,
    SdpaCudaCudnnBackend,
    SdpaCudaEfficientBackend,
    SdpaCudaFlashBackend,
    bias_for_kernel,
    mask_kind,
    plan_cuda_call,
)
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import make_inputs
from torch_cases import CASES, C, check_backend, random_cases

SOFTCAP_CASE = C([(4, 4)], causal=True, softcap=30.0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_sdpa_cpu_matches_reference(name: str) -> None:
    backend = SdpaCpuBackend()
    case = CASES[name]
    assert backend.supports(case, "cpu"), backend.supports(case, "cpu").reason
    check_backend(backend, case)


@settings(max_examples=150)
@given(random_cases(softcap=False))
def test_sdpa_cpu_random_cases(case: AttentionCase) -> None:
    check_backend(SdpaCpuBackend(), case)


def test_sdpa_cpu_refuses_softcap_and_cuda() -> None:
    backend = SdpaCpuBackend()
    s = backend.supports(SOFTCAP_CASE, "cpu")
    assert not s.ok and s.reason.startswith("softcap:")
    assert not backend.supports(CASES["prefill_causal"], "cuda")
    assert backend.capabilities()["softcap"] == Support(False, "SDPA has no score modifier")


def test_append_uses_k_new_not_the_packed_copy() -> None:
    """A wrong k_new must change the result: the adapter really attends the written tokens."""
    case = CASES["append_paged_nhd"]
    inputs = make_inputs(case, seed=1)
    good = SdpaCpuBackend().prepare(case, inputs)().out
    inputs.k_new = inputs.k_new + 1.0
    bad = SdpaCpuBackend().prepare(case, inputs)().out
    assert not torch.allclose(good.float(), bad.float(), atol=1e-2)


# ---------------------------------------------------------------- sdpa-cuda translation (pure)
ALL = SdpaCudaBackend.default_backends


@pytest.mark.parametrize(
    "case, sq, sk, expected",
    [
        (C([(8, 8)], causal=True), 8, 8, "is_causal"),
        (C([(3, 8)], causal=True), 3, 8, "lower_right"),
        (C([(8, 3)], causal=True), 8, 3, "lower_right"),
        (C([(5, 7)]), 5, 7, "none"),
        (C([(5, 7)], window=(100, 100)), 5, 7, "none"),  # a window wider than the sequence
        (C([(5, 7)], causal=True, window=(100, 0)), 5, 7, "lower_right"),
        (C([(5, 7)], causal=True, window=(2, 0)), 5, 7, "bias"),
        (C([(8, 8)], causal=True, chunk=4), 8, 8, "bias"),
        (C([(8, 8)], causal=True, alibi=True), 8, 8, "bias"),
        (C([(8, 8)], sinks=True), 8, 8, "bias"),
    ],
)
def test_mask_kind(case: AttentionCase, sq: int, sk: int, expected: str) -> None:
    assert mask_kind(case, sq, sk) == expected


def test_plan_cuda_call_choices() -> None:
    # sq == sk causal: every fused backend takes is_causal.
    assert plan_cuda_call(C([(8, 8)], causal=True), 8, 8, ALL) == SdpaCall("is_causal", ALL)
    # bottom-right causal with sq != sk goes through CausalBias, which calls flash directly.
    assert plan_cuda_call(C([(3, 8)], causal=True), 3, 8, ALL) == SdpaCall("lower_right", ("FLASH_ATTENTION",))
    # fp32: only the efficient kernel, and bottom-right causal becomes a bias there.
    fp32 = C([(3, 8)], h=4, hk=2, causal=True, dtype="fp32")
    assert plan_cuda_call(fp32, 3, 8, ALL) == SdpaCall("bias", ("EFFICIENT_ATTENTION",), expand_kv=True)
    # ALiBi with GQA: cuDNN takes a bias and GQA; efficient would need repeated heads.
    alibi = C([(8, 8)], h=4, hk=2, causal=True, alibi=True)
    assert plan_cuda_call(alibi, 8, 8, ALL) == SdpaCall("bias", ("CUDNN_ATTENTION",))
    assert plan_cuda_call(alibi, 8, 8, ("EFFICIENT_ATTENTION",)) == SdpaCall(
        "bias", ("EFFICIENT_ATTENTION",), expand_kv=True
    )
    # MHA bias: both bias-taking backends.
    assert plan_cuda_call(C([(8, 8)], window=(2, 2)), 8, 8, ALL) == SdpaCall(
        "bias", ("EFFICIENT_ATTENTION", "CUDNN_ATTENTION")
    )
    # cuDNN alone: bottom-right causal as a bias, not CausalBias (that would run flash).
    assert plan_cuda_call(C([(3, 8)], causal=True), 3, 8, ("CUDNN_ATTENTION",)) == SdpaCall(
        "bias", ("CUDNN_ATTENTION",)
    )
    # d = 512: only efficient.
    assert plan_cuda_call(C([(4, 4)], d=512), 4, 4, ALL) == SdpaCall("none", ("EFFICIENT_ATTENTION",))
    # cuDNN has no kernel for a single key; flash and efficient take it.
    assert plan_cuda_call(C([(1, 1)], h=4, hk=1), 1, 1, ALL) == SdpaCall("none", ("FLASH_ATTENTION",))
    r = plan_cuda_call(C([(3, 1)]), 3, 1, ("CUDNN_ATTENTION",))
    assert isinstance(r, Support) and "at least 2 keys" in r.reason
    # no key: no kernel; with a sink the sink column is a key.
    assert plan_cuda_call(C([(3, 0)], causal=True), 3, 0, ALL).skip
    sink0 = plan_cuda_call(C([(3, 0)], causal=True, sinks=True), 3, 0, ALL)
    assert isinstance(sink0, SdpaCall) and not sink0.skip and sink0.mask == "bias"


def test_plan_cuda_call_refusals() -> None:
    flash = ("FLASH_ATTENTION",)
    r = plan_cuda_call(C([(5, 7)], causal=True, window=(2, 0)), 5, 7, flash)
    assert isinstance(r, Support) and not r and "FLASH_ATTENTION: takes no bias mask" in r.reason
    r = plan_cuda_call(C([(5, 5)], head_dim_v=16), 5, 5, flash)
    assert isinstance(r, Support) and "head_dim_v == head_dim" in r.reason
    r = plan_cuda_call(C([(5, 5)], dtype="fp32"), 5, 5, ("CUDNN_ATTENTION",))
    assert isinstance(r, Support) and "no fp32 kernel" in r.reason
    # alignment (the fuzzer on the H100: "No available kernel"): a bias needs efficient or cuDNN, whose head
    # dims are multiples of 8 (16-bit; efficient fp32: 4); flash pads, so an unmasked d39 still runs there
    r = plan_cuda_call(C([(1, 0)], d=1, sinks=True), 1, 0, ALL)
    assert isinstance(r, Support) and "multiples of 8, got 1/1" in r.reason
    r = plan_cuda_call(C([(15, 63)], d=39, h=8, hk=2, sinks=True), 15, 63, ALL)
    assert isinstance(r, Support) and "EFFICIENT_ATTENTION: bf16 head dims must be multiples of 8" in r.reason
    r = plan_cuda_call(C([(1, 1)], d=1, dtype="fp32"), 1, 1, ALL)
    assert isinstance(r, Support) and "fp32 head dims must be multiples of 4, got 1/1" in r.reason
    assert plan_cuda_call(C([(3, 3)], d=12, dtype="fp32"), 3, 3, ALL) == SdpaCall("none", ("EFFICIENT_ATTENTION",))
    assert plan_cuda_call(C([(3, 3)], d=39), 3, 3, ALL) == SdpaCall("none", ("FLASH_ATTENTION",))


def test_cuda_backends_declare_and_refuse() -> None:
    with pytest.raises(ValueError, match="sdpa_backends"):
        SdpaCudaBackend(("MATH",))
    assert SdpaCudaBackend().sdpa_backends == tuple(FUSED_LIMITS)
    assert SdpaCudaBackend(("CUDNN_ATTENTION",)).sdpa_backends == ("CUDNN_ATTENTION",)
    case = C([(4, 9)], causal=True)
    assert not SdpaCudaBackend().supports(case, "cpu")
    assert SdpaCudaBackend().supports(case, "cuda")
    assert SdpaCudaBackend().supports(SOFTCAP_CASE, "cuda").reason.startswith("softcap:")
    flash = SdpaCudaFlashBackend()
    assert flash.supports(C([(4, 9)], causal=True, alibi=True), "cuda").reason.startswith("alibi:")
    assert flash.supports(C([(4, 9)], causal=True), "cuda")
    assert SdpaCudaEfficientBackend().supports(C([(4, 9)], h=4, hk=2, causal=True, dtype="fp32"), "cuda")
    assert not SdpaCudaCudnnBackend().supports(C([(4, 4)], d=512), "cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="sdpa-cuda needs a CUDA device")
@pytest.mark.parametrize("cls", [SdpaCudaBackend, SdpaCudaFlashBackend, SdpaCudaEfficientBackend, SdpaCudaCudnnBackend])
@pytest.mark.parametrize("name", sorted(CASES))
def test_sdpa_cuda_matches_reference(cls, name: str) -> None:
    backend, case = cls(), CASES[name]
    support = backend.supports(case, "cuda")
    if not support:
        pytest.skip(f"{backend.name} refuses: {support.reason}")
    check_backend(backend, case, device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="sdpa-cuda needs a CUDA device")
@settings(max_examples=80)
@given(random_cases(softcap=False))
def test_sdpa_cuda_random_cases(case: AttentionCase) -> None:
    backend = SdpaCudaBackend()
    assume(backend.supports(case, "cuda").ok)
    check_backend(backend, case, device="cuda")


def test_a_low_precision_bias_is_shifted_per_row_first() -> None:
    """The fuzzer on the H100: ALiBi on (27, 2) with GQA 9/3, sdpa-cuda, error 4x the baseline's: the bf16 bias
    rounded -slope * 25 to steps of 0.0625.  Shifted by each row's top, the softmax is the fp32 one to bf16 noise."""
    from attnfast._torch_common import score_bias

    case = AttentionCase(requests=((27, 2),), num_heads=9, num_kv_heads=3, head_dim=8, dtype="bf16", alibi=True)
    inputs = make_inputs(case)
    bias = score_bias(case, inputs, 27, 2)
    exact = torch.softmax(bias, dim=-1)
    shifted = torch.softmax(bias_for_kernel(bias, torch.bfloat16).float(), dim=-1)
    plain = torch.softmax(bias.to(torch.bfloat16).float(), dim=-1)
    assert (shifted - exact).abs().max() < 4e-3 < (plain - exact).abs().max()
    assert bias_for_kernel(bias, torch.float32) is bias  # fp32 (CPU MATH): untouched
    masked = torch.tensor([[[-math.inf, -math.inf], [0.5, -math.inf]]])
    assert torch.equal(
        bias_for_kernel(masked, torch.bfloat16).float(), torch.tensor([[[-math.inf] * 2, [0.0, -math.inf]]])
    )
