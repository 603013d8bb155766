"""``flashmla``: translation on CPU against ``fake_vllm`` (FlashMLA's measured conventions), and the real
kernel on a GPU through the harness's verdict (skipped unless FlashMLA imports)."""

from __future__ import annotations

import pytest
import torch

from attnfast._fa_common import PreparedKernel
from attnfast.base import NOT_DECLARED
from attnfast.flashmla import FlashMLABackend, flashmla_plan, import_flashmla
from conformance.cases.inputs import make_inputs
from conformance.cases.sweep import MLA_SCALE
from conformance.records import Status
from conformance.verdict.check import check_backend, compare, prepare_context
from conformance.verdict.tolerance import resolve
from fake_fa3 import available_or_skip, fa_case as C
from fake_vllm import make_fake_flashmla

BACKEND = FlashMLABackend()
MLA = dict(num_kv_heads=1, head_dim=64, head_dim_v=512, qv=True, kv_layout="NHD", block_size=64)

CASES = {
    "decode_h16": C([(1, 300), (1, 77), (1, 1)], num_heads=16, causal=True, scale=MLA_SCALE, **MLA),
    "decode_h128_default_scale": C([(1, 300), (1, 77)], num_heads=128, causal=True, **MLA),
    "spec4_causal": C([(4, 300), (4, 77), (4, 5)], num_heads=16, causal=True, scale=MLA_SCALE, **MLA),
    "spec4_noncausal": C([(4, 300), (4, 77)], num_heads=16, scale=MLA_SCALE, **MLA),
    "sqgtsk": C([(4, 2), (4, 77)], num_heads=16, causal=True, scale=MLA_SCALE, **MLA),
    "empty": C([(1, 0), (1, 77)], num_heads=16, causal=True, scale=MLA_SCALE, **MLA),
    "hnd": C([(1, 300), (1, 77)], num_heads=16, causal=True, scale=MLA_SCALE, **{**MLA, "kv_layout": "HND"}),
    "fp16": C([(2, 300), (2, 77)], num_heads=32, causal=True, scale=MLA_SCALE, dtype="fp16", **MLA),
}


def run_fake(case):
    fake = make_fake_flashmla()
    ctx = prepare_context(case, 0, "cpu")
    meta, _ = fake.get_mla_metadata()
    got = PreparedKernel(fake.flash_mla_with_kvcache, flashmla_plan(case, ctx.inputs, meta))()
    return compare(ctx.ref, ctx.base, got, resolve(case, BACKEND.name)), fake


@pytest.mark.parametrize(
    "case, reason",
    [
        (C([(1, 30)], num_heads=16, causal=True), "needs qv"),
        (C([(1, 30)], num_heads=16, **{**MLA, "head_dim": 128}), "512 latent + 64 rope"),
        (C([(1, 30)], num_heads=16, **{**MLA, "num_kv_heads": 2}), "one latent head"),
        (C([(1, 30)], num_heads=16, **{**MLA, "block_size": 16}), "page size 64"),
        (C([(1, 30)], num_heads=16, **{**MLA, "kv_layout": "contiguous", "block_size": None}), "page size 64"),
        (C([(1, 30), (4, 40)], num_heads=16, **MLA), "one q_len"),
        (C([(1, 30)], num_heads=16, window=(8, 0), **MLA), "window"),
        (C([(1, 30)], num_heads=16, softcap=30.0, **MLA), "soft-cap"),
        (C([(1, 30)], num_heads=16, sinks=True, **MLA), "sparse path only"),
        (C([(1, 30)], num_heads=16, quant="fp8_e4m3", **MLA), "takes no descale"),
        (C([(1, 30)], num_heads=16, head_dim=192, head_dim_v=128, v_padded=True), NOT_DECLARED),
    ],
)
def test_refusal_reasons(case, reason):
    got = BACKEND.supports(case, "cuda")
    assert not got and reason in got.reason, got.reason


@pytest.mark.parametrize("name", sorted(CASES))
def test_translation_against_fake(name):
    assert BACKEND.supports(CASES[name], "cuda")
    stats, _ = run_fake(CASES[name])
    assert not stats.failed_checks, (name, stats)


def test_query_and_cache_are_576_wide_nope_first():
    case = CASES["spec4_causal"]
    inputs = make_inputs(case)
    kw = flashmla_plan(case, inputs, object()).kwargs
    assert kw["q"].shape == (3, 4, 16, 576)
    assert torch.equal(kw["q"][..., :512].reshape(12, 16, 512), inputs.qv), "the absorbed q_nope comes first"
    assert torch.equal(kw["q"][..., 512:].reshape(12, 16, 64), inputs.q)
    assert kw["k_cache"] is inputs.mla_cache and kw["head_dim_v"] == 512
    assert kw["cache_seqlens"].tolist() == [300, 77, 5] and kw["cache_seqlens"].dtype == torch.int32


def test_is_available_names_the_missing_module():
    try:
        import_flashmla()
    except Exception:
        got = BACKEND.is_available()
        assert not got and "flashmla" in got.reason, got.reason
    else:
        pytest.skip("FlashMLA is installed here")


@pytest.fixture(scope="module")
def gpu():
    return available_or_skip(BACKEND)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_passes_the_verdict(gpu, name):
    res = check_backend(prepare_context(CASES[name], 0, "cuda"), gpu)
    assert res.status == Status.PASS, f"{name}: {res.status.value} {res.reason}"


@pytest.mark.gpu
@pytest.mark.parametrize("block_size", [16, 128])
def test_gpu_page_size_refusal_is_the_kernels(gpu, block_size):
    case = C([(1, 300)], num_heads=16, causal=True, **{**MLA, "block_size": block_size})
    inputs = make_inputs(case, 0, "cuda")
    mod = import_flashmla()
    call = flashmla_plan(case, inputs, mod.get_mla_metadata()[0])
    with pytest.raises(RuntimeError, match="page_block_size must be 64"):
        mod.flash_mla_with_kvcache(**call.kwargs)
