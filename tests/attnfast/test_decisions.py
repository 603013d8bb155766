"""What the FA-family kernels decide for a call (issue 31 item 6, "which variant ran"): the split-KV count and GQA
packing in the record's variant.  CPU: the heuristics reproduced in :mod:`attnfast.decisions`, at points worked out
by hand from the cited source, and the read-back summaries on lists laid out as the kernels write them.  GPU: each
against the real kernel (FA2: the pinned predicted split count gives the heuristic's bits; vLLM's FA3 fork: the
metadata the summary reads, passed to the call, gives its bits; FlashMLA: the SM parts of its source)."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from attnfast._fa_common import KernelCall, PreparedKernel
from attnfast.decisions import (
    fa3_vllm_call_mask,
    fa3_vllm_fwd_tile,
    fa3_vllm_tile_size_sm90,
    fa2_num_splits_heuristic,
    fa2_split_decision,
    fa3_decision,
    fa3_num_splits_heuristic,
    fa3_should_pack_gqa,
    fa3_tile_size_sm90,
    fa3_vllm_head_swizzle,
    fa3_vllm_metadata_summary,
    flashmla_sched_summary,
)
from attnfast.fa2 import FA2Backend, fa2_plan
from attnfast.fa3 import FA3Backend, fa3_plan
from attnfast.fa3_vllm import (
    FA3VllmBackend,
    fa3_scheduler_metadata,
    fa3_vllm_decided,
    fa3_vllm_plan,
    import_vllm_fa3,
)
from attnfast.flashmla import FlashMLABackend, flashmla_decided
from conformance.cases.inputs import make_inputs
from conformance.records import Status
from conformance.verdict.check import check_backend, prepare_context
from fake_fa3 import available_or_skip, fa_case

H100_SMS = 132
MLA = dict(num_kv_heads=1, head_dim=64, head_dim_v=512, qv=True, kv_layout="NHD", block_size=64)


def C(requests, **kw):
    """A GQA decode-sized case: 32 query heads, 8 kv heads, head dim 128; ``kw`` overrides."""
    return fa_case(requests, **{"num_heads": 32, "num_kv_heads": 8, "head_dim": 128, **kw})


# ------------------------------------------------------------------------------------------------ FA2 (2.8.3)
@pytest.mark.parametrize(
    "blocks, num_sms, n_blocks, expected",
    [
        (48, 108, 64, 2),  # the source comment's example: 48 blocks on 108 SMs, 2 splits (efficiency 0.89)
        (8, 264, 32, 32),  # eff 8s/264 grows to 32 (0.97); the first eligible >= 0.85 * 0.97 is 32 (27..31 repeat 2)
        (64, 264, 32, 4),  # eff 64*4/264 = 0.97 is the best already at 4
        (212, 264, 32, 1),  # 212 >= 0.8 * 264 = 211.2: enough blocks, one split
        (8, 10, 32, 1),  # 8 >= 0.8f * 10 (8.0 in float32): one split (with "> 0.8 * SMs" it would be 5)
        (211, 264, 32, 5),  # 211 < 211.2; eff 0.799 for 1..4 splits (211s/264 just under s), 1055/1056 at 5
        (1, 264, 7, 7),  # splits 5 and 6 repeat ceil(7/s) = 2: ineligible, so 7 (6 without the eligibility rule)
        (16, 264, 4, 4),  # 3 repeats ceil(4/3) = 2; eff 16/264, 32/264, 64/264: 4
        (4, 264, 0, 1),  # no key block: no split count to try
    ],
)
def test_fa2_heuristic_at_worked_points(blocks, num_sms, n_blocks, expected):
    assert fa2_num_splits_heuristic(blocks, num_sms, n_blocks, 128) == expected


FA2_DECISIONS = {
    # (case, kvcache, seqlen_k) -> decision on 132 SMs; worked out in the comments from flash_api.cpp 2.8.3
    # one row, GQA 32/8: swapped to 4 rows of 8 heads; 1*8*1 blocks, 4096/128 = 32 key blocks -> 32 splits
    "gqa_decode": (C([(1, 4096)]), True, 4096, {"fa2_num_splits": 32, "fa2_splitkv": True}),
    "gqa_decode_b8": (C([(1, 4096)] * 8), True, 4096, {"fa2_num_splits": 4, "fa2_splitkv": True}),
    "gqa_decode_b64": (C([(1, 4096)] * 64), True, 4096, {"fa2_num_splits": 1, "fa2_splitkv": False}),
    "gqa_decode_b64_append": (
        C([(1, 4096)] * 64, append=True),
        True,
        4096,
        {"fa2_num_splits": 1, "fa2_splitkv": True},  # an append forces the split kernel
    ),
    # MHA: no swap; d 64 -> block_n 256, ceil(1000/256) = 4 key blocks, 3 ineligible -> 4
    "mha_decode_d64": (
        C([(1, 1000)], num_heads=16, num_kv_heads=16, head_dim=64),
        True,
        1000,
        {"fa2_num_splits": 4, "fa2_splitkv": True},
    ),
    "pinned": (C([(1, 4096)], num_splits=3), True, 4096, {"fa2_num_splits": 3, "fa2_splitkv": True}),
    # a bounded left side stops the swap (checked before the side is clamped to the cache): 32 heads, 32 blocks -> 7
    "window_decode": (C([(1, 4096)], window=(16, None)), True, 4096, {"fa2_num_splits": 7, "fa2_splitkv": True}),
    "wide_window_decode": (
        C([(1, 4096)], window=(5000, None)),
        True,
        4096,
        {"fa2_num_splits": 7, "fa2_splitkv": True},
    ),
    # ALiBi stops the swap and keeps causal: 32 heads x 1 block, 7 as above
    "alibi_decode": (C([(1, 4096)], alibi=True, causal=True), True, 4096, {"fa2_num_splits": 7, "fa2_splitkv": True}),
    # varlen decode (mixed q_lens, longest 1): swapped, 2 requests x 2 heads x 1 block, ceil(300/256) = 2 -> 2
    "varlen_decode": (
        C([(1, 300), (0, 50)], num_heads=8, num_kv_heads=2, head_dim=64),
        False,
        300,
        {"fa2_num_splits": 2, "fa2_splitkv": True},
    ),
    "varlen_prefill": (C([(100, 300), (20, 50)]), False, 300, {}),
    "varlen_prefill_paged": (
        C([(100, 300), (20, 50)], kv_layout="NHD", block_size=256),
        False,
        300,
        {"fa2_num_splits": 1, "fa2_splitkv": True},  # paged varlen always runs the split kernel, with one split
    ),
    "varlen_no_key": (C([(1, 0), (0, 0)]), False, 0, {}),
}


@pytest.mark.parametrize("name", sorted(FA2_DECISIONS))
def test_fa2_split_decision(name):
    case, kvcache, seqlen_k, expected = FA2_DECISIONS[name]
    assert fa2_split_decision(case, kvcache, seqlen_k, H100_SMS) == expected


def test_fa2_plan_records_the_decision_for_the_cache_the_call_passes():
    paged = C([(1, 300), (1, 520)], kv_layout="NHD", block_size=256)  # a table of 3 blocks: seqlen_k 768
    call = fa2_plan(paged, make_inputs(paged), num_sms=H100_SMS)
    assert call.kwargs["block_table"].shape[1] == 3
    # swapped GQA: 2 x 8 x 1 blocks; 768 keys are 6 key blocks (eligible 1, 2, 3, 6) -> 6; 520 keys, 5 blocks -> 5
    assert dict(call.variant) == {"fa2_num_splits": 6, "fa2_splitkv": True}
    assert fa2_split_decision(paged, True, 520, H100_SMS)["fa2_num_splits"] == 5  # not the longest request
    contiguous = C([(1, 300), (1, 700)])  # a cache as wide as the longest request: 700 keys, 6 key blocks again
    assert dict(fa2_plan(contiguous, make_inputs(contiguous), 132).variant) == {
        "fa2_num_splits": 6,
        "fa2_splitkv": True,
    }
    assert dict(fa2_plan(contiguous, make_inputs(contiguous)).variant) == {}  # no SM count: nothing claimed


# ------------------------------------------------------------------------------------------ upstream FA3 (3.0.0)
@pytest.mark.parametrize(
    "args, expected",
    [
        ((8, 132, 24, 1, 4096 * 256 * 2, False, 128), 14),  # eff 8s/132: best 128/132 at 16; first >= 0.824: 14
        ((96, 132, 8, 6, 1024 * 128 * 2, True, 128), 4),  # 96s/132: .73 .73 .73 .97 -> 4
        ((8, 132, 4, 1, 10**6, False, 128), 1),  # 4 key blocks or fewer: never split
        ((8, 10, 32, 1, 10**6, False, 128), 1),  # 8 >= 0.8f * 10: the SMs count as full (5 with a strict >)
        ((300, 132, 100, 300, 120 * 2**20, False, 128), 3),  # SMs full, one KV head of 120 MB > L2, 300 >= 264
        ((300, 132, 100, 300, 120 * 2**20, True, 128), 1),  # ... but causal: no split
        ((300, 132, 100, 200, 120 * 2**20, False, 128), 1),  # ... but 200 query blocks < 2 * 132
    ],
)
def test_fa3_heuristic_at_worked_points(args, expected):
    assert fa3_num_splits_heuristic(*args) == expected


def test_fa3_should_pack_gqa_and_tiles():
    assert fa3_should_pack_gqa(True, 128, 2, 128)  # varlen queries: always
    assert fa3_should_pack_gqa(False, 1, 8, 128)  # 1/128 < 0.9 * 8/128
    assert not fa3_should_pack_gqa(False, 128, 2, 128)  # 1.0 vs 0.9 * 1.0
    assert fa3_tile_size_sm90(128, 128, False, False) == (128, 176)
    assert fa3_tile_size_sm90(128, 128, True, False) == (128, 128)
    assert fa3_tile_size_sm90(64, 64, False, False) == (192, 192)
    assert fa3_tile_size_sm90(64, 512, True, False) == (64, 64)
    assert fa3_tile_size_sm90(256, 256, False, True) == (128, 64)
    assert fa3_tile_size_sm90(128, 128, False, False, element_size=1) == (128, 224)


def test_fork_tiles_and_the_adapters_call():
    """vLLM's fork (803020a8 tile_size.h): head dim 64 windows 192 x 160 without intra-warpgroup overlap (causal 192 x
    128 with it), a one-MMA-warpgroup call 64-row tiles, fp8 the two-level-accumulation tiles (d128 128 x 192, d256
    window 128 x 64); the adapter's call as the fork normalises it (a window side past the sequence is unbounded, so
    (300, 0) over 256 keys is plain causal)."""
    assert fa3_vllm_tile_size_sm90(64, 64, False, True) == (192, 160, True, False)
    assert fa3_vllm_tile_size_sm90(64, 64, True, False) == (192, 128, True, True)
    assert fa3_vllm_tile_size_sm90(128, 128, True, False, use_one_mma_wg=True) == (64, 128, True, True)
    assert fa3_vllm_tile_size_sm90(128, 128, False, False) == (128, 160, True, True)
    assert fa3_vllm_tile_size_sm90(128, 128, False, True, element_size=1) == (128, 192, True, True)
    assert fa3_vllm_tile_size_sm90(256, 256, False, True, element_size=1) == (128, 64, True, True)
    assert fa3_vllm_tile_size_sm90(256, 256, False, True, element_size=1, paged_kv_non_tma=True) == (
        128,
        64,
        True,
        False,
    )
    window = C([(300, 256)], head_dim=64, window=(100, 0), causal=True)
    assert fa3_vllm_call_mask(window) == (False, True, 100, 0) and fa3_vllm_fwd_tile(window) == (192, 160, False)
    assert fa3_vllm_call_mask(window.replace(window=(300, 0))) == (True, False, 255, 0)  # left filled: max_k - 1
    assert fa3_vllm_fwd_tile(window.replace(window=(None, None), requests=((8, 256),), num_heads=8)) == (64, 192, True)
    assert fa3_vllm_fwd_tile(window.replace(quant="fp8_e4m3", descale="head")) == (192, 128, True)
    assert fa3_vllm_fwd_tile(window.replace(head_dim=128, window=(None, None))) == (128, 128, True)


FA3_DECISIONS = {
    # varlen decode GQA 32/8 d128: tile 128x176, ceil(4096/176) = 24 key blocks, 8 kv heads x 1 block -> 14
    "varlen_decode": (C([(1, 4096), (1, 100)]), False, 4096, {"fa3_max_splits": 14, "fa3_pack_gqa": True}),
    # causal prefill MHA d64: tile 192x128, 8 key blocks, 16 heads x 6 blocks = 96 -> 4; a split packs
    "causal_prefill": (
        C([(1024, 1024)], num_heads=16, num_kv_heads=16, head_dim=64, causal=True),
        False,
        1024,
        {"fa3_max_splits": 4, "fa3_pack_gqa": True},
    ),
    # MHA prefill d128: 32 x 32 blocks fill the SMs, one KV head (2 MB) fits L2 -> 1; MHA without split: no pack
    "mha_prefill": (
        C([(4096, 4096)], num_heads=32, num_kv_heads=32),
        False,
        4096,
        {"fa3_max_splits": 1, "fa3_pack_gqa": False},
    ),
    # paged page 64: 64 % 176 != 0, no TMA, tile 128x128, 32 blocks, 8 x 1 -> 14; non-TMA paging packs
    "paged_decode": (
        C([(1, 4096)], num_heads=64, kv_layout="NHD", block_size=64),
        True,
        4096,
        {"fa3_max_splits": 14, "fa3_pack_gqa": True},
    ),
    "pinned": (C([(1, 4096)], num_splits=1), False, 4096, {"fa3_max_splits": 1, "fa3_pack_gqa": True}),
}


@pytest.mark.parametrize("name", sorted(FA3_DECISIONS))
def test_fa3_decision(name):
    case, kvcache, seqlen_k, expected = FA3_DECISIONS[name]
    assert fa3_decision(case, kvcache, seqlen_k, H100_SMS) == expected


def test_fa3_plan_records_the_decision_with_the_cache_width():
    paged = C([(1, 300), (1, 4000)], kv_layout="NHD", block_size=64)
    call = fa3_plan(paged, make_inputs(paged), num_sms=H100_SMS)
    width = call.kwargs["page_table"].shape[1] * 64
    assert dict(call.variant) == fa3_decision(paged, True, width, H100_SMS)
    assert dict(fa3_plan(paged, make_inputs(paged)).variant) == {}


# ---------------------------------------------------------------------------------------------- vLLM's FA3 fork
def test_fork_metadata_summary_reads_the_layout():
    # 3 requests (b_r 4), causal (swizzle): [prepare_seqlen_q x4][num_splits_dynamic x4][num_nheads_in_l2 x4][sem]
    junk = -7  # torch.empty padding
    values = [4, 8, 0, junk] + [3, 5, 1, junk] + [16, 16, 16, junk] + [0]
    assert fa3_vllm_metadata_summary(values, [1, 2, 0], 4, True) == {"fa3_num_splits": 5, "fa3_pack_gqa": True}
    # no split vector, no swizzle: prepare_seqlen_q alone; q_len * group -> packed, q_len -> not
    assert fa3_vllm_metadata_summary([8, 4, 0, junk, 0], [2, 1, 0], 4, False) == {
        "fa3_num_splits": 1,
        "fa3_pack_gqa": True,
    }
    assert fa3_vllm_metadata_summary([2, 1, 0, junk, 0], [2, 1, 0], 4, False) == {
        "fa3_num_splits": 1,
        "fa3_pack_gqa": False,
    }
    assert fa3_vllm_metadata_summary([2, 1, 0, junk, 0], [2, 1, 0], 1, False) == {"fa3_num_splits": 1}  # MHA
    # swizzle without a split vector: two vectors
    assert fa3_vllm_metadata_summary([1] * 8 + [0], [1, 1, 1, 1], 1, True) == {"fa3_num_splits": 1}


@pytest.mark.parametrize(
    "values, q_lens, group, swizzle, match",
    [
        ([1, 1, 1, 1, 0], [1, 1], 1, True, "not the layout"),  # swizzle needs a second vector
        ([1] * 16 + [0], [1, 1], 1, False, "not the layout"),  # four vectors: sorting is never on in this fork
        ([1, 1, 1, 1, 0, 0], [1, 1], 1, False, "not the layout"),  # two semaphores
        ([1, 1, 0, 0] + [0, 2, 9, 9] + [0], [1, 1], 1, False, "outside 1..256"),
        ([3, 4, 0, 0, 0], [1, 1], 4, False, "prepare_seqlen_q 3"),
    ],
)
def test_fork_metadata_summary_refuses_another_layout(values, q_lens, group, swizzle, match):
    with pytest.raises(ValueError, match=match):
        fa3_vllm_metadata_summary(values, q_lens, group, swizzle)


def test_fork_head_swizzle_follows_the_schedulers_mask_normalisation():
    assert fa3_vllm_head_swizzle(C([(5, 40)], causal=True))
    assert not fa3_vllm_head_swizzle(C([(1, 40)], causal=True))  # one row, contiguous: causal dropped
    assert fa3_vllm_head_swizzle(C([(1, 40)], causal=True, kv_layout="NHD", block_size=16))  # d 128 paged keeps it
    assert not fa3_vllm_head_swizzle(C([(5, 40)]))
    assert fa3_vllm_head_swizzle(C([(5, 40)], window=(8, None)))  # local
    assert not fa3_vllm_head_swizzle(C([(5, 40)], window=(39, None)))  # a side past the keys is unbounded


def test_fork_decided_reads_the_passed_metadata_or_asks_the_scheduler():
    calls = []

    def scheduler(*args, **kw):
        calls.append(kw)
        return torch.tensor([4, 4, 0, 0] + [2, 3, 0, 0] + [0], dtype=torch.int32)  # 2 requests, split, no swizzle

    case = C([(1, 900), (1, 50)])
    inputs = make_inputs(case)
    call = fa3_vllm_plan(case, inputs, scheduler)
    assert fa3_vllm_decided(case, inputs, dict(call.kwargs), scheduler) == {"fa3_num_splits": 3, "fa3_pack_gqa": True}
    assert len(calls) == 1 and calls[0]["num_splits"] == 0 and calls[0]["page_size"] is None
    passed = {**call.kwargs, "scheduler_metadata": torch.tensor([4, 4, 0, 0, 0], dtype=torch.int32)}
    assert fa3_vllm_decided(case, inputs, passed, scheduler) == {"fa3_num_splits": 1, "fa3_pack_gqa": True}
    assert len(calls) == 1  # read what the call passes; no second plan


# ------------------------------------------------------------------------------------------------------ FlashMLA
def test_flashmla_summary_reads_the_running_split_count():
    assert flashmla_sched_summary(132, [0, 1, 3, 4]) == {
        "flashmla_sm_parts": 132,
        "flashmla_max_splits": 2,
        "flashmla_splits": 4,
    }
    for bad in ([1, 2], [0, 0, 1], [0]):
        with pytest.raises(ValueError, match="no running split count"):
            flashmla_sched_summary(132, bad)


def test_flashmla_decided_needs_a_filled_schedule():
    meta = types.SimpleNamespace(tile_scheduler_metadata=torch.zeros(66, 8), num_splits=torch.tensor([0, 2, 3]))
    assert flashmla_decided(meta) == {"flashmla_sm_parts": 66, "flashmla_max_splits": 2, "flashmla_splits": 3}
    with pytest.raises(ValueError, match="not filled"):
        flashmla_decided(types.SimpleNamespace(tile_scheduler_metadata=None, num_splits=None))


def test_adapters_wire_the_read_back_into_the_variant(monkeypatch):
    """``prepare`` of fa3-vllm and flashmla (on CPU, with the fakes standing in for the kernels) puts the read-back in
    the variant: the fork's metadata summary, FlashMLA's filled schedule; a fake that fills nothing reads as unread."""
    from fake_vllm import make_fake_flashmla, make_fake_vllm_fa3

    import attnfast.fa3_vllm as fa3_vllm_mod
    import attnfast.flashmla as flashmla_mod

    fork = make_fake_vllm_fa3()
    fork.get_scheduler_metadata = lambda *a, **kw: torch.tensor([4, 4, 0, 0] + [2, 3, 0, 0] + [0], dtype=torch.int32)
    monkeypatch.setattr(fa3_vllm_mod, "import_vllm_fa3", lambda: fork)
    case = C([(1, 900), (1, 50)], num_heads=8, num_kv_heads=2, head_dim=64)
    fn = FA3VllmBackend().prepare(case, make_inputs(case))
    fn()
    assert fn.variant["fa3_num_splits"] == 3 and fn.variant["fa3_pack_gqa"] is True

    mla = make_fake_flashmla()
    monkeypatch.setattr(flashmla_mod, "import_flashmla", lambda: mla)
    mla_case = fa_case([(1, 300), (1, 70)], num_heads=16, causal=True, **MLA)
    fn = FlashMLABackend().prepare(mla_case, make_inputs(mla_case))
    fn()
    assert fn.variant["decided"].startswith("unread: ValueError: FlashMLA's scheduler metadata is not filled")
    meta = fn.call.kwargs["tile_scheduler_metadata"]
    meta.tile_scheduler_metadata, meta.num_splits = torch.zeros(132, 8), torch.tensor([0, 2, 3])  # as the kernel does
    assert {k: v for k, v in fn.variant.items() if k.startswith("flashmla")} == {
        "flashmla_sm_parts": 132,
        "flashmla_max_splits": 2,
        "flashmla_splits": 3,
    }


# ------------------------------------------------------------------------------------------- the variant's read
def test_variant_adds_what_the_kernel_decided_and_records_a_failed_read():
    call = KernelCall("m.f", {"num_splits": 0}, finish=lambda x: x, variant={"a": 1}, decided=lambda: {"n": 2})
    assert PreparedKernel(lambda **kw: None, call).variant == {"entry": "m.f", "num_splits": 0, "a": 1, "n": 2}

    def broken():
        raise RuntimeError("scheduler metadata\nsecond line")

    failed = PreparedKernel(lambda **kw: None, dataclasses.replace(call, decided=broken)).variant
    assert failed == {"entry": "m.f", "num_splits": 0, "a": 1, "decided": "unread: RuntimeError: scheduler metadata"}


# ------------------------------------------------------------------------------------------- GPU: the kernels
def _with(fn: PreparedKernel, **kwargs) -> PreparedKernel:
    return PreparedKernel(fn._fn, dataclasses.replace(fn.call, kwargs={**fn.call.kwargs, **kwargs}))


def _bits(result) -> tuple[torch.Tensor, torch.Tensor]:
    return result[0], result[1]


def _same_bits(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(_bits(a), _bits(b)))


FA2_GPU = {  # kvcache calls: the adapter passes num_splits=0 (FA2's heuristic)
    "gqa_decode": C([(1, 4096)]),
    "gqa_decode_b8": C([(1, 4096)] * 8),
    "gqa_decode_b64": C([(1, 1024)] * 64),
    "mha_decode_d64": C([(1, 1000)], num_heads=16, num_kv_heads=16, head_dim=64),
    "window_decode": C([(1, 4096)], window=(16, None)),
    "wide_window_decode": C([(1, 4096)], window=(5000, None)),
    "alibi_decode": C([(1, 4096)], alibi=True, causal=True),
    "paged_decode": C([(1, 3000), (1, 200)], kv_layout="NHD", block_size=256),
    "spec_decode": C([(4, 2000), (4, 3000)], causal=True),
    "append_decode": C([(1, 2000), (1, 3000)], append=True, causal=True),
}


@pytest.fixture(scope="module")
def fa2_gpu():
    return available_or_skip(FA2Backend())


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(FA2_GPU))
def test_gpu_fa2_runs_the_recorded_split_count(fa2_gpu, name):
    """The heuristic's call (num_splits=0) and the call pinned to the recorded count give the same bits (out and
    fp32 LSE); pinned to one split instead, the LSE bits differ when the record says it split (the test can fail)."""
    case = FA2_GPU[name]
    fn = fa2_gpu.prepare(case, make_inputs(case, seed=0, device="cuda"))
    n = fn.variant["fa2_num_splits"]
    heuristic = fn.kernel()
    assert _same_bits(heuristic, _with(fn, num_splits=n).kernel()), f"{name}: FA2 did not run {n} splits"
    # a split changes the LSE bits only when at least two splits see keys: a 16-key window over 4,096 keys leaves
    # all but the last split empty, and the combine then returns the one split's LSE (H100, 2026-11-26: equal bits)
    left = case.window[0]
    keys_in_more_than_one_split = left is None or left > max(case.kv_lens) // max(n, 1)
    if n > 1 and keys_in_more_than_one_split:
        assert not torch.equal(heuristic[1], _with(fn, num_splits=1).kernel()[1]), f"{name}: one split, same LSE bits"


def _sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


FORK_GPU = {
    "gqa_decode_long": C([(1, 16384), (1, 100)]),
    "gqa_decode_paged": C([(1, 8000), (1, 300), (1, 20)], kv_layout="NHD", block_size=16),
    "mha_decode": C([(1, 8000)], num_heads=16, num_kv_heads=16),
    "causal_prefill": C([(300, 300), (1000, 1000)], causal=True),
    "window_prefill": C([(300, 2000)], window=(64, 0)),
    "sched_meta": C([(1, 16384), (1, 100)], scheduler_metadata=True),
    "pinned_1": C([(1, 16384), (1, 100)], num_splits=1),
}


@pytest.fixture(scope="module")
def fork_gpu():
    return available_or_skip(FA3VllmBackend())


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(FORK_GPU))
def test_gpu_fork_metadata_is_the_plan_the_kernel_runs(fork_gpu, name):
    """The recorded summary reads; the metadata it reads, passed to the call, gives the call's own bits; a recorded
    split shows in the LSE bits against one split."""
    case = FORK_GPU[name]
    inputs = make_inputs(case, seed=0, device="cuda")
    fn = fork_gpu.prepare(case, inputs)
    own = fn.kernel()
    variant = fn.variant
    assert "decided" not in variant, variant
    if not case.scheduler_metadata:
        lens = torch.tensor(case.kv_lens, dtype=torch.int32, device="cuda")
        meta = fa3_scheduler_metadata(
            case, inputs, import_vllm_fa3().get_scheduler_metadata, lens, case.num_splits or 0
        )
        assert _same_bits(own, _with(fn, scheduler_metadata=meta).kernel()), f"{name}: another plan than the probe's"
    if case.num_splits == 1:
        assert variant["fa3_num_splits"] == 1
    if variant["fa3_num_splits"] > 1:  # one split, planned afresh (metadata planned for splits has another size)
        one = _with(fn, num_splits=1, scheduler_metadata=None).kernel()
        assert not torch.equal(own[1], one[1]), f"{name}: one split, same LSE bits"
    if name == "gqa_decode_long":
        assert variant["fa3_num_splits"] > 1, variant  # one long request on a nearly idle GPU splits


@pytest.fixture(scope="module")
def mla_gpu():
    return available_or_skip(FlashMLABackend())


@pytest.mark.gpu
@pytest.mark.parametrize("heads, q_len", [(16, 1), (128, 1), (16, 4)])
def test_gpu_flashmla_records_its_schedule(mla_gpu, heads, q_len):
    case = fa_case([(q_len, 5000), (q_len, 300), (q_len, 1)], num_heads=heads, causal=True, **MLA)
    res = check_backend(prepare_context(case, 0, "cuda"), mla_gpu)
    variant = res.extra["variant"]
    assert res.status == Status.PASS and "decided" not in variant, (res.reason, variant)
    parts = max(_sms() // 1 // -(-(q_len * heads) // 64), 1)  # dense_decode.h: SMs / h_k / ceil(s_q * h_q / h_k, 64)
    assert variant["flashmla_sm_parts"] == parts
    assert variant["flashmla_splits"] >= case.batch and variant["flashmla_max_splits"] >= 1


@pytest.mark.gpu
def test_gpu_records_carry_the_decisions(fa2_gpu, fork_gpu):
    """Through the harness's verdict: the record's variant names the split count."""
    case = C([(1, 4096), (1, 300)])
    for backend, key in ((fa2_gpu, "fa2_num_splits"), (fork_gpu, "fa3_num_splits")):
        res = check_backend(prepare_context(case, 0, "cuda"), backend)
        assert res.status == Status.PASS and key in res.extra["variant"], (backend.name, res.reason, res.extra)


@pytest.mark.gpu
def test_gpu_upstream_fa3_kvcache_split_count_is_the_reproduced_bound():
    """Upstream FA3's kvcache entry returns its split accumulators: their leading dim is ``params.num_splits``."""
    backend = available_or_skip(FA3Backend())
    case = C([(1, 8000), (1, 100)], kv_layout="NHD", block_size=64)
    fn = backend.prepare(case, make_inputs(case, seed=0, device="cuda"))
    result = fn.kernel()
    splits = fn.variant["fa3_max_splits"]
    accum = result[2] if len(result) > 2 else None
    assert (accum.shape[0] if accum is not None and accum.numel() else 1) == splits
