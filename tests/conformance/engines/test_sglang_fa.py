"""Seed 003 (SGLang's FlashAttention backend) replayed: ``conformance.engines.sglang`` (``fa``, ``local``, ...).

* every scenario passes the layer verdict on ``sdpa-cpu`` and ``flex-cpu`` (``sliding_window_decode`` carries a
  soft-cap, which SDPA cannot express: unsupported there with the adapter's reason, passed on flex);
* ``plan`` lists exactly the calls ``forward`` makes, and with an exact kernel (the reference of each call) the
  composition reproduces the layer's reference;
* the virtual-batch example of the seed's docstring, number for number (and the docstring's one wrong line);
* the metadata the seed builds (prefill offsets, strided page table, the top-k expand table of the seed's comment);
* planted engine bugs fail the verdict: a virtual-batch boundary shifted by one, the top-k cascade merged without
  LSE, the window spelled ``(w - 1, 0)``, the MLA cache split with rope and latent swapped, fp8 descales not
  expanded or dropped;
* findings: the seed's own divergences from its layer (see ``FINDINGS``), each shown failing and, where a fix is
  one method, passing with the fix;
* bad metadata raises ``ValueError`` naming the field.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from attnfast.registry import get_backend
from conformance.cases.case import AttentionCase
from conformance.suites.registry import get_suite
from conformance.engines import get_engine
from conformance.engines.base import Call
from conformance.engines.sglang import (
    FINDINGS,
    SCENARIOS,
    SGLangFlashAttention,
    Step,
    check_call_metadata,
    effective_chunk_size,
    make_local_attention_virtual_batches,
)
from conformance.records import Status
from conformance.verdict.check import check_backend, prepare_context
from tests.conformance.engines.recorder import Recorder, engine_verdict

ENGINE = SGLangFlashAttention()
CASES = {c.scenario: c for c in ENGINE.cases() if not c.graph and not c.invariance}  # graph, invariance: own tests
FINDING_CASES = {name: ENGINE._case(name, sc) for name, sc in FINDINGS.items()}
#: (scenario, backend) -> the feature the CPU adapter refuses (the other CPU backend passes it).
CPU_REFUSALS = {("sliding_window_decode", "sdpa-cpu"): "softcap: SDPA has no score modifier"}

_CONTEXTS: dict[str, object] = {}


def _ctx(case: AttentionCase):
    """One prepared context per case for the whole module (the reference does not depend on the engine's code)."""
    if case.id not in _CONTEXTS:
        _CONTEXTS[case.id] = prepare_context(case, 0, "cpu")
    ctx = _CONTEXTS[case.id]
    ctx.ref_charged = False
    return ctx


def _verdict(case: AttentionCase, engine: SGLangFlashAttention, monkeypatch, backend: str = "sdpa-cpu"):
    return engine_verdict(_ctx(case), engine, monkeypatch, backend)


# ------------------------------------------------------------------ scenarios on the CPU backends
def test_scenarios_are_engine_cases_in_the_engines_suite():
    assert set(CASES) == set(SCENARIOS) and not set(CASES) & set(FINDINGS)
    suite_ids = {c.id for c in get_suite("engines") if c.engine == "sglang_fa" and not c.graph and not c.invariance}
    assert suite_ids == {c.id for c in CASES.values()}
    for case in CASES.values():
        again = AttentionCase.from_json(json.loads(json.dumps(case.to_json())))
        assert again == case and again.id.startswith(f"sglang_fa-{case.scenario}_")
    assert get_engine("sglang_fa").seed == "003"


@pytest.mark.parametrize("backend", ["sdpa-cpu", "flex-cpu"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenarios_pass_on_the_cpu_backends(scenario, backend):
    res = check_backend(_ctx(CASES[scenario]), get_backend(backend))
    refused = CPU_REFUSALS.get((scenario, backend))
    if refused:
        assert res.status is Status.UNSUPPORTED and refused in res.reason, res.reason
        return
    assert res.status is Status.PASS, res.reason
    assert res.extra["engine"] == {"engine": "sglang_fa", "scenario": scenario, "seed": "003"}
    assert res.extra["notes"] and all(": " + backend in n for n in res.extra["notes"])


NO_RAISE = list(SCENARIOS) + ["local_mixed", "spec_verify_topk_sinks", "cross_paged"]


@pytest.mark.parametrize("scenario", NO_RAISE)
def test_plan_is_the_calls_forward_makes(scenario):
    case = CASES.get(scenario) or FINDING_CASES[scenario]
    ctx = _ctx(case)
    rec = Recorder()
    out = ENGINE.forward(case, ctx.inputs, rec)
    assert [(c.label, c.case) for c in rec.calls] == ENGINE.plan(case)
    assert all(c.inputs.case is c.case and not c.case.engine for c in rec.calls)
    if scenario in SCENARIOS:  # with exact calls the composition is the layer
        torch.testing.assert_close(out.out.float(), ctx.ref.out.float(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(out.lse, ctx.ref.lse.float(), atol=1e-3, rtol=1e-3)


def _calls(scenario: str) -> list[Call]:
    rec = Recorder()
    ENGINE.forward(CASES[scenario], _ctx(CASES[scenario]).inputs, rec)
    return rec.calls


# ------------------------------------------------------------------ virtual batches
def test_virtual_batches_reproduce_the_seeds_worked_example():
    """The docstring of make_local_attention_virtual_batches: chunk 4, q_seqlens [4, 10, 5], kv_seqlens [6, 17, 9],
    page size 2, block table rows 0-9, 10-19, 20-29."""
    vb = make_local_attention_virtual_batches(4, [0, 4, 14, 19], [6, 17, 9], torch.arange(30).reshape(3, 10), 2)
    assert vb.seqlens_q_local == [2, 2, 1, 4, 4, 1, 4, 1]
    assert vb.seqlens_k_local == [4, 2, 4, 4, 4, 1, 4, 1]
    assert vb.k_starts == [0, 4, 4, 8, 12, 16, 4, 8]  # "k_seqstarts_absolute"
    assert vb.block_table_local.tolist() == [[0, 1], [2, 3], [12, 13], [14, 15], [16, 17], [18, 19], [22, 23], [24, 25]]
    # The docstring prints cu_seqlens_q_local = [0, 4, 6, 10, 14, 18, 19, 23, 24]: the prefix sums of
    # seqlens_k_local, not of seqlens_q_local.  The function returns the prefix sums of seqlens_q_local.
    printed = [0, 4, 6, 10, 14, 18, 19, 23, 24]
    assert vb.cu_seqlens_q_local == [0, 2, 4, 5, 9, 13, 14, 18, 19] != printed
    assert printed == [sum(vb.seqlens_k_local[:i]) for i in range(9)]
    # and its intermediate values: q tokens in the first block [2, 1, 4], local blocks [2, 4, 2]
    assert vb.requests == [0, 0, 1, 1, 1, 1, 2, 2] and vb.chunk == 4


def test_virtual_batches_chunk_adjustment_and_clipping():
    assert effective_chunk_size(8192, 100, 1) == 100 and effective_chunk_size(64, 50, 16) == 48
    assert effective_chunk_size(64, 10, 16) == 16  # at least one page
    table = torch.arange(8).reshape(1, 8)
    vb = make_local_attention_virtual_batches(4, [0, 1], [13], table, 2)  # decode at position 12
    assert (vb.seqlens_q_local, vb.seqlens_k_local, vb.k_starts) == ([1], [1], [12])
    assert vb.block_table_local.tolist() == [[6, 7]]
    vb = make_local_attention_virtual_batches(8, [0, 2], [16], table[:, :7], 2)  # the last page column clipped
    assert vb.block_table_local.tolist() == [[4, 5, 6, 6]]


def test_local_scenarios_call_the_kernel_with_the_virtual_batches():
    case = CASES["local_extend"]
    (label, call), = ENGINE.plan(case)  # fmt: skip
    md = ENGINE._step(case).metadata
    vb = md.local_attn_metadata
    assert label == "local attention (virtual batches)" and call.chunk is None and call.causal
    assert call.requests == tuple(zip(vb.seqlens_q_local, vb.seqlens_k_local))
    assert sum(vb.seqlens_q_local) == case.total_q and vb.chunk == 32
    (decode_call,) = _calls("local_decode")
    assert decode_call.case.requests == ((1, 6), (1, 32), (1, 1), (1, 5))  # kv 70, 32, 33, 5 with chunk 32


# ------------------------------------------------------------------ metadata as the seed builds it
def test_extend_metadata_and_strided_page_table():
    st = ENGINE._step(CASES["prefill"])  # no prefix: cu_seqlens_q is cu_seqlens_k
    md = st.metadata
    assert md.cu_seqlens_q == md.cu_seqlens_k == [0, 37, 101, 106]
    assert md.page_table.shape == (3, 4)  # max_seq_len_k 64 tokens -> 4 pages of 16
    assert md.page_table[:, :1].tolist() == (st.req_to_token[:, :1] // 16).tolist()
    md = ENGINE._step(CASES["extend_prefix"]).metadata
    assert md.cu_seqlens_q == [0, 20, 27, 60] and md.cache_seqlens_int32 == [84, 7, 50]
    assert md.cu_seqlens_k == [0, 84, 91, 141]
    md = ENGINE._step(CASES["spec_verify_chain"]).metadata  # top-k 1: seq_lens + draft tokens, causal
    assert md.cache_seqlens_int32 == [34, 61] and md.cu_seqlens_q == [0, 4, 8]


def test_topk_expand_table_of_the_seeds_comment():
    """The seed's comment: draft slots [8, 9, 10], mask [[1,0,0],[1,1,0],[1,0,1]] -> rows [8,9,10], [8,9,10],
    [8,10,9] with cache_seqlens [1, 2, 2]."""
    r2t = torch.zeros(1, 16, dtype=torch.int32)
    r2t[0, 5:8] = torch.tensor([8, 9, 10])
    mask = torch.tensor([[True] * 5 + row for row in ([1, 0, 0], [1, 1, 0], [1, 0, 1])], dtype=torch.bool).flatten()
    st = Step(SCENARIOS["spec_verify_topk"], 1, 11, r2t, [5], mask)
    exp = ENGINE._expand_metadata(st, 3)
    assert exp.page_table.tolist() == [[8, 9, 10], [8, 9, 10], [8, 10, 9]]
    assert (
        exp.cache_seqlens_int32 == [1, 2, 2] and exp.cu_seqlens_k == [0, 1, 3, 5] and exp.cu_seqlens_q == [0, 1, 2, 3]
    )


def test_topk_cascade_and_window_calls():
    prefix, expand = _calls("spec_verify_topk")
    assert prefix.case.requests == ((4, 30), (4, 57)) and not prefix.case.causal
    assert expand.case.requests == ((1, 1), (1, 2), (1, 2), (1, 3)) * 2 and not expand.case.causal
    (swa,) = _calls("spec_verify_topk_swa")
    assert swa.case.requests == ((1, 31), (1, 32), (1, 32), (1, 33), (1, 58), (1, 59), (1, 59), (1, 60))
    assert swa.case.causal and swa.case.window == (23, 0)
    for name in ("sliding_window_extend", "sliding_window_decode"):
        assert {c.case.window for c in _calls(name)} == {(23, 0)}  # the layer value as is


def test_cross_mla_fp8_and_deterministic_calls():
    (cross,) = _calls("cross_decode")
    assert cross.case.requests == ((1, 40),) and not cross.case.causal and cross.case.window == (None, None)
    (mla,) = _calls("mla_decode")
    k_rope, c_kv = mla.inputs.k_cache, mla.inputs.v_cache
    assert (k_rope.shape[-1], c_kv.shape[-1], mla.inputs.mla_cache.shape[-1]) == (64, 512, 576)
    assert k_rope.data_ptr() == c_kv.data_ptr() + 512 * c_kv.element_size()  # two views of one buffer
    torch.testing.assert_close(mla.inputs.mla_cache, torch.cat([c_kv, k_rope], -1))
    chunks = _calls("mla_chunked_prefix")
    assert [c.label for c in chunks][:2] == ["extend (new tokens, causal)", "prefix chunk 0 (non-causal)"]
    assert len(chunks) == 1 + 5 and chunks[-1].case.requests == ((16, 44), (33, 0), (8, 0))  # 192 // 3 = 64
    (fp8,) = _calls("fp8_kv_decode")
    kd = fp8.inputs.quant.k_descale
    assert kd.shape == (3, 2) and kd.stride() == (0, 0)  # the per-tensor scale expanded, no copy
    assert fp8.inputs.k_cache.dtype == torch.float8_e4m3fn and fp8.inputs.quant.q.dtype == torch.float8_e4m3fn
    assert {c.case.num_splits for c in _calls("decode_deterministic")} == {1}
    assert {c.case.num_splits for c in _calls("decode")} == {None}


# ------------------------------------------------------------------ planted bugs
class _VirtualBatchOffByOne(SGLangFlashAttention):
    """Planted: the first local block boundary of the first request that spans two chunks moved by one query."""

    def virtual_batches(self, chunk, cu_q, lens, table, page_size):
        vb = super().virtual_batches(chunk, cu_q, lens, table, page_size)
        q = list(vb.seqlens_q_local)
        i = next(i for i in range(len(q) - 1) if vb.requests[i] == vb.requests[i + 1])
        q[i], q[i + 1] = q[i] + 1, q[i + 1] - 1
        cu = [sum(q[:j]) for j in range(len(q) + 1)]
        return dataclasses.replace(vb, seqlens_q_local=q, cu_seqlens_q_local=cu)


class _MergeWithoutLse(SGLangFlashAttention):
    """Planted: the top-k cascade's two parts averaged instead of merged by LSE."""

    def merge_state(self, o_a, s_a, o_b, s_b):
        return (o_a.float() + o_b.float()).div(2).to(o_a.dtype), torch.maximum(s_a, s_b)


class _WindowMinusOne(SGLangFlashAttention):
    """Planted: the layer's window (already minus one) reduced by one again, as vLLM's spelling would."""

    def window_size(self, sliding_window_size):
        left, right = super().window_size(sliding_window_size)
        return (left - 1, right) if left >= 0 else (left, right)


class _MlaSplitSwapped(SGLangFlashAttention):
    """Planted: the 576-wide cache split rope-first: k_rope = kv[..., :64], c_kv = kv[..., 64:]."""

    def split_mla_cache(self, kv_cache, v_head_dim):
        rope = kv_cache.shape[-1] - v_head_dim
        return kv_cache[..., :rope], kv_cache[..., rope:]


class _DescaleFirstRowOnly(SGLangFlashAttention):
    """Planted: the per-tensor descale not expanded: written to row 0 of a (batch, hk) buffer of ones."""

    def descales(self, scale, batch_size, num_kv_heads):
        out = torch.ones(batch_size, num_kv_heads, device=scale.device)
        out[0] = scale.reshape(())
        return out


class _DescaleDropped(SGLangFlashAttention):
    """Planted: no descale passed (the kernel's default 1.0)."""

    def descales(self, scale, batch_size, num_kv_heads):
        return torch.ones(batch_size, num_kv_heads, device=scale.device)


PLANTED = [
    (_VirtualBatchOffByOne, "local_extend"),
    (_MergeWithoutLse, "spec_verify_topk"),
    (_WindowMinusOne, "sliding_window_extend"),
    (_MlaSplitSwapped, "mla_decode"),
    (_DescaleFirstRowOnly, "fp8_kv_decode"),
    (_DescaleDropped, "fp8_kv_decode"),
]


@pytest.mark.parametrize("bug,scenario", PLANTED, ids=[b.__name__.lstrip("_") for b, _ in PLANTED])
def test_planted_engine_bugs_fail_the_verdict(bug, scenario, monkeypatch):
    res = _verdict(CASES[scenario], bug(), monkeypatch)
    assert res.status is Status.FAIL, res.reason
    assert res.stats.error_ratio > 3, res.stats.error_ratio


def test_window_bug_is_the_double_minus_one():
    (call,) = (c for _, c in _WindowMinusOne().plan(CASES["sliding_window_decode"]))
    assert call.window == (22, 0)


# ------------------------------------------------------------------ findings: the seed against its layer
class _LocalTableInPages(SGLangFlashAttention):
    """The fix of sglang PR 32902 (part 1): virtual batches cut from the page table strided to pages."""

    def local_page_table(self, page_table, page_size):
        return page_table[:, ::page_size] // page_size


class _LocalChunkKept(_LocalTableInPages):
    """The fix of sglang PR 32902 (part 2): no chunk adjustment."""

    def virtual_batches(self, chunk, cu_q, lens, table, page_size):
        return make_local_attention_virtual_batches(chunk, cu_q, lens, table, page_size, adjust_chunk=False)


def test_finding_local_attention_at_page_size_16_reads_token_slots_as_pages(monkeypatch):
    res = _verdict(FINDING_CASES["local_paged"], SGLangFlashAttention(), monkeypatch)
    assert res.status is Status.ERROR and "local_block_table[" in res.reason and "page id" in res.reason
    assert _verdict(FINDING_CASES["local_paged"], _LocalTableInPages(), monkeypatch).status is Status.PASS


def test_finding_chunk_adjustment_cuts_a_short_batch_at_a_page_multiple(monkeypatch):
    case = FINDING_CASES["local_short_batch"]  # chunk 64, longest sequence 50, page 16: chunk 48
    assert ENGINE.scenario(case).chunk == 64 and effective_chunk_size(64, 50, 16) == 48
    res = _verdict(case, _LocalTableInPages(), monkeypatch)
    assert res.status is Status.FAIL and res.stats.error_ratio > 3, res.reason
    assert _verdict(case, _LocalChunkKept(), monkeypatch).status is Status.PASS


def test_finding_mixed_steps_skip_local_attention(monkeypatch):
    case = FINDING_CASES["local_mixed"]
    assert [label for label, _ in ENGINE.plan(case)] == ["mixed (page table)"]  # no virtual batches
    res = _verdict(case, SGLangFlashAttention(), monkeypatch)
    assert res.status is Status.FAIL and res.stats.error_ratio > 3, res.reason


class _SinkOnce(SGLangFlashAttention):
    """The sink given to the prefix call only, so the merge counts it once."""

    def _run(self, kc, case, inputs, st, pool, kernel):
        if kc.label.startswith("verify draft tree"):
            kc = dataclasses.replace(kc, case=kc.case.replace(sinks=False))
            inputs = dataclasses.replace(inputs, sinks=None)
        return super()._run(kc, case, inputs, st, pool, kernel)


def test_finding_topk_cascade_counts_sinks_twice(monkeypatch):
    case = FINDING_CASES["spec_verify_topk_sinks"]
    res = _verdict(case, SGLangFlashAttention(), monkeypatch)
    assert res.status is Status.FAIL and res.stats.error_ratio > 3, res.reason
    assert _verdict(case, _SinkOnce(), monkeypatch).status is Status.PASS


def test_finding_encoder_page_table_is_not_strided_to_pages(monkeypatch):
    case = FINDING_CASES["cross_paged"]
    md = ENGINE._step(case).metadata
    assert md.encoder_page_table.shape == (1, 40)  # 40 token slots, not 3 page ids
    res = _verdict(case, SGLangFlashAttention(), monkeypatch)
    assert res.status in (Status.FAIL, Status.ERROR) and (res.status is Status.ERROR or res.stats.error_ratio > 3)


def test_finding_fp8_descales_do_not_fit_virtual_batches():
    with pytest.raises(ValueError, match=r"k_descale: expanded to \(batch_size=2, hk\) but call .* has 4 sequences"):
        ENGINE.plan(FINDING_CASES["fp8_local"])


# ------------------------------------------------------------------ bad metadata and bad cases
def test_bad_metadata_raises_naming_the_field():
    case = CASES["extend_prefix"]
    st = ENGINE._step(case)
    kw = dict(page_size=16, num_pages=st.num_pages, total_q=case.total_q)
    md = st.metadata
    with pytest.raises(ValueError, match=r"page_table is too short: cache_seqlens_int32\[0\] = 84 needs 6 pages"):
        ENGINE.check_metadata(dataclasses.replace(md, page_table=md.page_table[:, :2]), **kw)
    with pytest.raises(ValueError, match=r"cu_seqlens_k \[0, 84, 90, 141\] disagrees with cache_seqlens_int32"):
        ENGINE.check_metadata(dataclasses.replace(md, cu_seqlens_k=[0, 84, 90, 141]), **kw)
    with pytest.raises(ValueError, match=r"cu_seqlens_q ends at 59 but the step has 60 query rows"):
        ENGINE.check_metadata(dataclasses.replace(md, cu_seqlens_q=[0, 20, 27, 59]), **kw)
    cross = ENGINE._step(CASES["cross_extend"])
    with pytest.raises(ValueError, match="encoder_page_table: encoder_lens_int32 is \\[40\\] but there is no encoder"):
        ENGINE.check_metadata(
            dataclasses.replace(cross.metadata, encoder_page_table=None), page_size=1, num_pages=cross.num_pages,
            total_q=12,
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"local_block_table\[0, 0\] = 99 is not a page id"):
        names = ("local_block_table", "local_seqused_k", "local_query_start_loc", None)
        check_call_metadata(names, torch.tensor([[99]]), [1], [0, 1], None, page_size=16, num_pages=4, total_q=1)


def test_cases_must_match_their_scenario():
    with pytest.raises(ValueError, match="scenario must be one of"):
        ENGINE.plan(CASES["decode"].replace(scenario="no-such-scenario"))
    with pytest.raises(ValueError, match=r"window must be \(23, 0\) for scenario 'sliding_window_extend'"):
        ENGINE.plan(CASES["sliding_window_extend"].replace(window=(22, 0)))
    with pytest.raises(ValueError, match="requests must be"):
        ENGINE.plan(CASES["decode"].replace(requests=((1, 5),)))
