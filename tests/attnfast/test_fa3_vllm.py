"""``fa3-vllm`` (vLLM's FA3 fork): translation on CPU against ``fake_vllm`` (the fork's measured
conventions), and the real kernel on a GPU through the harness's own verdict (skipped unless
``vllm.vllm_flash_attn`` imports)."""

from __future__ import annotations

import pytest
import torch

from attnfast._fa_common import PreparedKernel, prepare_padded_v
from attnfast.fa3_vllm import FA3VllmBackend, fa3_vllm_plan, import_vllm_fa3
from conformance.cases.inputs import make_inputs
from conformance.cases.sweep import MLA_SCALE
from conformance.records import Status
from conformance.verdict.check import check_backend, compare, prepare_context
from conformance.verdict.tolerance import resolve
from fake_fa3 import available_or_skip, fa_case as C
from fake_vllm import make_fake_vllm_fa3

BACKEND = FA3VllmBackend()
MLA = dict(num_heads=16, num_kv_heads=1, head_dim=64, head_dim_v=512, qv=True, causal=True)

#: Cases the adapter declares supported, over every argument it translates.
CASES = {
    "causal_gqa": C([(33, 33), (1, 70), (20, 90)], causal=True),
    "window_softcap": C([(33, 33), (1, 70)], window=(16, 0), softcap=30.0),
    "sqgtsk": C([(40, 20), (9, 3)], causal=True),
    "emptykv": C([(5, 0), (3, 3)], causal=True),
    "sinks": C([(33, 33), (1, 70)], causal=True, sinks=True),
    "paged_nhd16": C([(1, 70), (4, 90)], causal=True, kv_layout="NHD", block_size=16),
    "paged_hnd1": C([(1, 70), (4, 90)], causal=True, kv_layout="HND", block_size=1),
    "splits": C([(1, 70), (1, 300)], causal=True, num_splits=3, kv_layout="NHD", block_size=16),
    "sched": C([(1, 70), (4, 90)], causal=True, scheduler_metadata=True, kv_layout="NHD", block_size=16),
    "sched_contig": C([(1, 70), (4, 90)], causal=True, scheduler_metadata=True),
    "fp8_tensor": C([(33, 33), (1, 70)], causal=True, quant="fp8_e4m3"),
    "fp8_head_paged": C(
        [(1, 70), (4, 90)], causal=True, quant="fp8_e4m3", descale="head", kv_layout="NHD", block_size=16
    ),
    "fp8_head_hnd": C(
        [(1, 70), (4, 90)], causal=True, quant="fp8_e4m3", descale="head", kv_layout="HND", block_size=32
    ),
    "dims_192_128": C([(33, 33), (1, 70)], causal=True, head_dim=192, head_dim_v=128),
    "v_padded": C([(33, 33), (1, 70)], causal=True, head_dim=192, head_dim_v=128, v_padded=True),
    "v_padded_sinks": C([(33, 33), (1, 70)], head_dim=192, head_dim_v=128, v_padded=True, sinks=True),
    "mla_contig": C([(1, 70), (4, 90)], scale=MLA_SCALE, **MLA),
    "mla_paged64": C([(1, 70), (4, 90)], scale=MLA_SCALE, kv_layout="NHD", block_size=64, **MLA),
    "mla_paged_hnd": C([(1, 70), (2, 9)], scale=MLA_SCALE, kv_layout="HND", block_size=16, **MLA),
    "cp2_rank1_paged": C(
        [(1, 70), (4, 90), (3, 0)], causal=True, cp_world=2, cp_rank=1, kv_layout="NHD", block_size=16
    ),
    "cp3_rank2_contig": C([(33, 40), (1, 70), (9, 3)], causal=True, cp_world=3, cp_rank=2),
    "cp4_rank0_hnd_sinks": C(
        [(5, 50), (1, 1)], causal=True, cp_world=4, cp_rank=0, sinks=True, kv_layout="HND", block_size=16
    ),
}


def run_fake(case, seed=0):
    """The adapter's call run through the fake kernel, judged by the harness's verdict on CPU."""
    fake = make_fake_vllm_fa3()
    ctx = prepare_context(case, seed, "cpu")

    def prepare(c, inputs):
        return PreparedKernel(fake.flash_attn_varlen_func, fa3_vllm_plan(c, inputs, fake.get_scheduler_metadata))

    got = (prepare_padded_v(prepare, case, ctx.inputs) if case.v_padded else prepare(case, ctx.inputs))()
    return compare(ctx.ref, ctx.base, got, resolve(case, BACKEND.name)), fake


# ------------------------------------------------------------------ CPU: declarations and translation
@pytest.mark.parametrize(
    "case, reason",
    [
        (C([(3, 3)], alibi=True), "Alibi is not supported in FA3"),
        (C([(3, 3)], append=True, causal=True), "passes no new keys"),
        (C([(3, 3)], chunk=16), "no attention_chunk"),
        (C([(3, 3)], dtype="fp32"), "only supports fp16, bf16, and fp8_e4m3"),
        (C([(3, 3)], quant="fp8_e5m2"), "only supports fp16, bf16, and fp8_e4m3"),
        (C([(3, 3)], quant="fp8_e4m3", quant_q=False), "query and key must have the same dtype"),
        (C([(3, 3)], quant="fp8_e4m3", dtype="fp16"), "writes bf16 output"),
        (C([(3, 3)], quant="fp8_e4m3", head_dim=40), "head_size should be a multiple of 16"),
        (C([(3, 3)], quant="int8_t1"), "vendor kernel"),
        (C([(3, 3)], scale=0.1, quant="int8_t2"), "vendor kernel"),
        (C([(3, 3)], quant="fp8_e4m3", scale=0.1, **MLA), "HeaddimV > 256"),
        (C([(3, 3)], head_dim=128, head_dim_v=128, qv=True), "qv for d <= 64"),
        (C([(3, 3)], head_dim=320), "at most 256"),
        (C([(3, 3)], head_dim=128, head_dim_v=64), "d != dv only"),
        (C([(3, 3)], head_dim=192, head_dim_v=128, sinks=True), "S aux with hdim != hdim_v"),
        (C([(3, 3)], sinks=True, scale=0.1, **MLA), "S aux with hdim != hdim_v"),
    ],
)
def test_refusal_reasons(case, reason):
    got = BACKEND.supports(case, "cuda")
    assert not got and reason in got.reason, got.reason


@pytest.mark.parametrize("name", sorted(CASES))
def test_declared_supported(name):
    assert BACKEND.supports(CASES[name], "cuda"), BACKEND.supports(CASES[name], "cuda").reason


@pytest.mark.parametrize("name", sorted(CASES))
def test_translation_against_fake(name):
    stats, _ = run_fake(CASES[name])
    assert not stats.failed_checks, (name, stats)


def test_paged_and_contiguous_arguments():
    paged = CASES["fp8_head_hnd"]
    inputs = make_inputs(paged)
    kw = fa3_vllm_plan(paged, inputs).kwargs
    assert "cu_seqlens_k" not in kw, "paged calls give seqused_k only"
    assert kw["seqused_k"].tolist() == paged.kv_lens and kw["seqused_k"].dtype == torch.int32
    assert kw["block_table"] is inputs.block_table
    assert kw["k"].shape == (inputs.k_cache.shape[0], 32, 2, 64), "HND must be passed as an NHD-shaped view"
    assert kw["k"].data_ptr() == inputs.k_cache.data_ptr(), "the HND view must alias the cache (no copy)"
    assert kw["q"].dtype == torch.float8_e4m3fn and kw["k"].dtype == torch.float8_e4m3fn
    assert torch.equal(kw["k_descale"], inputs.quant.k_descale) and kw["k_descale"].shape == (2, 2)
    assert kw["fa_version"] == 3 and kw["return_softmax_lse"] and kw["window_size"] == [-1, -1]
    contig = CASES["fp8_tensor"]
    inputs = make_inputs(contig)
    kw = fa3_vllm_plan(contig, inputs).kwargs
    assert "seqused_k" not in kw and kw["cu_seqlens_k"] is inputs.cu_seqlens_k
    assert kw["q_descale"].shape == (2, 2) and kw["q_descale"].stride() == (0, 0), "per-tensor: vLLM's expand"


def test_mla_paged_cache_is_sglangs_split_of_one_cache():
    case = CASES["mla_paged64"]
    inputs = make_inputs(case)
    kw = fa3_vllm_plan(case, inputs).kwargs
    joint = inputs.mla_cache
    assert kw["v"].data_ptr() == joint.data_ptr() and kw["v"].shape[-1] == 512
    assert kw["k"].data_ptr() == joint.data_ptr() + 512 * joint.element_size() and kw["k"].shape[-1] == 64
    assert kw["q_v"] is inputs.qv and kw["softmax_scale"] == MLA_SCALE


def test_sinks_go_to_s_aux_in_bf16_exactly():
    case = CASES["sinks"]
    inputs = make_inputs(case)
    call = fa3_vllm_plan(case, inputs)
    assert call.kwargs["s_aux"].dtype == torch.bfloat16
    assert torch.equal(call.kwargs["s_aux"].float(), inputs.sinks), "the case's sinks must be bf16-exact"
    assert any("s_aux" in n for n in call.notes)


def test_scheduler_metadata_gets_the_calls_shapes():
    case = CASES["sched"]
    _, fake = run_fake(case)
    (name, args), (name2, kw) = fake.calls
    assert name == "get_scheduler_metadata" and name2 == "flash_attn_varlen_func"
    assert (args["batch_size"], args["max_seqlen_q"], args["max_seqlen_k"]) == (2, 4, 90)
    want = (case.num_heads, case.num_kv_heads, case.head_dim, case.block_size)
    assert (args["num_heads_q"], args["num_heads_kv"], args["headdim"], args["page_size"]) == want
    assert args["causal"] and kw["scheduler_metadata"] is not None


def test_v_padded_pads_and_strips():
    case = CASES["v_padded"]
    _, fake = run_fake(case)
    kw = fake.calls[-1][1]
    assert kw["v"].shape[-1] == 192 and bool((kw["v"][..., 128:] == 0).all())


def test_mla_default_scale_is_the_forks_not_upstreams():
    """Measured on an H100: with q_v and no scale the fork uses 1/sqrt(d); the reference (upstream FA3,
    FlashMLA) 1/sqrt(d + dv).  The fake reproduces the fork, so the check must fail; with the engines'
    explicit scale it passes (``ledgers/fa3-vllm.toml``)."""
    unscaled = C([(1, 70), (4, 90)], **MLA)
    stats, _ = run_fake(unscaled)
    assert "max_error" in stats.failed_checks and stats.error_ratio > 10
    stats, _ = run_fake(unscaled.replace(scale=(64 + 512) ** -0.5))
    assert not stats.failed_checks


def test_is_available_names_the_missing_module():
    try:
        import_vllm_fa3()
    except Exception:
        got = BACKEND.is_available()
        assert not got and "vllm.vllm_flash_attn" in got.reason, got.reason
    else:
        pytest.skip("vLLM's FA3 is installed here")


# ------------------------------------------------------------------ GPU: the real kernel
@pytest.fixture(scope="module")
def gpu():
    return available_or_skip(BACKEND)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_passes_the_verdict(gpu, name):
    res = check_backend(prepare_context(CASES[name], 0, "cuda"), gpu)
    assert res.status == Status.PASS, f"{name}: {res.status.value} {res.reason}"


@pytest.mark.gpu
def test_gpu_mla_without_scale_uses_one_over_sqrt_d(gpu):
    case = C([(1, 70), (4, 90)], **MLA)
    res = check_backend(prepare_context(case, 0, "cuda"), gpu)
    assert res.status == Status.FAIL
    res = check_backend(prepare_context(case.replace(scale=64**-0.5), 0, "cuda"), gpu)
    assert res.status == Status.PASS, res.reason


def _refused_call(case):
    """The call the adapter would make for a refused case, built as if it were supported."""
    inputs = make_inputs(case, 0, "cuda")
    mod = import_vllm_fa3()
    return mod.flash_attn_varlen_func, fa3_vllm_plan(case, inputs, mod.get_scheduler_metadata).kwargs


@pytest.mark.gpu
@pytest.mark.parametrize(
    "case",
    [
        C([(33, 33)], quant="fp8_e4m3", quant_q=False),
        C([(33, 33)], dtype="fp32"),
        C([(1, 33)], quant="fp8_e4m3", scale=0.1, **MLA),
        C([(33, 33)], quant="fp8_e4m3", head_dim=40),
    ],
    ids=["fp8_kv_only", "fp32", "fp8_qv_512", "fp8_d40"],
)
def test_gpu_refusals_are_what_the_kernel_says(gpu, case):
    """Each measured refusal: the kernel, called as the adapter would, raises the reason's message."""
    reason = BACKEND.supports(case, "cuda").reason
    fn, kwargs = _refused_call(case)
    with pytest.raises(RuntimeError) as err:
        fn(**kwargs)
    assert str(err.value).strip().splitlines()[0] in reason, (str(err.value), reason)


@pytest.mark.gpu
def test_gpu_e5m2_is_refused_by_the_kernel(gpu):
    case = C([(33, 33)], quant="fp8_e4m3")
    fn, kwargs = _refused_call(case)
    for name in ("q", "k", "v"):
        kwargs[name] = kwargs[name].view(torch.float8_e5m2)
    with pytest.raises(RuntimeError, match="only supports fp16, bf16, and fp8_e4m3"):
        fn(**kwargs)


@pytest.mark.gpu
def test_gpu_sink_lse_of_rows_without_keys(gpu):
    """Evidence for ``ledgers/fa3-vllm.toml``: with ``s_aux`` a row that sees no key has only the sink in its
    softmax denominator, so its LSE is the sink (output 0).  The kernel, called directly, returns output 0
    but LSE -inf there, while it includes the sink in the LSE of rows that do see keys (fp64 below)."""
    fn = import_vllm_fa3().flash_attn_varlen_func
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, 2, 64, generator=gen).to("cuda", torch.bfloat16) for n in (4, 3, 3))
    sinks = torch.tensor([0.5, 1.25], device="cuda", dtype=torch.bfloat16)
    cu_q = torch.tensor([0, 3, 4], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 0, 3], dtype=torch.int32, device="cuda")
    out, lse = fn(q, k, v, 3, cu_q, 3, cu_seqlens_k=cu_k, s_aux=sinks, return_softmax_lse=True, fa_version=3)
    assert bool((out[:3] == 0).all()), "rows without keys: output 0, as the reference says"
    assert bool(torch.isneginf(lse[:, :3]).all()), "rows without keys: the kernel's LSE (the reference says the sink)"
    s = torch.einsum("hd,khd->hk", q[3].double(), k.double()) / 8.0  # row 3 sees all 3 keys
    want = torch.logsumexp(torch.cat([s, sinks.double()[:, None]], dim=1), dim=1)
    assert torch.allclose(lse[:, 3].double(), want, atol=1e-4), (lse[:, 3], want)
