"""FlexAttention (CPU, eager) adapter against the reference.

The oracle is :func:`attnref.attention_varlen` in fp32 on the packed keys of ``make_inputs``; the
cases mirror ``test_sdpa.py`` (duplicated: test modules do not import each other) plus the
soft-cap cases that only flex can express.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnfast.flex import FlexCpuBackend, make_mask_mod, make_score_mod
from attnref import AttnOptions, attention_varlen
from conformance.case import AttentionCase
from conformance.inputs import make_inputs

#: (atol, rtol) of the output per dtype against the fp32 oracle; eager flex rounds P to the input
#: dtype before P.V, hence wider than SDPA-math's.  The LSE is computed in fp32 throughout.
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
    "softcap": C([(6, 6), (3, 9)], causal=True, softcap=30.0),
    "softcap_alibi_window": C([(7, 12)], h=4, hk=2, softcap=5.0, alibi=True, window=(4, 1)),
    "softcap_sinks_chunk_paged": C([(5, 11), (2, 0)], causal=True, softcap=20.0, sinks=True, chunk=3, kv_layout="HND", block_size=4),
}


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
def test_flex_cpu_matches_reference(name: str) -> None:
    backend = FlexCpuBackend()
    case = CASES[name]
    assert backend.supports(case, "cpu"), backend.supports(case, "cpu").reason
    check_backend(backend, case)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(random_cases(softcap=True))
def test_flex_cpu_random_cases(case: AttentionCase) -> None:
    check_backend(FlexCpuBackend(), case)


def test_flex_query_tiles_agree() -> None:
    """A tiny score budget splits requests into query tiles; the result must not change."""
    case = CASES["softcap_sinks_chunk_paged"]
    inputs = make_inputs(case, seed=2)
    whole = FlexCpuBackend().prepare(case, inputs)()
    tiled = FlexCpuBackend(max_score_elems=case.num_heads * 13).prepare(case, inputs)()
    torch.testing.assert_close(tiled.out, whole.out, atol=0, rtol=0)
    torch.testing.assert_close(tiled.lse, whole.lse, atol=1e-6, rtol=0)
    check_backend(FlexCpuBackend(max_score_elems=7), CASES["alibi"])


def test_flex_declares_everything_and_cpu_only() -> None:
    backend = FlexCpuBackend()
    assert all(s.ok for s in backend.capabilities().values())
    assert not backend.supports(CASES["prefill_causal"], "cuda")
    with pytest.raises(ValueError, match="max_score_elems"):
        FlexCpuBackend(max_score_elems=0)


def test_mask_mod_bottom_right_chunk_and_sink() -> None:
    """The mask_mod on its own, against hand-written rows (sq = 3, sk = 6, chunk 4, causal)."""
    case = C([(3, 6)], causal=True, chunk=4, sinks=True)
    mm = make_mask_mod(case, 3, 6)
    q = torch.arange(3)[:, None]
    k = torch.arange(7)[None, :]
    got = mm(torch.tensor(0), torch.tensor(0), q, k).int().tolist()
    # p = i + 3: row 0 -> p 3 (chunk 0..3), row 1 -> p 4 (chunk 4..7), row 2 -> p 5; key 6 = sink.
    assert got == [[1, 1, 1, 1, 0, 0, 1], [0, 0, 0, 0, 1, 0, 1], [0, 0, 0, 0, 1, 1, 1]]


def test_score_mod_order_softcap_then_alibi_then_sink() -> None:
    case = C([(2, 3)], softcap=2.0, alibi=True, sinks=True)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    sinks = torch.tensor([1.0, 2.0, 3.0, 4.0])
    sm = make_score_mod(case, 2, 3, 0, slopes, sinks)
    assert make_score_mod(C([(2, 3)]), 2, 3) is None
    s = torch.tensor(10.0)
    h, qi = torch.tensor(1), torch.tensor(0)
    # row 0 sits at p = 1; key 0 is at distance 1: 2 * tanh(10 / 2) - 0.25 * 1
    assert math.isclose(float(sm(s, 0, h, qi, torch.tensor(0))), 2 * math.tanh(5.0) - 0.25, rel_tol=1e-6)
    assert float(sm(s, 0, h, qi, torch.tensor(3))) == 2.0  # the sink column carries the sink, untouched
