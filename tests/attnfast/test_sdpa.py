"""SDPA adapters against the reference: sdpa-cpu end to end, sdpa-cuda's plan as pure functions.

The oracle is :func:`attnref.attention_varlen` in fp32 on the packed keys of ``make_inputs`` (for
paged / append cases those are the keys the adapter must reconstruct from the cache and k_new).
The CUDA end-to-end test runs only where CUDA is present.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from attnfast.base import Support
from attnfast.sdpa import (
    FUSED_LIMITS,
    SdpaCall,
    SdpaCpuBackend,
    SdpaCudaBackend,
    SdpaCudaCudnnBackend,
    SdpaCudaEfficientBackend,
    SdpaCudaFlashBackend,
    mask_kind,
    plan_cuda_call,
)
from attnref import AttnOptions, attention_varlen
from conformance.case import AttentionCase
from conformance.inputs import make_inputs

#: (atol, rtol) of the output per dtype against the fp32 oracle; the LSE is fp32 throughout.
OUT_TOL = {"bf16": (2e-2, 2e-2), "fp16": (4e-3, 4e-3), "fp32": (2e-5, 2e-5)}
LSE_TOL = (1e-3, 1e-4)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Run these tiny-tensor tests on one intra-op thread, then restore the setting.

    On the 2-core CI container a 1k-element softmax took 19 ms with 2 threads and 8 us with 1
    (thread wake-up dominates); this keeps the module well inside the test-time budget.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def C(requests, h=4, hk=4, d=32, **kw) -> AttentionCase:
    return AttentionCase(requests=tuple(requests), num_heads=h, num_kv_heads=hk, head_dim=d, **kw)


CASES = {
    "prefill_causal": C([(7, 7), (16, 16)], causal=True),
    "chunked_causal_gqa": C([(3, 10), (1, 5), (8, 8)], h=4, hk=2, causal=True),
    "sq_gt_sk_causal": C([(9, 4), (5, 5)], causal=True),
    "window_sym": C([(6, 9), (12, 12)], window=(3, 2)),
    "window_causal": C([(10, 10), (2, 9)], causal=True, window=(4, 0)),
    "window_sq_gt_sk": C([(8, 3)], window=(1, 1)),
    "chunk": C([(10, 10), (3, 11)], causal=True, chunk=4),
    "chunk_sq_gt_sk": C([(7, 3)], chunk=2, causal=True),
    "alibi": C([(6, 9), (4, 4)], h=6, hk=3, causal=True, alibi=True),
    "alibi_noncausal": C([(5, 7)], alibi=True),
    "sinks": C([(5, 8), (1, 1)], causal=True, sinks=True),
    "sinks_empty_kv": C([(3, 0), (2, 5)], sinks=True, causal=True),
    "mqa_decode": C([(1, 9), (1, 3), (1, 1)], h=4, hk=1, causal=True),
    "empty_kv": C([(4, 0), (3, 3)], causal=True),
    "empty_q": C([(0, 5), (3, 3)], causal=True),
    "cross": C([(3, 7), (5, 2)]),
    "dv": C([(5, 5), (2, 6)], d=32, head_dim_v=16, causal=True),
    "scale": C([(4, 6)], scale=0.3, causal=True),
    "fp16": C([(5, 8)], causal=True, dtype="fp16"),
    "fp32": C([(5, 8)], h=4, hk=2, causal=True, dtype="fp32", alibi=True),
    "paged_nhd_bs1": C([(3, 10), (1, 7)], causal=True, kv_layout="NHD", block_size=1),
    "paged_nhd_bs16": C([(3, 40), (5, 5), (1, 17)], h=4, hk=2, causal=True, kv_layout="NHD", block_size=16),
    "paged_hnd_bs16": C([(3, 40), (1, 0)], causal=True, kv_layout="HND", block_size=16, window=(8, 0)),
    "paged_nhd_bs256": C([(2, 300), (4, 4)], h=2, hk=1, causal=True, kv_layout="NHD", block_size=256),
    "append_paged_nhd": C([(3, 10), (1, 7)], causal=True, kv_layout="NHD", block_size=4, append=True),
    "append_paged_hnd_sinks": C([(2, 5), (1, 1)], causal=True, kv_layout="HND", block_size=1, append=True, sinks=True),
    "append_contiguous": C([(2, 9), (4, 4)], h=4, hk=2, causal=True, append=True),
}
SOFTCAP_CASE = C([(4, 4)], causal=True, softcap=30.0)


@st.composite
def random_cases(draw, softcap: bool) -> AttentionCase:
    """Small random cases over every axis the adapter translates (derandomized: reproducible)."""
    append = draw(st.booleans())
    lens = st.sampled_from([0, 1, 2, 3, 5, 8, 13])
    requests = []
    for _ in range(draw(st.integers(1, 3))):
        q, k = draw(lens), draw(lens)
        requests.append((min(q, k), k) if append else (q, k))
    hk = draw(st.sampled_from([1, 2]))
    causal = draw(st.booleans())
    extent = st.one_of(st.none(), st.integers(0, 6))
    layout = draw(st.sampled_from(["contiguous", "NHD", "HND"]))
    return AttentionCase(
        requests=tuple(requests),
        num_heads=hk * draw(st.sampled_from([1, 2, 3])),
        num_kv_heads=hk,
        head_dim=draw(st.sampled_from([8, 16])),
        head_dim_v=draw(st.sampled_from([None, 8])),
        dtype=draw(st.sampled_from(["bf16", "fp32"])),
        kv_layout=layout,
        block_size=None if layout == "contiguous" else draw(st.sampled_from([1, 3, 16])),
        causal=causal,
        window=(draw(extent), draw(st.sampled_from([None, 0])) if causal else draw(extent)),
        chunk=draw(st.one_of(st.none(), st.integers(1, 5))),
        softcap=draw(st.one_of(st.none(), st.sampled_from([2.0, 30.0]))) if softcap else None,
        alibi=draw(st.booleans()),
        sinks=draw(st.booleans()),
        scale=draw(st.one_of(st.none(), st.sampled_from([0.1, 1.0]))),
        append=append,
    )


def oracle(case: AttentionCase, inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 reference (out, lse) of a case from its packed keys."""
    opts = AttnOptions(causal=case.causal, window=case.window, softcap=case.softcap, scale=case.scale, chunk=case.chunk)
    res = attention_varlen(
        inputs.q, inputs.k, inputs.v, inputs.cu_seqlens_q, inputs.cu_seqlens_k,
        options=opts, alibi_slopes=inputs.alibi_slopes, sinks=inputs.sinks,
    )
    return res.out, res.lse


def check_backend(backend, case: AttentionCase, device: str = "cpu") -> None:
    """Run the backend twice (idempotence) and compare out and LSE with the oracle."""
    inputs = make_inputs(case, seed=1, device=device)
    cache_before = None if inputs.k_cache is None else inputs.k_cache.clone()
    run = backend.prepare(case, inputs)
    first, second = run(), run()
    ref_out, ref_lse = oracle(case, inputs)
    atol, rtol = OUT_TOL[case.dtype]
    assert first.out.shape == (case.total_q, case.num_heads, case.dv)
    assert first.out.dtype == case.torch_dtype
    torch.testing.assert_close(first.out.float(), ref_out.float(), atol=atol, rtol=rtol)
    assert first.lse is not None and first.lse.dtype == torch.float32
    torch.testing.assert_close(first.lse, ref_lse.float(), atol=LSE_TOL[0], rtol=LSE_TOL[1])
    assert torch.equal(first.out, second.out) and torch.equal(first.lse, second.lse)
    if cache_before is not None:  # an append writes into a clone, never into the case's inputs
        assert torch.equal(inputs.k_cache, cache_before)


@pytest.mark.parametrize("name", sorted(CASES))
def test_sdpa_cpu_matches_reference(name: str) -> None:
    backend = SdpaCpuBackend()
    case = CASES[name]
    assert backend.supports(case, "cpu"), backend.supports(case, "cpu").reason
    check_backend(backend, case)


@settings(max_examples=150, deadline=None, derandomize=True)
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
    assert plan_cuda_call(alibi, 8, 8, ("EFFICIENT_ATTENTION",)) == SdpaCall("bias", ("EFFICIENT_ATTENTION",), expand_kv=True)
    # MHA bias: both bias-taking backends.
    assert plan_cuda_call(C([(8, 8)], window=(2, 2)), 8, 8, ALL) == SdpaCall("bias", ("EFFICIENT_ATTENTION", "CUDNN_ATTENTION"))
    # cuDNN alone: bottom-right causal as a bias, not CausalBias (that would run flash).
    assert plan_cuda_call(C([(3, 8)], causal=True), 3, 8, ("CUDNN_ATTENTION",)) == SdpaCall("bias", ("CUDNN_ATTENTION",))
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
@settings(max_examples=80, deadline=None, derandomize=True)
@given(random_cases(softcap=False))
def test_sdpa_cuda_random_cases(case: AttentionCase) -> None:
    backend = SdpaCudaBackend()
    assume(backend.supports(case, "cuda").ok)
    check_backend(backend, case, device="cuda")
