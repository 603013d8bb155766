"""The adapters' backward calls (``prepare_backward``, issue 20 item 4) against autograd through a naive fp64
attention written here from ``../shared/SEMANTICS.md`` (not from attnref or the adapters): full score matrix,
bottom-right mask, soft-cap then mask then ALiBi, sinks as one extra softmax column, a fully masked row gives 0.

CPU: ``sdpa-cpu`` (gradients, d(sinks), deterministic bitwise run to run, ``backward_only``) and the example
third-party backend (soft-cap, which SDPA cannot express); the refusals (flex on CPU, soft-cap on SDPA, cuDNN's
determinism, FA4's backward limits by compute capability) with their reasons.  GPU (skipped without CUDA): fa2, fa4,
torch-flash, sdpa-cuda against the same oracle on the device, and deterministic backwards bitwise run to run.
"""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path

import pytest
import torch

from attnfast.autograd import AutogradBackward, deterministic_algorithms, grad_leaves
from attnfast.fa2 import FA2Backend
from attnfast.fa4 import FA4Backend, fa4_backward_support
from attnfast.flex import FlexCpuBackend
from attnfast.sdpa import SdpaCpuBackend, SdpaCudaBackend, SdpaCudaCudnnBackend
from attnfast.torch_flash import TorchFlashBackend
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import make_inputs


EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "examples" / "attnfast_example_backend"


def B(requests, h=4, hk=4, d=16, **kw) -> AttentionCase:
    return AttentionCase(requests=tuple(requests), num_heads=h, num_kv_heads=hk, head_dim=d, backward=True, **kw)


# ------------------------------------------------------------------------------------------------ oracle
def _naive_seq(q, k, v, case, slopes, sinks):
    """One sequence, fp64, differentiable: q (sq, h, d), k (sk, hk, d), v (sk, hk, dv) -> (sq, h, dv)."""
    sq, h, d = q.shape
    sk = k.shape[0]
    g = h // case.num_kv_heads
    kk, vv = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    scale = case.scale if case.scale is not None else 1.0 / math.sqrt(d)
    s = torch.einsum("qhd,khd->hqk", q, kk) * scale
    if case.softcap is not None:
        s = case.softcap * torch.tanh(s / case.softcap)
    i = torch.arange(sq, dtype=torch.float64, device=q.device)[:, None]
    j = torch.arange(sk, dtype=torch.float64, device=q.device)[None, :]
    p = i + (sk - sq)
    left, right = case.window
    right = 0 if case.causal else right
    vis = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if left is not None:
        vis &= j >= p - left
    if right is not None:
        vis &= j <= p + right
    s = s.masked_fill(~vis, -math.inf)
    if slopes is not None:
        s = s - slopes[:, None, None] * (p - j).abs()[None]
    if sinks is not None:
        s = torch.cat([s, sinks[:, None, None].expand(h, sq, 1)], dim=-1)
        vv = torch.cat([vv, vv.new_zeros(1, *vv.shape[1:])])
    dead = torch.isinf(s).all(dim=-1, keepdim=True)  # no visible key and no sink: output 0
    w = torch.softmax(s.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
    return torch.einsum("hqk,khd->qhd", w, vv)


def oracle_grads(case: AttentionCase, inputs, device="cpu"):
    """dq, dk, dv (and dsinks) of sum(out * dout) by autograd through :func:`_naive_seq` in fp64."""
    f64 = torch.float64
    q, k, v = (t.detach().to(device, f64).requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v))
    sinks = None if inputs.sinks is None else inputs.sinks.detach().to(device, f64).requires_grad_(True)
    slopes = None if inputs.alibi_slopes is None else inputs.alibi_slopes.to(device, f64)
    cu_q, cu_k = inputs.cu_seqlens_q.tolist(), inputs.cu_seqlens_k.tolist()
    outs = []
    for b in range(case.batch):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        outs.append(_naive_seq(q[qs], k[ks], v[ks], case, slopes, sinks))
    out = torch.cat(outs)
    leaves = (q, k, v) if sinks is None else (q, k, v, sinks)
    grads = torch.autograd.grad(out, leaves, inputs.dout.to(device, f64), allow_unused=True)
    return [torch.zeros_like(t) if gr is None else gr for t, gr in zip(leaves, grads, strict=True)]


def assert_grads_close(got, case, inputs, rel: float, device="cpu") -> None:
    """Each gradient within ``rel`` of the oracle's largest magnitude (and no NaN where the oracle is finite)."""
    want = oracle_grads(case, inputs, device)
    names = ("dq", "dk", "dv", "dsinks")
    tensors = [got.dq, got.dk, got.dv] + ([got.dsinks] if case.sinks and got.dsinks is not None else [])
    for name, g, w in zip(names, tensors, want, strict=False):
        assert g.shape == w.shape, f"{name}: shape {tuple(g.shape)} != {tuple(w.shape)}"
        err = (g.to(w.device, torch.float64) - w).abs().max().item() if w.numel() else 0.0
        scale = max(1.0, w.abs().max().item()) if w.numel() else 1.0
        assert err <= rel * scale, f"{name}: max error {err:.3g} > {rel} * {scale:.3g}"


# ------------------------------------------------------------------------------------------------ CPU cases
CPU_CASES = {
    "causal_varlen": B([(7, 7), (16, 16)], causal=True),
    "chunked_causal_gqa": B([(3, 10), (1, 5), (8, 8)], h=4, hk=2, causal=True),
    "mqa_sq_gt_sk": B([(9, 4), (5, 5)], h=4, hk=1, causal=True),
    "window": B([(6, 9), (12, 12)], window=(3, 2)),
    "window_causal": B([(10, 10), (2, 9)], causal=True, window=(4, 0)),
    "alibi_gqa": B([(6, 9), (4, 4)], h=6, hk=3, causal=True, alibi=True),
    "sinks": B([(5, 8), (1, 1)], causal=True, sinks=True),
    "sinks_empty_kv": B([(3, 0), (2, 5)], sinks=True, causal=True),
    "dv": B([(5, 5), (2, 6)], d=32, head_dim_v=16, causal=True),
    "empty_kv_and_q": B([(4, 0), (0, 3), (3, 3)], causal=True),
    "cross_scale": B([(3, 7), (5, 2)], scale=0.3),
}


@pytest.mark.parametrize("name", sorted(CPU_CASES))
def test_sdpa_cpu_backward_matches_naive_fp64(name: str) -> None:
    case = CPU_CASES[name].replace(dtype="fp32")
    backend = SdpaCpuBackend()
    assert backend.supports(case, "cpu"), backend.supports(case, "cpu").reason
    inputs = make_inputs(case, seed=3)
    got = backend.prepare_backward(case, inputs)()
    assert got.dq.shape == inputs.q.shape and got.dk.shape == inputs.k.shape and got.dv.shape == inputs.v.shape
    assert (got.dsinks is not None) == case.sinks  # sdpa-cpu learns the sinks through its fp32 bias column
    assert_grads_close(got, case, inputs, rel=1e-4)
    torch.testing.assert_close(got.out, backend.prepare(case, inputs)().out, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["chunked_causal_gqa", "alibi_gqa", "sinks"])
def test_sdpa_cpu_backward_bf16(name: str) -> None:
    case = CPU_CASES[name]
    inputs = make_inputs(case, seed=1)
    assert_grads_close(SdpaCpuBackend().prepare_backward(case, inputs)(), case, inputs, rel=3e-2)


def test_sdpa_cpu_deterministic_is_bitwise_and_restores_the_switch() -> None:
    case = CPU_CASES["alibi_gqa"].replace(deterministic=True)
    inputs = make_inputs(case, seed=4)
    call = SdpaCpuBackend().prepare_backward(case, inputs)
    first, second = call(), call()
    for a, b in zip((first.dq, first.dk, first.dv), (second.dq, second.dk, second.dv), strict=True):
        assert torch.equal(a, b)
    assert not torch.are_deterministic_algorithms_enabled()
    with deterministic_algorithms():
        assert torch.are_deterministic_algorithms_enabled()
    assert not torch.are_deterministic_algorithms_enabled()


def test_backward_only_reruns_the_same_gradients() -> None:
    case = CPU_CASES["sinks"].replace(dtype="fp32")
    inputs = make_inputs(case, seed=5)
    call = SdpaCpuBackend().prepare_backward(case, inputs)
    with pytest.raises(RuntimeError, match="call the backward call first"):
        call.backward_only()
    full = call()
    again = call.backward_only()
    for name in ("dq", "dk", "dv", "dsinks"):
        assert torch.equal(getattr(full, name), getattr(again, name)), name


def test_autograd_backward_zero_gradients_when_nothing_is_reached() -> None:
    case = B([(0, 4)], causal=True, dtype="fp32")
    inputs = make_inputs(case, seed=0)
    got = SdpaCpuBackend().prepare_backward(case, inputs)()
    assert got.out.shape == (0, 4, 16) and torch.equal(got.dk, torch.zeros_like(inputs.k))
    with pytest.raises(ValueError, match="dout"):
        AutogradBackward(lambda leaves: (leaves.q, None), grad_leaves(inputs), None)


def test_the_oracle_comparison_catches_a_planted_bug() -> None:
    """A backward that forgets the causal mask (its forward runs without it) must fail the comparison."""
    case = CPU_CASES["causal_varlen"].replace(dtype="fp32")
    inputs = make_inputs(case, seed=3)
    wrong = SdpaCpuBackend().prepare_backward(case.replace(causal=False), inputs)()
    with pytest.raises(AssertionError, match="max error"):
        assert_grads_close(wrong, case, inputs, rel=1e-4)


def test_example_backend_backward_softcap_window_sinks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The third-party example (on ``sys.path`` as ``pip install`` would put it) declares ``backward``."""
    monkeypatch.syspath_prepend(str(EXAMPLE_DIR))
    import attnfast_example_chunked as example

    backend = example.ChunkedTorchBackend()
    assert backend.capabilities()["backward"] and not backend.capabilities()["bwd_deterministic"]
    for case in (
        B([(6, 9), (12, 12)], h=4, hk=2, softcap=5.0, window=(3, 1), dtype="fp32"),
        B([(5, 8), (3, 0)], causal=True, softcap=20.0, sinks=True, head_dim_v=8, dtype="fp32"),
    ):
        assert backend.supports(case, "cpu"), backend.supports(case, "cpu").reason
        inputs = make_inputs(case, seed=2)
        got = backend.prepare_backward(case, inputs)()
        assert (got.dsinks is not None) == case.sinks
        assert_grads_close(got, case, inputs, rel=1e-4)


# ------------------------------------------------------------------------------------------------ CPU: fake kernels
def _fake_varlen(q, k, v, cu_q, cu_k, *, scale, causal, left, right, softcap, sinks=None):
    """A differentiable stand-in for a varlen kernel (the oracle on the kernel's arguments): out and a zero LSE."""
    spec = types.SimpleNamespace(
        scale=scale, softcap=softcap or None, num_kv_heads=k.shape[1], window=(left, right), causal=causal
    )
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    f64 = torch.float64
    sinks = None if sinks is None else sinks.to(f64)
    outs = [
        _naive_seq(q[a:b].to(f64), k[c:e].to(f64), v[c:e].to(f64), spec, None, sinks).to(q.dtype)
        for a, b, c, e in zip(cu_q, cu_q[1:], cu_k, cu_k[1:])
    ]
    return torch.cat(outs), torch.zeros(q.shape[1], q.shape[0])


def _fa2_side(x):
    return None if x < 0 else x


FAKE_CASE = B([(6, 9), (12, 12)], h=4, hk=2, causal=True, window=(5, 0), dtype="fp16", deterministic=True)


def test_fa2_backward_wiring_with_a_fake_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **kw):
        seen.update(kw, leaves=(q.is_leaf and q.requires_grad, k.is_leaf, v.is_leaf))
        left, right = kw["window_size"]
        out, lse = _fake_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, scale=kw["softmax_scale"], causal=kw["causal"],
            left=_fa2_side(left), right=_fa2_side(right), softcap=kw["softcap"],
        )  # fmt: skip
        return out, lse, None

    monkeypatch.setitem(sys.modules, "flash_attn", types.SimpleNamespace(flash_attn_varlen_func=flash_attn_varlen_func))
    case = FAKE_CASE.replace(dtype="bf16")
    inputs = make_inputs(case, seed=2)
    got = FA2Backend().prepare_backward(case, inputs)()
    assert seen["deterministic"] is True and seen["softcap"] == 0.0 and seen["window_size"] == (5, 0)
    assert seen["leaves"] == (True, True, True) and seen["return_attn_probs"] is True
    assert_grads_close(got, case, inputs, rel=3e-2)


def test_fa4_backward_wiring_with_a_fake_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def flash_attn_varlen_func(q, k, v, *, cu_seqlens_q, cu_seqlens_k, learnable_sink=None, **kw):
        seen.update(kw, sink_leaf=learnable_sink is not None and learnable_sink.is_leaf)
        left, right = kw["window_size"]
        return _fake_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, scale=kw["softmax_scale"], causal=kw["causal"], left=left,
            right=right, softcap=kw["softcap"], sinks=learnable_sink,
        )  # fmt: skip

    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_varlen_func = flash_attn_varlen_func
    monkeypatch.setitem(sys.modules, "flash_attn", types.SimpleNamespace(cute=cute))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    case = FAKE_CASE.replace(sinks=True, softcap=8.0)
    inputs = make_inputs(case, seed=2)
    got = FA4Backend().prepare_backward(case, inputs)()
    assert seen["deterministic"] is True and seen["return_lse"] is True and seen["sink_leaf"]
    assert seen["window_size"] == (5, 0) and seen["softcap"] == 8.0
    assert got.dsinks is not None and got.dsinks.dtype == torch.float32
    assert_grads_close(got, case, inputs, rel=1e-2)
    plain = FAKE_CASE.replace(deterministic=False)
    FA4Backend().prepare_backward(plain, make_inputs(plain, seed=2))()
    assert seen["softcap"] == 0.0 and seen["deterministic"] is False  # 0.0, never None (SEMANTICS section 12)


def test_torch_flash_backward_wiring_with_a_fake_op(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def fake_op(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, **kw):
        seen.update(kw, deterministic=torch.are_deterministic_algorithms_enabled())
        out, lse = _fake_varlen(
            query, key, value, cum_seq_q, cum_seq_k, scale=kw["scale"], causal=is_causal,
            left=_fa2_side(kw["window_size_left"]), right=_fa2_side(kw["window_size_right"]), softcap=None,
        )  # fmt: skip
        return out, lse, None, None, None

    monkeypatch.setattr(torch.ops.aten, "_flash_attention_forward", fake_op)
    inputs = make_inputs(FAKE_CASE, seed=2)
    got = TorchFlashBackend().prepare_backward(FAKE_CASE, inputs)()
    assert seen["deterministic"] and not torch.are_deterministic_algorithms_enabled()
    assert (seen["window_size_left"], seen["window_size_right"]) == (5, 0)
    assert_grads_close(got, FAKE_CASE, inputs, rel=1e-2)


# ------------------------------------------------------------------------------------------------ refusals
def test_declared_backward_features() -> None:
    for backend in (FA2Backend(), FA4Backend(), TorchFlashBackend(), SdpaCpuBackend(), SdpaCudaBackend()):
        caps = backend.capabilities()
        assert caps["backward"] and caps["bwd_deterministic"], backend.name
    flex = FlexCpuBackend().capabilities()
    assert "does not support backward on CPU" in flex["backward"].reason
    assert not flex["bwd_deterministic"]
    cudnn = SdpaCudaCudnnBackend().capabilities()["bwd_deterministic"]
    assert not cudnn and "check_cudnn_deterministic" in cudnn.reason


def test_refusals_carry_reasons() -> None:
    flex = FlexCpuBackend().supports(CPU_CASES["causal_varlen"], "cpu")
    assert not flex and flex.reason.startswith("backward:")
    softcap = SdpaCpuBackend().supports(B([(4, 4)], softcap=5.0), "cpu")
    assert not softcap and "score modifier" in softcap.reason
    sinks = FA2Backend().supports(CPU_CASES["sinks"], "cuda")
    assert not sinks and "sink" in sinks.reason
    det = B([(4, 4)], causal=True, deterministic=True)
    cudnn = SdpaCudaCudnnBackend().supports(det, "cuda")
    assert not cudnn and "bwd_deterministic" in cudnn.reason
    only_cudnn = SdpaCudaBackend(("CUDNN_ATTENTION",)).supports(det, "cuda")
    assert not only_cudnn and "check_cudnn_deterministic" in only_cudnn.reason
    assert SdpaCudaBackend().supports(det, "cuda")  # flash / efficient honour the switch


@pytest.mark.parametrize(
    "case, cc, reason",
    [
        (B([(8, 8)], d=64), (8, 0), "Supported: 9.x, 10.x, 11.x, 12.x"),
        (B([(8, 8)], h=4, hk=2, d=192, head_dim_v=128), (9, 0), "GQA backward requires head_dim == head_dim_v"),
        (B([(8, 8)], d=64, deterministic=True), (12, 0), "deterministic"),
        (B([(8, 8)], d=64, softcap=10.0), (12, 0), "soft-cap"),
        (B([(8, 8)], d=64, sinks=True), (12, 0), "Learnable sink backward"),
        (B([(8, 8)], d=256, softcap=10.0), (10, 0), "(256, 256)"),
    ],
)
def test_fa4_backward_refusals_by_compute_capability(case, cc, reason) -> None:
    support = fa4_backward_support(case, cc)
    assert not support and reason in support.reason


def test_fa4_sm90_backward_takes_softcap_sinks_window_deterministic_gqa() -> None:
    case = B(
        [(8, 8), (3, 9)], h=4, hk=2, d=128, causal=True, window=(4, 0), softcap=30.0, sinks=True, deterministic=True
    )
    assert fa4_backward_support(case, (9, 0))
    assert fa4_backward_support(B([(8, 8)], d=192, head_dim_v=128), (9, 0))  # d != dv without GQA


# ------------------------------------------------------------------------------------------------ GPU
GPU_BACKENDS = {"fa2": FA2Backend, "fa4": FA4Backend, "torch-flash": TorchFlashBackend, "sdpa-cuda": SdpaCudaBackend}
GPU_CASES = {
    "causal_varlen": B([(128, 128), (77, 300)], h=8, hk=8, d=128, causal=True),
    "gqa_window": B([(200, 200), (64, 130)], h=8, hk=2, d=64, causal=True, window=(48, 0)),
    "noncausal_cross": B([(96, 160), (33, 33)], h=4, hk=4, d=128),
    "softcap": B([(150, 150)], h=4, hk=2, d=128, causal=True, softcap=30.0),
    "alibi": B([(100, 140)], h=4, hk=4, d=64, causal=True, alibi=True),
    "sinks": B([(120, 120), (17, 60)], h=4, hk=2, d=64, causal=True, sinks=True),
    "d256": B([(130, 130)], h=2, hk=2, d=256, causal=True),
    "dv192_128": B([(100, 100)], h=4, hk=4, d=192, head_dim_v=128, causal=True),
    "sq_gt_sk_dead_rows": B([(40, 20), (64, 64)], h=4, hk=4, d=64, causal=True),  # 20 rows see no key
}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available())")


def _gpu_backend(name: str):
    backend = GPU_BACKENDS[name]()
    available = backend.is_available()
    if not available:
        pytest.skip(f"{name}: {available.reason}")
    return backend


@needs_cuda
@pytest.mark.parametrize("case_name", sorted(GPU_CASES))
@pytest.mark.parametrize("backend_name", sorted(GPU_BACKENDS))
def test_gpu_backward_matches_naive_fp64(backend_name: str, case_name: str) -> None:
    backend = _gpu_backend(backend_name)
    case = GPU_CASES[case_name]
    support = backend.supports(case, "cuda")
    if not support:
        pytest.skip(f"{backend_name} refuses {case_name}: {support.reason}")
    inputs = make_inputs(case, seed=7, device="cuda")
    call = backend.prepare_backward(case, inputs)
    got = call()
    assert got.dq.shape == inputs.q.shape and got.dk.shape == inputs.k.shape and got.dv.shape == inputs.v.shape
    assert_grads_close(got, case, inputs, rel=2e-2, device="cuda")
    assert call.backward_only is not None
    assert_grads_close(call.backward_only(), case, inputs, rel=2e-2, device="cuda")  # the timing path


@needs_cuda
@pytest.mark.parametrize("backend_name", sorted(GPU_BACKENDS))
def test_gpu_deterministic_backward_is_bitwise(backend_name: str) -> None:
    backend = _gpu_backend(backend_name)
    case = B([(257, 257), (100, 700)], h=8, hk=2, d=128, causal=True, deterministic=True)
    support = backend.supports(case, "cuda")
    if not support:
        pytest.skip(f"{backend_name} refuses: {support.reason}")
    inputs = make_inputs(case, seed=8, device="cuda")
    call = backend.prepare_backward(case, inputs)
    first = call()
    for _ in range(3):
        again = call()
        for name in ("dq", "dk", "dv"):
            assert torch.equal(getattr(first, name), getattr(again, name)), f"{backend_name} {name} differs"
    assert_grads_close(first, case.replace(deterministic=False), inputs, rel=2e-2, device="cuda")
