"""Cases, oracle and check shared by the torch-native backend tests (sdpa-cpu, sdpa-cuda, flex-cpu).

The oracle is :func:`attnref.attention_varlen` in fp32 on the packed keys of ``make_inputs`` (for
paged / append cases those are the keys an adapter must reconstruct from the cache and k_new).
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from attnref import Numerics
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import make_inputs
from conformance.verdict.reference import reference

#: (atol, rtol) of the output per dtype against the fp32 oracle; eager flex rounds P to the input
#: dtype before P.V like the fused kernels do.  The LSE is fp32 throughout.
OUT_TOL = {"bf16": (2e-2, 2e-2), "fp16": (4e-3, 4e-3), "fp32": (2e-5, 2e-5)}
LSE_TOL = (1e-3, 1e-4)


def C(requests, h=4, hk=4, d=32, **kw) -> AttentionCase:
    return AttentionCase(requests=tuple(requests), num_heads=h, num_kv_heads=hk, head_dim=d, **kw)


NHD4 = {"kv_layout": "NHD", "block_size": 4}

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
    "append_short_paged_window": C([(5, 12), (3, 3)], causal=True, window=(2, 0), append=True, append_len=2, **NHD4),
    "append_short_contiguous_sq_gt_sk": C([(6, 3), (4, 9)], h=4, hk=2, causal=True, append=True, append_len=3),
    # context parallel: the keys are one rank's interleave-1 shard (totals from make_inputs)
    "cp2_rank1_paged": C(
        [(1, 9), (3, 10), (4, 0), (6, 2)], h=4, hk=2, causal=True, cp_world=2, cp_rank=1, kv_layout="NHD", block_size=4
    ),
    "cp3_rank0_sinks": C([(5, 8), (1, 1), (2, 0)], causal=True, cp_world=3, cp_rank=0, sinks=True),
    "cp4_rank3_hnd": C([(7, 3), (1, 12)], causal=True, cp_world=4, cp_rank=3, kv_layout="HND", block_size=16),
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
    """fp32 reference (out, lse) of a case from its packed keys (the harness's own reference call)."""
    res = reference(case, inputs, Numerics())
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
