"""Seed 001 (vLLM V1 FlashAttention, vendor fork) replayed: ``conformance/engines/vllm_v1/fa.py``.

* every scenario passes the verdict on sdpa-cpu and flex-cpu, and every call the forward makes is planned;
* the runner and builder pieces: reorder, decode/prefill split, block tables (shared prompt, kernel blocks),
  the cascade heuristic (chosen and declined by each rule), cache shapes and stride orders, metadata checks;
* planted engine bugs, one method each, fail the verdict (``-s`` prints their error ratios);
* findings: the fork's cascade drops the sinks (upstream's prefix-call ``s_aux`` passes), GPU adapters refuse
  the int8 calls with a reason.
"""

from __future__ import annotations

import functools
import json

import pytest
import torch

from attnfast.base import KernelOutput
from attnfast.fa3_vllm import FA3VllmBackend
from attnfast.registry import get_backend
from attnref import quantize_int8_per_token_head
from conformance.cases.case import AttentionCase
from conformance.engines import get_engine
from conformance.engines.vllm_v1 import (
    SCENARIOS,
    CommonAttentionMetadata,
    FlashAttentionMetadataBuilder,
    VllmV1FlashAttention,
    allocate_kv_cache,
    get_kv_cache_shape,
    kernel_block_size,
    reorder_batch,
    split_decodes_and_prefills,
    use_cascade_attention,
)
from conformance.records import Status
from conformance.verdict.check import CaseContext, check_backend, prepare_context
from tests.conformance.engines.recorder import Recorder, engine_verdict

ENGINE = VllmV1FlashAttention()
CASES = {c.scenario: c for c in ENGINE.cases() if not c.graph and not c.invariance}  # graph, invariance: own tests


@functools.cache
def _ctx(scenario: str) -> CaseContext:
    return prepare_context(CASES[scenario], 0, "cpu")


def _check(scenario: str, backend: str = "sdpa-cpu", engine: VllmV1FlashAttention | None = None, monkeypatch=None):
    ctx = _ctx(scenario)
    ctx.ref_charged = True
    if engine is not None:
        return engine_verdict(ctx, engine, monkeypatch, backend)
    return check_backend(ctx, get_backend(backend))


# ------------------------------------------------------------------ the scenarios
def test_cases_round_trip_and_pass_check():
    assert len(CASES) == len(SCENARIOS) >= 20
    for case in CASES.values():
        again = AttentionCase.from_json(json.loads(json.dumps(case.to_json())))
        assert again == case and again.id.startswith(f"vllm_v1_fa-{case.scenario}_")
        ENGINE.check(case)
    assert get_engine("vllm_v1_fa").seed == "001"
    covered = (
        {c.kv_layout for c in CASES.values()}
        | {c.block_size for c in CASES.values()}
        | {c.quant for c in CASES.values()}
    )
    assert {"NHD", "HND", "contiguous", 16, 32, 64, "int8_t1", "int8_t2"} <= covered
    assert any(c.sinks for c in CASES.values()) and any(c.has_window for c in CASES.values())


@pytest.mark.parametrize("backend", ["sdpa-cpu", "flex-cpu"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_scenario_passes_on_the_cpu_backends(scenario, backend):
    res = _check(scenario, backend)
    assert res.status is Status.PASS, res.reason
    assert res.extra["engine"] == {"engine": "vllm_v1_fa", "scenario": scenario, "seed": "001"}
    assert res.extra["notes"], "the record lists the calls"


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_plan_lists_exactly_the_calls_forward_makes(scenario):
    case = CASES[scenario]
    rec = Recorder()
    ENGINE.forward(case, _ctx(scenario).inputs, rec)
    planned = ENGINE.plan(case)
    made = sorted(((c.label, c.case) for c in rec.calls), key=lambda lc: lc[0])
    assert made == sorted(planned, key=lambda lc: lc[0])
    assert all(call.inputs.case is call.case for call in rec.calls)
    assert len({label for label, _ in planned}) == len(planned)


# ------------------------------------------------------------------ runner: reorder, split, blocks
def test_reorder_moves_only_misplaced_requests_decode_extend_prefill():
    # regions: prefill, decode, extend, decode, prefill -> the two decodes first, the extend next
    assert reorder_batch([40, 1, 24, 1, 17], [0, 69, 50, 32, 0], 1) == [3, 1, 2, 0, 4]
    assert reorder_batch([1, 1, 5], [3, 4, 2], 1) == [0, 1, 2]  # already ordered: nothing moves
    assert reorder_batch([6, 3, 1, 2, 5, 3], [0, 87, 39, 15, 50, 0], 3) == [5, 1, 2, 3, 4, 0]  # spec decode: q <= 3
    step = ENGINE.step(CASES["mixed_nhd_bs16"])
    assert step.order == [3, 1, 2, 0, 4] and step.q_lens == [1, 1, 24, 40, 17] and step.num_decodes == 2
    cu = [0, 40, 41, 65, 66, 83]  # the caller's token offsets
    assert step.token_index[:2] == [cu[3], cu[1]] and step.token_index[2:26] == list(range(41, 65))


def test_split_decodes_and_prefills_needs_decodes_first():
    assert split_decodes_and_prefills([0, 1, 2, 26, 66], 1) == (2, 2, 2, 64)
    assert split_decodes_and_prefills([0, 1, 2], 1) == (2, 0, 2, 0)
    assert split_decodes_and_prefills([0, 3, 4, 9], 3) == (2, 1, 4, 5)
    with pytest.raises(ValueError, match="query_start_loc: decodes .* must come first"):
        split_decodes_and_prefills([0, 40, 41], 1)


def test_builder_metadata_of_a_mixed_step():
    case = CASES["mixed_nhd_bs16"]
    step = ENGINE.step(case)
    meta = ENGINE.builder(step).build(0, ENGINE.common_metadata(case, step, 0, "cpu"))
    assert (meta.num_decodes, meta.num_decode_tokens, meta.num_prefills, meta.use_cascade) == (2, 2, 3, False)
    assert meta.prefill.query_start_loc.tolist() == [0, 24, 64, 81]
    assert meta.prefill.key_start_loc.tolist() == [0, 74, 114, 131]  # seq lens 74, 40, 17 of the prefills
    assert meta.decode.seq_lens.tolist() == [33, 70] and meta.decode.max_decode_seq_len == 70
    assert torch.equal(meta.prefill.block_table, meta.block_table[2:])
    assert meta.slot_mapping.numel() == case.total_q and (meta.slot_mapping >= 0).all()


def test_shared_prompt_shares_blocks_and_keys():
    case = CASES["cascade_mixed"]
    step = ENGINE.step(case)
    assert all(row[:32] == step.table[0][:32] for row in step.table)  # 512 tokens = 32 blocks of 16
    assert len({b for row in step.table for b in row[32:]} & set(step.table[0][:32])) == 0
    inputs = ENGINE.layer_inputs(case, _ctx("cascade_mixed").inputs)
    cu = inputs.cu_seqlens_k.tolist()
    assert all(torch.equal(inputs.k[cu[b] : cu[b] + 512], inputs.k[:512]) for b in range(8))
    not_all = ENGINE.step(CASES["cascade_declined_not_all"])
    assert not_all.table[not_all.order.index(3)][0] != not_all.table[not_all.order.index(0)][0]


def test_manager_blocks_are_split_into_kernel_blocks():
    assert kernel_block_size(128) == 64 and kernel_block_size(48) == 16 and kernel_block_size(32) == 32
    with pytest.raises(ValueError, match="no kernel block size"):
        kernel_block_size(24)
    step = ENGINE.step(CASES["block_128_kernel_64"])
    for row in step.table:
        assert all(row[2 * i + 1] == row[2 * i] + 1 and row[2 * i] % 2 == 0 for i in range(len(row) // 2))


# ------------------------------------------------------------------ cache shapes and stride orders
def test_cache_shapes_and_physical_orders():
    assert get_kv_cache_shape(5, 16, 2, 64, "HND") == (2, 5, 2, 16, 64)
    assert get_kv_cache_shape(5, 16, 2, 64, "HND", slabs=3) == (3, 5, 2, 16, 64)
    assert get_kv_cache_shape(5, 32, 2, 64, "NHD") == (2, 5, 32, 2, 64)
    with pytest.raises(ValueError, match="block_size must be a multiple of 16"):
        get_kv_cache_shape(5, 8, 2, 64, "HND")
    plain = allocate_kv_cache(3, 16, 2, 8, dtype=torch.bfloat16, layout="NHD")
    assert plain.k.is_contiguous() and plain.k.shape == (3, 16, 2, 8)
    hnd_mem = allocate_kv_cache(3, 16, 2, 8, dtype=torch.bfloat16, layout="NHD", physical=True)
    assert hnd_mem.raw.shape == (2, 3, 2, 16, 8) and hnd_mem.k.shape == (3, 16, 2, 8) and not hnd_mem.k.is_contiguous()
    hnd_mem.k[1, 5, 1] = 7.0  # block 1, token 5, head 1 through the view: (block, head, token) in memory
    assert hnd_mem.raw[0, 1, 1, 5].eq(7.0).all()
    cross = allocate_kv_cache(3, 16, 2, 8, dtype=torch.float16, layout="HND", physical=True)
    assert cross.raw.shape == (3, 16, 2, 2, 2, 8) and cross.k.shape == (3, 2, 16, 8)  # (nb, bs, layers, 2, hk, d)
    cross.v[2, 1, 9] = 3.0
    assert cross.raw[2, 9, 1, 1, 1].eq(3.0).all()
    t2 = allocate_kv_cache(3, 16, 2, 8, dtype=torch.bfloat16, layout="HND", quant="int8_t2")
    assert t2.raw.dtype == torch.int8 and t2.raw.shape == (3, 3, 2, 16, 8) and t2.v.dtype == torch.bfloat16
    assert t2.v.data_ptr() == t2.raw[1].data_ptr() and t2.k_scale.shape == (3, 2, 16)


def test_int8_v_written_with_the_static_scale_is_the_cases_stored_v():
    inputs = _ctx("int8_t1_mixed").inputs
    q = inputs.quant
    assert torch.equal(ENGINE._quantize_value(inputs.v, q.v_descale), q.v)


# ------------------------------------------------------------------ the cascade heuristic
def test_use_cascade_attention_rules():
    lens = [1, 5] * 4
    kw = dict(num_query_heads=8, num_kv_heads=2, use_alibi=False, use_sliding_window=False,
              use_local_attention=False, num_sms=132, dcp_world_size=1)  # fmt: skip
    assert use_cascade_attention(256, lens, **kw)
    assert not use_cascade_attention(255, lens, **kw)
    assert not use_cascade_attention(512, lens[:7], **kw)
    for flag in ("use_alibi", "use_sliding_window", "use_local_attention"):
        assert not use_cascade_attention(512, lens, **kw | {flag: True})
    assert not use_cascade_attention(512, lens, **kw | {"dcp_world_size": 2})
    # all decodes with GQA: FlashDecoding's model; 20 decodes x 8 kv heads: 2 prefix tiles vs cdiv(320, 132) = 3
    dec = dict(kw, num_query_heads=16, num_kv_heads=8)
    assert use_cascade_attention(256, [1] * 20, **dec) and not use_cascade_attention(256, [1] * 8, **dec)
    assert not use_cascade_attention(256, [1] * 16, **dec)  # cdiv(256, 132) = 2: a tie is no gain
    assert use_cascade_attention(256, [1] * 8, **dec | {"num_kv_heads": 16})  # MHA: no FlashDecoding


def test_scenarios_choose_and_decline_cascade_as_declared():
    for name, sc in SCENARIOS.items():
        if sc.shared_prefix:
            assert bool(ENGINE.step(CASES[name]).common_prefix_len) == sc.cascade, name
    assert ENGINE.step(CASES["cascade_mixed"]).common_prefix_len == 512
    assert ENGINE.step(CASES["cascade_capped"]).common_prefix_len == 288  # min computed 300, blocks of 32
    assert ENGINE.step(CASES["cascade_decodes"]).common_prefix_len == 256
    labels = [label for label, _ in ENGINE.plan(CASES["cascade_mixed"])]
    assert labels == ["cascade prefix (all tokens, unmasked)", "cascade suffix (causal)"]
    prefix = ENGINE.plan(CASES["cascade_capped"])[0][1]
    assert prefix.requests == ((CASES["cascade_capped"].total_q, 288),) and not prefix.causal


# ------------------------------------------------------------------ bad metadata
def _common(**changes) -> CommonAttentionMetadata:
    base = dict(
        query_start_loc=torch.tensor([0, 1, 2, 26], dtype=torch.int32),
        seq_lens=torch.tensor([33, 70, 74], dtype=torch.int32),
        block_table_tensor=torch.arange(15, dtype=torch.int32).reshape(3, 5),
        slot_mapping=torch.arange(26),
    )
    return CommonAttentionMetadata(**(base | changes))


def test_bad_metadata_raises_naming_the_field():
    builder = FlashAttentionMetadataBuilder(block_size=16)
    builder.build(0, _common())
    with pytest.raises(ValueError, match=r"block_table_tensor has 4 blocks per row; seq_lens\[1\] = 70 needs 5"):
        builder.build(0, _common(block_table_tensor=torch.zeros(3, 4, dtype=torch.int32)))
    with pytest.raises(
        ValueError, match=r"seq_lens\[2\] = 20 is shorter than its query length 24 from query_start_loc"
    ):
        builder.build(0, _common(seq_lens=torch.tensor([33, 70, 20], dtype=torch.int32)))
    with pytest.raises(ValueError, match="query_start_loc must be non-decreasing from 0"):
        builder.build(0, _common(query_start_loc=torch.tensor([0, 2, 1, 26], dtype=torch.int32)))
    with pytest.raises(ValueError, match="slot_mapping must hold one slot per token"):
        builder.build(0, _common(slot_mapping=torch.arange(25)))
    with pytest.raises(ValueError, match="common_prefix_len"):
        builder.build(8, _common())
    dcp = FlashAttentionMetadataBuilder(block_size=16, dcp_world_size=2)
    dcp.build(0, _common(block_table_tensor=torch.zeros(3, 3, dtype=torch.int32)))  # virtual blocks of 32 tokens
    with pytest.raises(ValueError, match="block_table_tensor"):
        dcp.build(0, _common(block_table_tensor=torch.zeros(3, 2, dtype=torch.int32)))


def test_cases_the_fork_cannot_run_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="scenario must be one of"):
        ENGINE.check(CASES["mixed_nhd_bs16"].replace(scenario="nope"))
    with pytest.raises(ValueError, match="requests must be scenario"):
        ENGINE.check(CASES["mixed_nhd_bs16"].replace(requests=((1, 1),)))
    with pytest.raises(ValueError, match="key_cache, unbound for int8"):
        ENGINE.check(CASES["cascade_mixed"].replace(quant="int8_t2"))
    with pytest.raises(ValueError, match="no q/k/v descales"):
        ENGINE.check(CASES["mixed_nhd_bs16"].replace(quant="fp8_e4m3"))
    with pytest.raises(ValueError, match="DCP drops sinks"):
        ENGINE.check(CASES["dcp2_decode"].replace(sinks=True))
    with pytest.raises(ValueError, match="block_size must be a multiple of 16"):
        ENGINE.check(CASES["mixed_nhd_bs16"].replace(block_size=8))


@pytest.mark.parametrize("scenario", ["dcp2_decode", "block_128_kernel_64", "mixed_nhd_bs16"])
def test_a_contiguous_cache_is_refused_naming_the_paged_cache_the_fork_needs(scenario):
    """The DCP and manager-block checks read the block size: a contiguous case (none) raised TypeError there."""
    with pytest.raises(ValueError, match=r"decoder calls are causal \(hard-coded causal=True\) over a paged cache"):
        ENGINE.check(CASES[scenario].replace(kv_layout="contiguous", block_size=None))


def test_gpu_adapters_refuse_the_int8_calls_with_a_reason():
    support = ENGINE.supports(CASES["int8_t1_mixed"], FA3VllmBackend(), "cuda")
    assert not support and support.reason.startswith("prefill (varlen, paged): int8_t1: FA3 takes")
    assert ENGINE.supports(CASES["mixed_hnd_bs64_sinks"], FA3VllmBackend(), "cuda")


# ------------------------------------------------------------------ planted bugs
class _NotSharedByAll(VllmV1FlashAttention):
    """Cascade where the prefix is not shared by all: common blocks counted between the first two rows only."""

    def _num_common_prefix_blocks(self, rows, owned):
        return super()._num_common_prefix_blocks(rows[:2], owned[:2])


class _PrefixNotCapped(VllmV1FlashAttention):
    """The common prefix not capped by the fewest computed tokens (queries see later prefix keys unmasked)."""

    def _cascade_prefix_len(self, shared_tokens, cached, block):
        return shared_tokens


class _PrefixOneBlockLong(VllmV1FlashAttention):
    """The prefix length off by one block: one block past the shared ones (request 0's own block for everyone)."""

    def _cascade_prefix_len(self, shared_tokens, cached, block):
        return super()._cascade_prefix_len(shared_tokens, cached, block) + block


class _MergeWithoutLse(VllmV1FlashAttention):
    """Cascade parts averaged instead of merged by LSE."""

    def _merge(self, prefix_out, prefix_lse, suffix_out, suffix_lse):
        out = (prefix_out.float() + suffix_out.float()).div(2).to(prefix_out.dtype)
        return out, torch.maximum(prefix_lse, suffix_lse)


class _NotReorderedBack(VllmV1FlashAttention):
    """The layer output left in the reordered (decodes first) token order."""

    def _restore(self, step, out, lse):
        return KernelOutput(out, lse)


class _ReorderedTwice(VllmV1FlashAttention):
    """The caller-order restore applied twice."""

    def _restore(self, step, out, lse):
        once = super()._restore(step, out, lse)
        return super()._restore(step, once.out, once.lse)


class _HndReadAsNhd(VllmV1FlashAttention):
    """The HND cache memory read as NHD ((block, token, head) order) and handed on as the HND view."""

    def _kernel_view(self, cache):
        k, v = super()._kernel_view(cache)
        if cache.layout != "HND":
            return k, v
        nb, hk, bs, d = k.shape
        return k.reshape(nb, bs, hk, d).transpose(1, 2), v.reshape(nb, bs, hk, d).transpose(1, 2)


class _Int8VPerToken(VllmV1FlashAttention):
    """int8 type 1 V quantized per (token, head) while the kernels dequantize with the static per-channel scale."""

    def _quantize_value(self, value, v_scale):
        return quantize_int8_per_token_head(value)[0]


BUGS = [
    (_NotSharedByAll, "cascade_declined_not_all"),
    (_PrefixNotCapped, "cascade_capped"),
    (_PrefixOneBlockLong, "cascade_capped"),
    (_MergeWithoutLse, "cascade_mixed"),
    (_NotReorderedBack, "mixed_nhd_bs16"),
    (_ReorderedTwice, "mixed_nhd_bs16"),
    (_HndReadAsNhd, "mixed_hnd_bs32"),
    (_Int8VPerToken, "int8_t1_mixed"),
]


@pytest.mark.parametrize("bug,scenario", BUGS, ids=[b.__name__ for b, _ in BUGS])
def test_planted_bugs_fail(bug, scenario, monkeypatch):
    res = _check(scenario, engine=bug(), monkeypatch=monkeypatch)
    print(f"\n{bug.__name__} on {scenario}: {res.status.value}, error ratio {res.stats.error_ratio:.3g}")
    assert res.status is Status.FAIL, res.reason
    assert res.stats.error_ratio > 3


def test_planted_bug_subclasses_still_plan_what_they_run():
    bug = _NotSharedByAll()
    assert bug.step(CASES["cascade_declined_not_all"]).common_prefix_len == 512  # cascade, wrongly
    assert _PrefixNotCapped().step(CASES["cascade_capped"]).common_prefix_len == 512


# ------------------------------------------------------------------ findings
class _UpstreamCascadeSinks(VllmV1FlashAttention):
    """Upstream vLLM's cascade_attention: s_aux goes to the prefix call (its LSE carries the sinks into the merge)."""

    cascade_sinks_on_prefix = True


def test_finding_the_forks_cascade_drops_the_sinks(monkeypatch):
    case = CASES["cascade_mixed"].replace(sinks=True)
    ctx = prepare_context(case, 0, "cpu")
    fork = check_backend(ctx, get_backend("sdpa-cpu"))
    print(f"\nfork cascade with sinks: {fork.status.value}, error ratio {fork.stats.error_ratio:.3g}")
    assert fork.status is Status.FAIL and fork.stats.error_ratio > 3
    assert ENGINE.plan(case)[0][1].sinks is False
    upstream = engine_verdict(ctx, _UpstreamCascadeSinks(), monkeypatch)
    assert upstream.status is Status.PASS, upstream.reason
