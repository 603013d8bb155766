"""What a flash-attention-family kernel decides on its own for a call: its split-KV count and GQA packing.

These facts go into the record's ``extra["variant"]`` (:attr:`attnfast._fa_common.PreparedKernel.variant`) beside the
entry point and the arguments that select a variant, so the report groups records by them and ``attnconf compare``
lists the pairs whose split count changed.  Two ways, by what each kernel lets a caller see:

* read back from what the kernel computed (one host read after the call, outside the timed region): vLLM's FA3 fork
  (the ``get_scheduler_metadata`` tensor, :func:`fa3_vllm_metadata_summary`) and FlashMLA (the ``FlashMLASchedMeta``
  its first call fills, :func:`flashmla_sched_summary`);
* reproduced from the kernel's host code, pure Python, for kernels that return no such thing: FA2's split count
  (flash-attn 2.8.3, :func:`fa2_split_decision`) and upstream FA3's split bound and pack_gqa (flash-attention's
  ``hopper/``, FA3 3.0.0, :func:`fa3_decision`).

Every function here is a pure function of shapes and integers (no kernel import), so it is tested on CPU with values
worked out from the source (``tests/attnfast/test_decisions.py``); the GPU tests check each against the kernel.  The
source lines each reproduces are cited in its docstring; ``docs/concepts/backends.md`` says what each adapter records.

Size: one concept, what a kernel decides for a call, reproduced from each family's host code beside the summaries
read back from the kernels that report it; the fork's tile rules sit beside upstream's they differ from.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

from conformance.cases.case import AttentionCase

from ._fa_common import fa2_window

__all__ = [
    "FA2_SOURCE",
    "FA3_SOURCE",
    "FA3_VLLM_SOURCE",
    "FA3_VLLM_TILES_SOURCE",
    "FLASHMLA_SOURCE",
    "fa2_num_splits_heuristic",
    "fa2_split_decision",
    "fa3_decision",
    "fa3_num_splits_heuristic",
    "fa3_should_pack_gqa",
    "fa3_tile_size_sm90",
    "fa3_vllm_call_mask",
    "fa3_vllm_fwd_tile",
    "fa3_vllm_head_swizzle",
    "fa3_vllm_metadata_summary",
    "fa3_vllm_tile_size_sm90",
    "flashmla_sched_summary",
]

#: The sources reproduced or read, at the commit each function cites.
FA2_SOURCE = "Dao-AILab/flash-attention v2.8.3 (060c9188) csrc/flash_attn/flash_api.cpp"
FA3_SOURCE = "Dao-AILab/flash-attention e2743ab5 (FA3 3.0.0, unchanged to 0251105a) hopper/"
FA3_VLLM_SOURCE = "vllm-project/flash-attention 5824e6e2..45812f7f hopper/flash_api.cpp, flash_prepare_scheduler.cu"
FLASHMLA_SOURCE = "deepseek-ai/FlashMLA 9241ae3 csrc/api/dense_decode.h, get_decoding_sched_meta.cu"

_F32 = struct.Struct("<f")


def _f32(x: float) -> float:
    """``x`` rounded to the nearest float32 (C++ ``float`` arithmetic: each +, *, / of float32 operands computed in
    double and rounded once is the correctly rounded float32 result)."""
    return _F32.unpack(_F32.pack(x))[0]


def _i32(x: int) -> int:
    """``x`` wrapped to a signed 32-bit ``int`` (C++ ``int`` arithmetic)."""
    return (x + 2**31) % 2**32 - 2**31


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, m: int) -> int:
    return _ceil_div(a, m) * m


# ------------------------------------------------------------------------------------------------------------ FA2
def fa2_num_splits_heuristic(batch_nheads_mblocks: int, num_sms: int, num_n_blocks: int, max_splits: int) -> int:
    """``num_splits_heuristic`` of flash-attn 2.8.3 (:data:`FA2_SOURCE` lines 257-297), in float32 as there: 1 when
    the blocks almost fill the SMs (``>= 0.8 * num_SMs``); else, of the split counts up to ``min(max_splits, num_SMs,
    num_n_blocks)`` that change the blocks per split, the smallest whose wave efficiency ``n_waves / ceil(n_waves)``
    is at least 85% of the best.  ``num_sms`` is what the caller passes as ``num_SMs`` (FA2 passes twice the SM
    count)."""
    if _f32(float(batch_nheads_mblocks)) >= _f32(_f32(0.8) * num_sms):
        return 1
    max_splits = min(max_splits, num_sms, num_n_blocks)

    def eligible(s: int) -> bool:
        return s == 1 or _ceil_div(num_n_blocks, s) != _ceil_div(num_n_blocks, s - 1)

    efficiency: list[float] = []
    best = 0.0
    for s in range(1, max_splits + 1):
        if not eligible(s):
            efficiency.append(0.0)
            continue
        n_waves = _f32(_f32(float(batch_nheads_mblocks * s)) / num_sms)
        eff = _f32(n_waves / math.ceil(n_waves))
        best = max(best, eff)
        efficiency.append(eff)
    for s in range(1, max_splits + 1):
        if eligible(s) and efficiency[s - 1] >= 0.85 * best:
            return s
    return 1


def fa2_split_decision(case: AttentionCase, kvcache: bool, seqlen_k: int, num_sms: int) -> dict[str, Any]:
    """What flash-attn 2.8.3 decides about split-KV for the adapter's call of ``case`` (the call the kernel sees:
    equal head dims), on a GPU of ``num_sms`` SMs: ``fa2_num_splits`` (the split count it runs: the case's pinned
    ``num_splits``, else its heuristic) and ``fa2_splitkv`` (whether it launches its split-KV kernel).  Empty for a
    call that never reaches ``set_params_splitkv`` nor the split kernel (varlen prefill) or runs no kernel (no key).

    ``kvcache``: the call goes to ``flash_attn_with_kvcache`` (``mha_fwd_kvcache``), whose ``seqlen_k`` is the cache
    width (a contiguous cache's length, or the block table's reach); else ``flash_attn_varlen_func``
    (``mha_varlen_fwd``), whose ``seqlen_k`` is ``max_seqlen_k``.  Reproduced from :data:`FA2_SOURCE`:

    * both entry points turn causal off for one query row without ALiBi, then causal sets the right window to 0
      (lines 585-586, 1273-1274); one query row of a GQA call without window or ALiBi (a head dim that is a multiple
      of 8 for kvcache; varlen's Python wrapper pads it) runs as ``ngroups`` query rows of ``hk`` heads (lines 592,
      1278);
    * ``set_params_splitkv`` (lines 299-330): block_n 256/128/64 for head dims up to 64/128/256 (rounded up to 8),
      ``num_m_blocks = ceil(seqlen_q / 64)``; ``num_splits < 1`` takes :func:`fa2_num_splits_heuristic` with
      ``num_SMs = 2 * SMs`` and at most 128 splits;
    * varlen calls it for the swapped one-row GQA call only (lines 699-706, the split count stays 0, one split, on
      other calls) and forces the split kernel for a paged cache (line 739); kvcache always calls it (line 1441) and
      forces the split kernel for an append or a paged cache (line 1457); with more than one split the split kernel
      runs (``run_mha_fwd``, line 247).
    """
    window_left, window_right = fa2_window(case)
    causal, alibi = case.causal, case.alibi
    h, hk, d = case.num_heads, case.num_kv_heads, case.head_dim
    if kvcache:
        seqlen_q = max(case.q_lens)  # the adapter routes one common q_len here
        pinned = case.num_splits or 0
        forced = case.append or case.paged
        multiple_of_8 = d % 8 == 0
    else:
        if max(case.kv_lens) == 0:  # "If seqlen_k == 0 ... set the output to 0": no kernel runs
            return {}
        seqlen_q, pinned, forced, multiple_of_8 = max(case.q_lens), 0, case.paged, True
    if seqlen_q == 1 and not alibi:
        causal = False
    if causal:
        window_right = 0
    swapped = seqlen_q == 1 and h > hk and window_left < 0 and window_right < 0 and multiple_of_8 and not alibi
    if swapped:
        seqlen_q, h = h // hk, hk
    if not kvcache and not swapped:
        return {"fa2_num_splits": 1, "fa2_splitkv": True} if forced else {}
    head_size = _round_up(d, 8)
    block_n = 256 if head_size <= 64 else 128 if head_size <= 128 else 64
    num_n_blocks = _ceil_div(seqlen_k, block_n)
    num_m_blocks = _ceil_div(seqlen_q, 64)
    if pinned >= 1:
        splits = pinned
    else:
        splits = fa2_num_splits_heuristic(case.batch * h * num_m_blocks, num_sms * 2, num_n_blocks, 128)
    return {"fa2_num_splits": splits, "fa2_splitkv": splits > 1 or forced}


# ------------------------------------------------------------------------------------------------------------ FA3
def fa3_should_pack_gqa(varlen_q: bool, seqlen_q: int, qhead_per_khead: int, block_m: int) -> bool:
    """``should_pack_gqa`` of ``hopper/heuristics.h`` (:data:`FA3_SOURCE`, lines 9-17; the same file in vLLM's fork):
    always for varlen queries, else when padding the query rows to ``block_m`` wastes more than packing the group
    does (``nopack < 0.9 * pack`` efficiency, float32)."""
    if varlen_q:
        return True
    nopack = _f32(_f32(float(seqlen_q)) / _f32(float(_round_up(seqlen_q, block_m))))
    rows = seqlen_q * qhead_per_khead
    pack = _f32(_f32(float(rows)) / _f32(float(_round_up(rows, block_m))))
    return nopack < 0.9 * pack


def fa3_num_splits_heuristic(
    total_mblocks: int,
    num_sms: int,
    num_n_blocks: int,
    num_m_blocks: int,
    size_one_kv_head: int,
    is_causal_or_local: bool,
    max_splits: int,
) -> int:
    """``num_splits_heuristic`` of ``hopper/heuristics.h`` (:data:`FA3_SOURCE`, lines 19-58; the same file in vLLM's
    fork), in float32 as there: with the SMs almost filled (``>= 0.8 * num_SMs``), split only a non-causal call whose
    one KV head is over the 50 MB L2 and whose query blocks cover the SMs twice; never split 4 key blocks or fewer;
    else the smallest split count whose wave efficiency is at least 85% of the best (no eligibility filter, unlike
    FA2)."""
    if _f32(float(total_mblocks)) >= _f32(_f32(0.8) * num_sms):
        size_l2 = 50 * 1024 * 1024
        if size_one_kv_head > size_l2 and num_m_blocks >= num_sms * 2 and not is_causal_or_local:
            return min(_ceil_div(size_one_kv_head, size_l2), max_splits)
        return 1
    if num_n_blocks <= 4:
        return 1
    max_splits = min(max_splits, num_sms, num_n_blocks)
    efficiency: list[float] = []
    best = 0.0
    for s in range(1, max_splits + 1):
        n_waves = _f32(_f32(float(total_mblocks * s)) / num_sms)
        eff = _f32(n_waves / math.ceil(n_waves))
        best = max(best, eff)
        efficiency.append(eff)
    for s in range(1, max_splits + 1):
        if efficiency[s - 1] >= 0.85 * best:
            return s
    return 1


def fa3_tile_size_sm90(
    headdim: int,
    headdim_v: int,
    is_causal: bool,
    is_local: bool,
    element_size: int = 2,
    v_colmajor: bool = False,
    paged_kv_non_tma: bool = False,
    softcap: bool = False,
) -> tuple[int, int]:
    """``(kBlockM, kBlockN)`` of ``tile_size_fwd_sm90`` in upstream ``hopper/tile_size.h`` (:data:`FA3_SOURCE`, lines
    9-53; vLLM's fork has other tiles, which is why its adapter reads the kernel's metadata instead).  ``headdim`` and
    ``headdim_v`` are the rounded head dims the kernel templates on."""
    if element_size == 2:
        if headdim <= 64:
            if headdim_v == 512:
                return 64, 64
            if headdim_v == 256:
                return 128, 96
            return 192, 128 if (is_causal or is_local or paged_kv_non_tma) else 192
        if headdim <= 96:
            return 192, 128 if (is_local or paged_kv_non_tma) else 144
        if headdim <= 128:
            return 128, 128 if (is_causal or is_local or paged_kv_non_tma) else 176
        if headdim <= 192:
            return 128, 96 if (paged_kv_non_tma or is_local) else (128 if headdim_v <= 128 else 112)
        return 128, 64 if is_local else 80
    if headdim <= 64:
        return 192, 160
    if headdim <= 96:
        return 192, 128
    if headdim <= 128:
        return 128, 160 if paged_kv_non_tma else (192 if (v_colmajor or (softcap and is_local)) else 224)
    if headdim <= 192:
        return 128, 128 if ((paged_kv_non_tma or softcap) and is_local) else 160
    return 128, 64 if is_local else 128


def _fa3_round_up_headdim(d: int) -> int:
    """``round_up_headdim`` (upstream ``flash_api.cpp`` lines 492-509, every head dim built)."""
    return next(r for r in (64, 96, 128, 192, 256) if d <= r) if d <= 256 else 256


def _fa3_round_up_headdimv(dv: int) -> int:
    """``round_up_headdimv`` (upstream ``flash_api.cpp`` lines 511-518)."""
    return next((r for r in (64, 96, 128, 192, 256) if dv <= r), 512)


def fa3_decision(case: AttentionCase, kvcache: bool, seqlen_k: int, num_sms: int, element_size: int = 2) -> dict:
    """What upstream FA3 (3.0.0, :data:`FA3_SOURCE`) decides on the host for the adapter's call of ``case`` on an
    sm_90 GPU of ``num_sms`` SMs: ``fa3_max_splits`` (``params.num_splits``: the case's pinned count, else
    ``get_num_splits``; with varlen queries, as every adapter call has, it is the bound the device-side
    ``prepare_varlen_num_blocks`` splits each request up to) and ``fa3_pack_gqa`` (``get_pack_gqa``).

    ``kvcache``: ``flash_attn_with_kvcache``, whose ``seqlen_k`` is the cache width (no ``max_seqlen_k`` is passed:
    ``mha_fwd`` line 768 takes the contiguous cache's length or the block table's reach); else
    ``flash_attn_varlen_func`` with ``max_seqlen_k``.  Reproduced from ``mha_fwd`` (lines 796-804: a window side past
    the sequence becomes unbounded, one query row without window or chunk is not causal unless hdim in (64, 128] and
    paged, causal sets the right side to 0), ``set_params_fprop`` (lines 148-159: causal/local, unbounded sides filled
    with ``seqlen - 1``, clipped to the chunk), ``get_pagedkv_tma`` (415-424), ``get_pack_gqa`` (426-440) and
    ``get_num_splits`` (442-470, ``total_mblocks`` counted as one request since varlen sets
    ``num_splits_dynamic_ptr``), with :func:`fa3_tile_size_sm90`, :func:`fa3_num_splits_heuristic` and
    :func:`fa3_should_pack_gqa`."""
    seqlen_q = max(case.q_lens)
    h, hk, d, dv = case.num_heads, case.num_kv_heads, case.head_dim, case.dv
    paged, append = kvcache and case.paged, kvcache and case.append
    left, right = fa2_window(case)
    chunk = case.chunk or 0
    causal = case.causal
    if left >= seqlen_k - 1:
        left = -1
    if right >= seqlen_q - 1:
        right = -1
    if seqlen_q == 1 and left == -1 and right == -1 and chunk == 0 and (d <= 64 or d > 128 or not paged):
        causal = False
    if causal:
        right = 0
    is_causal = left < 0 and right == 0 and chunk == 0
    is_local = (left >= 0 or right >= 0 or chunk >= 1) and not is_causal
    if left < 0:
        left = seqlen_k - 1
    if right < 0:
        right = seqlen_q - 1
    if chunk > 0:
        left, right = min(left, chunk - 1), min(right, chunk - 1)
    d_r = _fa3_round_up_headdim(d)
    dv_r = d_r if dv == d else _fa3_round_up_headdimv(dv)
    softcap = bool(case.softcap)
    tma = False
    if paged and not append:
        block_m, block_n = fa3_tile_size_sm90(d_r, dv_r, is_causal, is_local, element_size, False, False, softcap)
        tma = (case.block_size or 1) % block_n == 0 and seqlen_q * (h // hk) > block_m
    non_tma = paged and not tma
    if case.num_splits:
        splits = case.num_splits
    else:
        block_m, block_n = fa3_tile_size_sm90(d_r, dv_r, is_causal, is_local, element_size, False, non_tma, softcap)
        loaded = seqlen_k if not is_local else max(0, min(seqlen_k, right + left + 1 + block_m))
        num_n_blocks = _ceil_div(loaded, block_n)
        num_m_blocks = _ceil_div(seqlen_q * (h // hk), block_m)
        size_one_kv_head = _i32(seqlen_k * (d + dv) * element_size)
        total_mblocks = 1 * hk * num_m_blocks  # varlen: num_splits_dynamic_ptr is set, "pretending that batch = 1"
        splits = fa3_num_splits_heuristic(
            total_mblocks, num_sms, num_n_blocks, num_m_blocks, size_one_kv_head, is_causal or is_local, 128
        )
    if non_tma or splits > 1:
        pack = True
    elif h == hk:
        pack = False
    else:
        block_m, _ = fa3_tile_size_sm90(d_r, dv_r, is_causal, is_local, element_size, False, non_tma, softcap)
        pack = fa3_should_pack_gqa(True, seqlen_q, h // hk, block_m)  # cu_seqlens_q: varlen queries
    return {"fa3_max_splits": splits, "fa3_pack_gqa": pack}


# ------------------------------------------------------------------------------------------------ vLLM's FA3 fork
#: the fork's commit whose tiles and window normalisation :func:`fa3_vllm_tile_size_sm90` and
#: :func:`fa3_vllm_call_mask` reproduce: vLLM 0.24.0's ``GIT_TAG`` (``cmake/external_projects/vllm_flash_attn.cmake``);
#: ``hopper/tile_size.h``, ``heuristics.h`` and the forward mainloop are unchanged from there to 45812f7f
FA3_VLLM_TILES_SOURCE = "vllm-project/flash-attention 803020a8 hopper/tile_size.h, heuristics.h, flash_api.cpp"


def fa3_vllm_call_mask(case: AttentionCase) -> tuple[bool, bool, int, int]:
    """``(is_causal, is_local, window_left, window_right)`` as the fork sets them for the call the adapter makes for
    ``case`` (``flash_attn_varlen_func`` with ``max_seqlen_q/k`` of the case): ``mha_fwd``
    (:data:`FA3_VLLM_TILES_SOURCE` lines 839-851: a side reaching past the sequence becomes unbounded, one query row
    without a window is not causal unless the head dim is in (64, 128] and the keys paged, causal sets the right side
    to 0) and ``set_params_fprop`` (lines 165-174: an unbounded side beside a bounded one is filled with
    ``max_seqlen - 1``)."""
    seqlen_q, seqlen_k = max(case.q_lens), max(case.kv_lens)
    left, right = fa2_window(case)
    causal = case.causal
    if left >= seqlen_k - 1:
        left = -1
    if right >= seqlen_q - 1:
        right = -1
    if seqlen_q == 1 and left == -1 and right == -1 and (case.head_dim <= 64 or case.head_dim > 128 or not case.paged):
        causal = False
    if causal:
        right = 0
    is_causal = left < 0 and right == 0
    is_local = (left >= 0 or right >= 0) and not is_causal
    if left < 0 and right >= 0:
        left = seqlen_k - 1
    if left >= 0 and right < 0:
        right = seqlen_q - 1
    return is_causal, is_local, left, right


def fa3_vllm_head_swizzle(case: AttentionCase) -> bool:
    """Whether the fork's ``get_scheduler_metadata`` gives the metadata its ``num_nheads_in_l2`` vector
    (``head_swizzle = is_causal || is_local``, :data:`FA3_VLLM_SOURCE` at 45812f7f lines 608-620 and 667), for the
    call the adapter makes for ``case`` (``max_seqlen_q/k`` of the case, ``page_size`` when paged)."""
    is_causal, is_local, _, _ = fa3_vllm_call_mask(case)
    return is_causal or is_local


def fa3_vllm_tile_size_sm90(
    headdim: int,
    headdim_v: int,
    is_causal: bool,
    is_local: bool,
    element_size: int = 2,
    paged_kv_non_tma: bool = False,
    softcap: bool = False,
    use_one_mma_wg: bool = False,
) -> tuple[int, int, bool, bool]:
    """``(kBlockM, kBlockN, MmaPV_is_RS, IntraWGOverlap)`` of the fork's ``tile_size_fwd_sm90``
    (:data:`FA3_VLLM_TILES_SOURCE`, ``hopper/tile_size.h`` lines 10-90; not upstream's, :func:`fa3_tile_size_sm90`):
    head dim 64 windows get 192 x 160 without intra-warpgroup overlap, a one-MMA-warpgroup call 64-row tiles, fp8
    the two-level-accumulation tiles (``FLASHATTENTION_DISABLE_FP8_TWO_LEVEL_ACCUMULATION`` is set only by the
    fork's ``setup.py``, not by the CMake build vLLM ships).  ``headdim``/``headdim_v`` are the rounded dims;
    ``v_colmajor`` is never set by the forward call; ``softcap`` only mattered without two-level accumulation."""
    del softcap  # an argument of the fork's function that its compiled branch does not read
    if element_size == 2:
        if headdim <= 64:
            if headdim_v == 512:
                return 64, 64, False, False
            if headdim_v == 256:
                return 128, 96, True, False
            if use_one_mma_wg:
                return 64, 192, True, True
            return (
                192,
                128 if is_causal else (160 if (is_local or paged_kv_non_tma) else 192),
                is_causal or is_local,
                not is_local,
            )
        if headdim <= 96:
            return 192, 128 if (is_local or paged_kv_non_tma) else 144, False, True
        if headdim <= 128:
            block_m = 64 if use_one_mma_wg else 128
            narrow = is_causal or is_local or paged_kv_non_tma
            return block_m, 128 if narrow else (176 if use_one_mma_wg else 160), True, True
        if headdim <= 192:
            return 128, 96 if (paged_kv_non_tma or is_local) else (128 if headdim_v <= 128 else 96), True, True
        return 128, 64 if is_local else 80, True, True
    if use_one_mma_wg:
        return 64, 128 if headdim <= 96 else 96, True, True
    if headdim <= 64:
        return 192, 128, True, True
    if headdim <= 96:
        return 128, 128, True, True
    if headdim <= 128:
        return 128, 192, True, True
    if headdim <= 192:
        return 128, 96, True, True
    return 128, 64 if is_local else 128, True, not paged_kv_non_tma


def fa3_vllm_fwd_tile(case: AttentionCase) -> tuple[int, int, bool]:
    """``(kBlockM, kBlockN, IntraWGOverlap)`` of the fork's sm_90 forward kernel for the adapter's call of ``case``
    (the kernel call: ``v_padded`` cases call with V padded to ``head_dim``): the mask of :func:`fa3_vllm_call_mask`;
    ``use_one_mma_wg`` (``heuristics.h`` lines 10-14, and the launch template's ``kHeadDimV == kHeadDim``: head dim
    64 or 128 exactly, no window, ``max_seqlen_q`` x GQA group <= 64); paged keys through the TMA pager only without
    a window, pages a multiple of the key tile and more packed query rows than a query tile (``get_pagedkv_tma``,
    ``flash_api.cpp`` lines 434-444); rounded dims as ``mha_fwd`` rounds them (lines 930-931)."""
    call = case.padded_v_call()
    is_causal, is_local, _, _ = fa3_vllm_call_mask(call)
    d_r = _fa3_round_up_headdim(call.head_dim)
    dv_r = d_r if call.dv == call.head_dim else _fa3_round_up_headdimv(call.dv)
    element = 1 if call.quant == "fp8_e4m3" else 2
    rows = max(call.q_lens) * (call.num_heads // call.num_kv_heads)
    one_wg = call.head_dim in (64, 128) and not is_local and rows <= 64 and d_r == dv_r
    softcap = bool(call.softcap)
    non_tma = False
    if call.paged:
        block_m, block_n, _, _ = fa3_vllm_tile_size_sm90(
            d_r, dv_r, is_causal, is_local, element, False, softcap, one_wg
        )
        tma = not is_local and (call.block_size or 1) % block_n == 0 and rows > block_m
        non_tma = not tma
    block_m, block_n, _, overlap = fa3_vllm_tile_size_sm90(
        d_r, dv_r, is_causal, is_local, element, non_tma, softcap, one_wg
    )
    return block_m, block_n, overlap


def fa3_vllm_metadata_summary(
    values: Sequence[int], q_lens: Sequence[int], group: int, head_swizzle: bool
) -> dict[str, Any]:
    """What the scheduler metadata of vLLM's FA3 fork (``get_scheduler_metadata``'s int32 tensor, as a list) says the
    kernel runs: ``fa3_num_splits``, the most splits any request gets, and ``fa3_pack_gqa`` when the metadata shows it.

    The layout (:data:`FA3_VLLM_SOURCE`: ``mha_fwd_get_scheduler_metadata``, 45812f7f lines 661-690, the same from
    5824e6e2 on; vLLM 0.24.0's ``_vllm_fa3_C`` was built from that range: its ``prepare_varlen_num_blocks_kernel``
    takes the five metadata pointers that 5824e6e2 introduced, and its ``fwd`` has no ``batch_invariant`` argument,
    which 0f2287f7 added): with ``b_r = round_up(batch, 4)``, ``prepare_seqlen_q`` (``b_r``), ``num_splits_dynamic``
    (``b_r``, only when the kernel splits: ``num_splits > 1`` and at most 992 requests), ``num_nheads_in_l2`` (``b_r``,
    only with ``head_swizzle``: :func:`fa3_vllm_head_swizzle`; ``varlen_batch_idx`` is never there: sorting is off),
    then one semaphore entry.  ``prepare_varlen_num_blocks`` writes ``prepare_seqlen_q[i] = q_len[i] * (pack_gqa ?
    group : 1)`` and the request's split count (``flash_prepare_scheduler.cu`` lines 161, 203-204); a split
    kernel always packs GQA (``pack_gqa |= num_splits > 1``, line 645).  A list of another layout raises
    ``ValueError`` (another fork version: read it again before trusting it)."""
    batch = len(q_lens)
    b_r = _round_up(batch, 4)
    vectors, semaphore = divmod(len(values), b_r)
    split_vector = vectors - 1 - int(head_swizzle)
    if batch < 1 or semaphore > 1 or split_vector not in (0, 1):
        raise ValueError(
            f"scheduler metadata of {len(values)} entries for {batch} requests (head_swizzle={head_swizzle}) is not "
            "the layout of vLLM's FA3 fork at 5824e6e2..45812f7f"
        )
    splits = list(values[b_r : b_r + batch]) if split_vector else [1]
    if not all(1 <= s <= 256 for s in splits):
        raise ValueError(f"scheduler metadata split counts {splits} outside 1..256")
    out: dict[str, Any] = {"fa3_num_splits": max(splits)}
    if split_vector:
        out["fa3_pack_gqa"] = True
    elif group > 1:
        packed = set()
        for q_len, rows in zip(q_lens, values[:batch]):
            if q_len > 0:
                if rows not in (q_len, q_len * group):
                    raise ValueError(f"prepare_seqlen_q {rows} for a request of {q_len} queries, group {group}")
                packed.add(rows == q_len * group)
        if len(packed) == 1:
            out["fa3_pack_gqa"] = packed.pop()
    return out


# ------------------------------------------------------------------------------------------------------- FlashMLA
def flashmla_sched_summary(sm_parts: int, cum_splits: Sequence[int]) -> dict[str, Any]:
    """What FlashMLA's dense-decode scheduler decided (:data:`FLASHMLA_SOURCE`; vLLM 0.24.0's
    ``flash_mla_interface.py`` is that interface with an ``out`` argument added): ``flashmla_sm_parts`` (the rows of
    ``tile_scheduler_metadata``: ``max(SMs / h_k / ceil(s_q * h_q / h_k / 64), 1)`` work parts, ``dense_decode.h``
    line 72), and from ``num_splits`` (``batch + 1`` entries, the running total of each request's split count:
    ``get_mla_metadata_kernel`` writes ``num_splits[0] = 0``, ``num_splits[i + 1] = num_splits[i] + splits(i)``)
    ``flashmla_max_splits`` (the most splits of one request) and ``flashmla_splits`` (their sum).  A list that is no
    such running total raises ``ValueError``."""
    cum = list(cum_splits)
    per = [b - a for a, b in zip(cum, cum[1:])]
    if len(cum) < 2 or cum[0] != 0 or any(p < 1 for p in per) or sm_parts < 1:
        raise ValueError(f"FlashMLA num_splits {cum[:8]}... with {sm_parts} SM parts is no running split count")
    return {"flashmla_sm_parts": sm_parts, "flashmla_max_splits": max(per), "flashmla_splits": cum[-1]}
