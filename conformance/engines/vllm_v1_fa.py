"""Seed ``001``: vLLM V1's FlashAttention backend in a vendor fork (``FlashAttentionImpl``, ixformer kernels).

The replay rebuilds one decoder attention step of the fork from its metadata builder on, and judges the layer
output against plain attention of every new token over all its keys (the case's window and sinks; with a shared
prompt, see *cascade*).  What it follows in the seed, and what it checks:

* **Runner side** (vLLM's model runner, not in the seed but what the builder relies on): requests arrive in the
  caller's (scheduler's) order and are *reordered* decode -> extend -> prefill (``reorder_batch_threshold`` 1, or
  ``1 + num_speculative_tokens`` through ``_init_reorder_batch_threshold(1, supports_spec_as_decode=True)``): the
  requests in the wrong region are moved by region, as vLLM's ``reorder_batch_to_split_decodes_and_prefills``
  swaps them.  In vLLM the whole model step then runs in the new order (the persistent batch is permuted before
  the input ids are built); the replay permutes the step's tokens in and the layer output back, so the output is
  compared in the caller's token order (:meth:`VllmV1FlashAttention._restore`).  Blocks are handed out by a
  block manager (shuffled ids; a shared prompt occupies the *same* physical blocks in every sharer's table, as
  prefix caching does; manager blocks larger than the kernel's are split into kernel blocks, vLLM's
  ``kernel_block_size`` mapping), the slot mapping is ``table[pos // bs] * bs + pos % bs``, and the cached
  context is in the cache before the step (written by earlier steps with the same write).
* **Cache layout**: ``get_kv_cache_shape`` / ``get_kv_cache_stride_order``: the cache is allocated in the
  physical order ``shape[order]`` and the kernel sees the logical view ``raw.permute(inverse(order))``
  (:func:`allocate_kv_cache`).  The fork's shape is ``(2, num_blocks, num_kv_heads, block_size, head_size)``
  (HND) with the identity order for both ``NHD`` and ``HND`` settings, and ``(3, ...)`` for int8 type 2.  The
  case's ``kv_layout`` is the logical view the calls see: ``HND`` is the fork's own shape; ``NHD`` replays the
  upstream shape ``(2, num_blocks, block_size, num_kv_heads, head_size)`` the fork departs from (its builder and
  non-int8 forward run on it unchanged).  ``Scenario.physical`` allocates the memory in the other order: an NHD
  view over HND memory (upstream's HND stride order ``(0, 1, 3, 2, 4)``) or an HND view over per-block NHD memory
  (the fork's cross-layer HND order ``(2, 4, 0, 1, 3, 5)`` on ``(num_layers, 2, nb, hk, bs, d)``, 2 layers).
  Block sizes: any multiple of 16 (``get_kv_cache_shape`` raises otherwise); kernel sizes 16/32/64
  (``get_supported_kernel_block_sizes``), a 128-token manager block is split into two 64-token kernel blocks.
* **Builder** (:class:`FlashAttentionMetadataBuilder`, written from the seed's ``build``):
  ``split_decodes_and_prefills``, the prefill metadata (``query_start_loc`` / ``key_start_loc`` rebased at the
  first prefill, ``block_table[num_decodes:]``), the decode metadata, the cascade tensors (``cu_prefix_query_lens =
  [0, num_tokens]``, ``prefix_kv_lens``, ``suffix_kv_lens = seq_lens - common_prefix_len``) and the DCP local
  context lengths.  Bad metadata raises ``ValueError`` naming the field.
* **Forward** (``FlashAttentionImpl.forward``): the cache write (``reshape_and_cache_flash``; int8:
  ``reshape_and_cache_flash_int8`` / ``_mix`` of the already quantized K with its per-(token, head) scale), then
  either two calls, prefill (``flash_attn_varlen_func`` over the paged cache, causal, window, sinks) and decode
  (``flash_attn_with_kvcache``, causal, window, sinks) into the two halves of the output, or **cascade**
  (``cascade_attention``: all tokens against the shared prefix as one sequence, no mask, ``block_table[:1]``; each
  request against its suffix ``block_table[:, prefix // bs:]``, causal; merged by LSE with
  :func:`~conformance.engines.merge.merge_attn_states`), or **DCP** (:mod:`conformance.engines.vllm_v1_dcp`).
  Encoder attention (``_forward_encoder_attention``): one bidirectional varlen call on q/k/v, no cache, no sinks.
* **Cascade decision**: the runner's common prefix (leading block-table blocks shared by every request, capped by
  the smallest ``num_computed_tokens``, rounded down to the block size) and the seed's
  :func:`use_cascade_attention` heuristic (>= 256 tokens, >= 8 requests, no ALiBi / window / local attention /
  DCP, then FlashDecoding's performance model with ``num_sms`` = 132, an H100/H200).  Scenarios where it chooses
  cascade and where each rule declines.  The shared prompt is real: every sharer's first ``shared_prefix`` keys are
  the first sharer's (:meth:`VllmV1FlashAttention.layer_inputs`, used by the reference too).
* **int8** (``VLLM_ATTN_OPT_LEVEL`` 1 and 2): q and k quantized per (token, head) (the case's stored tensors:
  ``scaled_int8_quant_for_attn(x, 2)``), type 1 V quantized here with the static per-channel scale
  (``scaled_int8_quant_for_attn(value, 0, scale=value_scale_cache)``), type 2 V kept in the activation dtype in the
  last two int8 slabs of the cache viewed as 16-bit; the K scale cache ``(num_blocks, hk, block_size)``.  The
  calls (``flash_attn_varlen_int8_func``, ``vllm_paged_attention_int8`` / ``_mix``) are described with the
  case's quant fields so the CPU adapters dequantize what the engine stored; GPU adapters refuse them (vLLM
  ships no int8 kernel).  In a decode-only step the fork fuses the cache write into the decode kernel
  (``save_key``/``save_value``/``save_key_scale``); the replay writes the same values just before the call.

Not replayed (see :meth:`VllmV1FlashAttention.check`): fp8 caches (the fork's prefill/decode calls pass no
descales), ALiBi (the fork's ``sqrt_alibi`` variant), chunked local attention; cascade with int8 or DCP with int8
(the fork's cascade/DCP paths read ``key_cache``, which the int8 branches never bind); DCP with sinks, windows or
ALiBi (the DCP calls drop sinks and apply windows and ALiBi to rank-local positions).  Sinks with cascade replay
the fork as written: ``cascade_attention`` takes ``s_aux`` and passes it to neither call, so the sinks are lost
(:attr:`VllmV1FlashAttention.cascade_sinks_on_prefix` = True replays upstream vLLM, which gives it to the prefix
call); no scenario lists that combination, a test shows the finding.  Not modelled: the fork's prefill calls pass
``max_seqlen_k = max_query_len`` (shorter than a prefix-cached prefill's keys; the adapters take the exact
lengths, so whether the vendor kernel bounds its key loop by it cannot be seen here), and its cascade reads the
block size as ``key_cache.shape[-2]`` (right for its HND view; the replay reads it by layout).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from attnfast.base import KernelOutput
from attnref import AttnResult, gather_kv, quantize, write_kv_cache
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from conformance.cases.quant_inputs import QuantTensors

from .base import Call, Engine, Kernel, Request, call_inputs
from .calls import STALE, PagedKV, call_case, contiguous_call, cu_seqlens, paged_call
from .merge import merge_attn_states

__all__ = [
    "CommonAttentionMetadata",
    "FlashAttentionMetadata",
    "FlashAttentionMetadataBuilder",
    "KVCache",
    "SCENARIOS",
    "Scenario",
    "VllmV1FlashAttention",
    "allocate_kv_cache",
    "get_kv_cache_shape",
    "get_kv_cache_stride_order",
    "kernel_block_size",
    "reorder_batch",
    "split_decodes_and_prefills",
    "use_cascade_attention",
]

#: SMs of an H100 / H200 (the heuristic's ``num_sms``).
NUM_SMS = 132
#: ``get_supported_kernel_block_sizes``.
KERNEL_BLOCK_SIZES = (16, 32, 64)
#: Layers of the cross-layer cache (``include_num_layers_dimension``); the replay's layer is the last.
NUM_LAYERS = 2


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------------------------- scenarios
@dataclass(frozen=True)
class Scenario:
    """One engine step: ``requests`` in the caller's order and what the case cannot say.

    ``layer`` are the ``AttentionCase`` fields of the scenario's case; ``shared_prefix`` tokens of the prompt are
    shared (same tokens, same physical blocks) by every request except ``non_sharers``; ``spec_tokens`` raises the
    decode threshold; ``physical`` allocates the cache memory in the other order than the view; ``manager_block``
    is the block manager's block size when it differs from the kernel's (``case.block_size``); ``dcp`` and
    ``interleave`` are the DCP world size and ``cp_kv_cache_interleave_size``; ``cascade`` is what the heuristic
    decides (asserted by the tests).
    """

    requests: tuple[Request, ...]
    layer: dict[str, Any] = field(default_factory=dict)
    shared_prefix: int = 0
    non_sharers: tuple[int, ...] = ()
    spec_tokens: int = 0
    physical: bool = False
    manager_block: int | None = None
    dcp: int = 1
    interleave: int = 1
    encoder: bool = False
    cascade: bool = False

    def sharers(self) -> list[int]:
        if not self.shared_prefix:
            return []
        return [b for b in range(len(self.requests)) if b not in self.non_sharers]


def _r(*pairs: tuple[int, int]) -> tuple[Request, ...]:
    """Requests from ``(new, cached)`` pairs."""
    return tuple(Request(new=n, cached=c) for n, c in pairs)


def _layer(layout: str | None, block: int | None, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = dict(num_heads=8, num_kv_heads=2, head_dim=64, dtype="bf16", causal=True)
    if layout is not None:
        base.update(kv_layout=layout, block_size=block)
    return base | kw


#: decodes after prefills in the caller's order: the reorder moves them.
_MIXED = _r((40, 0), (1, 69), (24, 50), (1, 32), (17, 0))
_SHARED8 = _r((1, 599), (30, 520), (1, 529), (64, 512), (1, 514), (16, 700), (1, 512), (8, 540))
_DCP = dict(num_heads=12, num_kv_heads=1, head_dim=64)

SCENARIOS: dict[str, Scenario] = {
    # ---- decode + prefill split, layouts, block sizes, sinks, windows, spec decode
    "mixed_nhd_bs16": Scenario(_MIXED, _layer("NHD", 16)),
    "mixed_hnd_bs32": Scenario(_MIXED, _layer("HND", 32, num_kv_heads=8, head_dim=128, dtype="fp16")),
    "mixed_hnd_bs64_sinks": Scenario(_MIXED, _layer("HND", 64, sinks=True)),
    "decode_only_sinks": Scenario(
        _r((1, 299), (1, 0), (1, 64), (1, 15), (1, 127), (1, 1)), _layer("HND", 16, num_heads=16, sinks=True)
    ),
    "prefill_extend_nhd_bs32": Scenario(_r((33, 0), (20, 80), (64, 0)), _layer("NHD", 32, num_kv_heads=4)),
    "spec_decode": Scenario(_r((6, 0), (3, 87), (1, 39), (2, 15), (5, 50), (3, 0)), _layer("HND", 16), spec_tokens=2),
    "window_nhd": Scenario(_MIXED, _layer("NHD", 16, window=(47, 0))),
    "layout_nhd_over_hnd": Scenario(_MIXED, _layer("NHD", 16), physical=True),
    "layout_hnd_cross_layer": Scenario(_MIXED, _layer("HND", 32, dtype="fp16"), physical=True),
    "block_128_kernel_64": Scenario(_MIXED, _layer("HND", 64), manager_block=128),
    "encoder_only": Scenario(_r((37, 0), (64, 0), (5, 0)), _layer(None, None, causal=False), encoder=True),
    # ---- cascade: chosen, and declined by each rule of the heuristic
    "cascade_mixed": Scenario(_SHARED8, _layer("HND", 16), shared_prefix=512, cascade=True),
    "cascade_capped": Scenario(
        _r((1, 599), (260, 300), (1, 529), (20, 512), (1, 514), (16, 600), (1, 512), (8, 540)),
        _layer("NHD", 32, dtype="fp16"),
        shared_prefix=512,
        cascade=True,
    ),
    "cascade_decodes": Scenario(
        tuple(Request(new=1, cached=256 + 7 * (i % 4)) for i in range(20)),
        _layer("HND", 16, num_heads=16, num_kv_heads=8),
        shared_prefix=256,
        cascade=True,
    ),
    "cascade_declined_decodes": Scenario(
        tuple(Request(new=1, cached=256 + 7 * (i % 4)) for i in range(8)),
        _layer("HND", 16, num_heads=16, num_kv_heads=8),
        shared_prefix=256,
    ),
    "cascade_declined_short": Scenario(_SHARED8, _layer("HND", 16), shared_prefix=250),
    "cascade_declined_not_all": Scenario(_SHARED8, _layer("HND", 16), shared_prefix=512, non_sharers=(3,)),
    "cascade_declined_few": Scenario(_SHARED8[:7], _layer("HND", 16), shared_prefix=512),
    "cascade_declined_window": Scenario(_SHARED8, _layer("NHD", 16, window=(127, 0)), shared_prefix=512),
    # ---- decode context parallel (one kv head per rank: DCP runs on replicated kv heads)
    "dcp2_decode": Scenario(_r((1, 99), (1, 36), (1, 0), (1, 249)), _layer("HND", 16, **_DCP), dcp=2),
    "dcp3_mixed": Scenario(
        _r((20, 0), (1, 89), (12, 48), (1, 6)), _layer("NHD", 16, dtype="fp16", **_DCP), dcp=3, interleave=4
    ),
    "dcp4_interleave16": Scenario(_r((1, 299), (8, 132), (1, 32)), _layer("HND", 16, **_DCP), dcp=4, interleave=16),
    # ---- int8 (the fork's VLLM_ATTN_OPT_LEVEL 1 and 2)
    "int8_t1_mixed": Scenario(
        _r((30, 0), (1, 59), (16, 32), (1, 19)), _layer("HND", 16, dtype="fp16", quant="int8_t1")
    ),
    "int8_t2_mixed": Scenario(_r((1, 44), (25, 0), (1, 99), (9, 61)), _layer("HND", 32, quant="int8_t2")),
    "int8_t1_decode": Scenario(_r((1, 79), (1, 129), (1, 11)), _layer("HND", 64, dtype="fp16", quant="int8_t1")),
}


# ---------------------------------------------------------------------------------------------- the seed's functions
def use_cascade_attention(
    common_prefix_len: int,
    query_lens: Sequence[int],
    num_query_heads: int,
    num_kv_heads: int,
    use_alibi: bool,
    use_sliding_window: bool,
    use_local_attention: bool,
    num_sms: int,
    dcp_world_size: int,
) -> bool:
    """The seed's heuristic: is cascade attention supported here and (by a rough performance model) faster?"""
    if common_prefix_len < 256:  # too short a prefix to pay off
        return False
    if use_alibi or use_sliding_window or use_local_attention:  # cascade has no such variants
        return False
    num_reqs = len(query_lens)
    if num_reqs < 8 or dcp_world_size > 1:  # too few queries; no cascade under DCP
        return False
    group = num_query_heads // num_kv_heads
    flash_decoding = group > 1 and all(int(q) == 1 for q in query_lens)
    if not flash_decoding:  # plain attention reads the prefix once per request: cascade saves bandwidth
        return True
    # FlashDecoding splits the keys over more CTAs; compare waves with 128-wide query and key tiles.
    prefix_tiles = cdiv(common_prefix_len, 128)
    cascade_time = cdiv(num_query_heads * cdiv(num_reqs, 128), num_sms) * prefix_tiles
    flash_decoding_time = cdiv(num_reqs * num_kv_heads * cdiv(group, 128) * prefix_tiles, num_sms)
    return cascade_time < flash_decoding_time


def reorder_batch(q_lens: Sequence[int], computed: Sequence[int], threshold: int) -> list[int]:
    """Decode -> extend -> prefill order as the runner's swaps leave it: ``order[i]`` = caller index now at ``i``.

    Decodes have ``q_len <= threshold``; extends computed tokens already; prefills none.  Only requests outside their
    region move: the misplaced ones, sorted by region (stable), fill the misplaced positions in order.
    """
    regions = [0 if q <= threshold else (1 if c > 0 else 2) for q, c in zip(q_lens, computed)]
    counts = [regions.count(r) for r in range(3)]
    target = [0] * counts[0] + [1] * counts[1] + [2] * counts[2]
    misplaced = [i for i, (r, t) in enumerate(zip(regions, target)) if r != t]
    order = list(range(len(regions)))
    for dst, src in zip(misplaced, sorted(misplaced, key=lambda i: regions[i])):
        order[dst] = src
    return order


def split_decodes_and_prefills(query_start_loc: Sequence[int], threshold: int) -> tuple[int, int, int, int]:
    """``(num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens)`` of a batch ordered decodes first."""
    lens = [b - a for a, b in zip(query_start_loc[:-1], query_start_loc[1:])]
    n, total = len(lens), int(query_start_loc[-1])
    first_prefill = next((i for i, q in enumerate(lens) if q > threshold), n)
    if any(q <= threshold for q in lens[first_prefill:]):
        raise ValueError(f"query_start_loc: decodes (query length <= {threshold}) must come first, got lengths {lens}")
    ndt = int(query_start_loc[first_prefill])
    return first_prefill, n - first_prefill, ndt, total - ndt


def kernel_block_size(manager_block: int, supported: Sequence[int] = KERNEL_BLOCK_SIZES) -> int:
    """The kernel block size for a manager block: itself if supported, else the largest supported divisor."""
    if manager_block in supported:
        return manager_block
    fits = [s for s in supported if manager_block % s == 0]
    if not fits:
        raise ValueError(f"block_size {manager_block} has no kernel block size among {list(supported)} dividing it")
    return max(fits)


def get_kv_cache_shape(
    num_blocks: int, block_size: int, num_kv_heads: int, head_size: int, layout: str, slabs: int = 2
):
    """The fork's ``(slabs, nb, hk, bs, d)`` for ``HND``; upstream's ``(2, nb, bs, hk, d)`` for ``NHD``."""
    if block_size % 16 != 0:
        raise ValueError(
            f"block_size must be a multiple of 16 ('Block size must be a multiple of 16.'), got {block_size}"
        )
    if layout == "HND":
        return (slabs, num_blocks, num_kv_heads, block_size, head_size)
    return (slabs, num_blocks, block_size, num_kv_heads, head_size)


def get_kv_cache_stride_order(layout: str, physical: bool) -> tuple[int, ...]:
    """Permutation from the logical shape to the memory order (``physical``: memory in the other order)."""
    if not physical:
        return (0, 1, 2, 3, 4)  # the fork: identity for NHD and HND
    if layout == "NHD":
        return (0, 1, 3, 2, 4)  # upstream's HND order on its NHD shape
    return (2, 4, 0, 1, 3, 5)  # the fork's cross-layer HND order on (num_layers, 2, nb, hk, bs, d)


@dataclass
class KVCache:
    """One layer's paged cache: the physical buffer, the logical K/V views, int8 scales."""

    raw: torch.Tensor
    order: tuple[int, ...]
    layout: str
    block_size: int
    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None


def allocate_kv_cache(
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_size: int,
    *,
    dtype: torch.dtype,
    layout: str,
    physical: bool = False,
    quant: str = "none",
    device: torch.device | str = "cpu",
) -> KVCache:
    """Allocate ``shape[order]`` (stale values), view it back in the logical order; K = slab 0, V = slab 1.

    int8 type 1: int8 slabs and a K scale cache ``(num_blocks, hk, block_size)``; type 2: three int8 slabs, V the
    last two viewed as ``dtype`` (the fork's ``kv_cache[1:].view(query.dtype).reshape(nb, hk, bs, d)``)."""
    slabs = 3 if quant == "int8_t2" else 2
    shape = get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, layout, slabs)
    order = get_kv_cache_stride_order(layout, physical)
    if len(order) == 6:
        shape = (NUM_LAYERS, *shape)
    store = torch.int8 if quant.startswith("int8") else dtype
    raw = torch.full(tuple(shape[i] for i in order), STALE, dtype=torch.float32, device=device).to(store)
    view = raw.permute([order.index(i) for i in range(len(order))])
    if len(order) == 6:
        view = view[NUM_LAYERS - 1]
    k, v = view[0], view[1]
    k_scale = v_scale = None
    if quant.startswith("int8"):
        if layout != "HND" or physical:
            raise ValueError("kv_layout must be HND in contiguous memory for the int8 caches (the fork's only shape)")
        k_scale = torch.ones(num_blocks, num_kv_heads, block_size, dtype=torch.float32, device=device)
        if quant == "int8_t2":
            v = view[1:].view(dtype).reshape(num_blocks, num_kv_heads, block_size, head_size)
            v.fill_(STALE)
    return KVCache(raw, order, layout, block_size, k, v, k_scale, v_scale)


# ---------------------------------------------------------------------------------------------- metadata
@dataclass
class CommonAttentionMetadata:
    """What the runner hands the builder (vLLM's ``CommonAttentionMetadata``; the fork adds ``key_start_loc``)."""

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table_tensor: torch.Tensor
    slot_mapping: torch.Tensor
    causal: bool = True

    @property
    def num_reqs(self) -> int:
        return int(self.seq_lens.numel())

    @property
    def num_actual_tokens(self) -> int:
        return int(self.query_start_loc[-1]) if self.query_start_loc.numel() else 0

    @property
    def max_query_len(self) -> int:
        q = self.query_start_loc
        return int((q[1:] - q[:-1]).max()) if q.numel() > 1 else 0

    @property
    def max_seq_len(self) -> int:
        return int(self.seq_lens.max()) if self.seq_lens.numel() else 0

    @property
    def key_start_loc(self) -> torch.Tensor:
        return cu_seqlens(self.seq_lens.tolist(), self.seq_lens.device)


@dataclass
class PrefillMetadata:
    block_table: torch.Tensor
    query_start_loc: torch.Tensor
    key_start_loc: torch.Tensor
    max_query_len: int


@dataclass
class DecodeMetadata:
    block_table: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    max_query_len: int
    max_decode_seq_len: int


@dataclass
class FlashAttentionMetadata:
    """The fork's ``FlashAttentionMetadata`` (the fields its forward reads)."""

    num_actual_tokens: int
    max_query_len: int
    query_start_loc: torch.Tensor
    key_start_loc: torch.Tensor
    max_seq_len: int
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    use_cascade: bool
    common_prefix_len: int
    cu_prefix_query_lens: torch.Tensor | None = None
    prefix_kv_lens: torch.Tensor | None = None
    suffix_kv_lens: torch.Tensor | None = None
    max_dcp_context_kv_len: int = 0
    dcp_context_kv_lens: torch.Tensor | None = None
    prefill: PrefillMetadata | None = None
    decode: DecodeMetadata | None = None
    causal: bool = True


def get_dcp_local_seq_lens(seq_lens: torch.Tensor, world: int, rank: int, interleave: int) -> torch.Tensor:
    """Tokens of each sequence that rank ``rank`` holds when token ``t`` lives on ``(t // interleave) % world``."""
    s = seq_lens.to(torch.int32)
    base = s // interleave // world * interleave
    rest = (s - base * world - rank * interleave).clamp(0, interleave)
    return base + rest


class FlashAttentionMetadataBuilder:
    """The seed's ``FlashAttentionMetadataBuilder.build`` (AOT scheduling and CUDA graphs left out)."""

    def __init__(
        self,
        *,
        block_size: int,
        reorder_batch_threshold: int = 1,
        dcp_world_size: int = 1,
        dcp_rank: int = 0,
        cp_kv_cache_interleave_size: int = 1,
    ) -> None:
        self.block_size = block_size
        self.reorder_batch_threshold = reorder_batch_threshold
        self.dcp_world_size = dcp_world_size
        self.dcp_rank = dcp_rank
        self.interleave = cp_kv_cache_interleave_size

    def validate(self, common_prefix_len: int, common: CommonAttentionMetadata) -> None:
        """``ValueError`` naming the field when the runner's metadata is inconsistent."""
        qsl = [int(x) for x in common.query_start_loc.tolist()]
        seq = [int(x) for x in common.seq_lens.tolist()]
        n = len(seq)
        if len(qsl) != n + 1 or (qsl and qsl[0] != 0) or any(b < a for a, b in zip(qsl, qsl[1:])):
            raise ValueError(
                f"query_start_loc must be non-decreasing from 0 with num_reqs + 1 = {n + 1} entries, got {qsl}"
            )
        for b in range(n):
            ql = qsl[b + 1] - qsl[b]
            if seq[b] < ql:
                raise ValueError(
                    f"seq_lens[{b}] = {seq[b]} is shorter than its query length {ql} from query_start_loc "
                    "(a sequence length counts the context and the new tokens)"
                )
        table = common.block_table_tensor
        if table.dim() != 2 or table.shape[0] != n:
            raise ValueError(
                f"block_table_tensor must have shape (num_reqs = {n}, max_blocks), got {tuple(table.shape)}"
            )
        per_block = self.block_size * self.dcp_world_size  # DCP: a virtual block spans every rank
        for b in range(n):
            if cdiv(seq[b], per_block) > table.shape[1]:
                raise ValueError(
                    f"block_table_tensor has {table.shape[1]} blocks per row; seq_lens[{b}] = {seq[b]} needs "
                    f"{cdiv(seq[b], per_block)} blocks of {per_block} tokens"
                )
        if common.slot_mapping.numel() != common.num_actual_tokens:
            raise ValueError(
                f"slot_mapping must hold one slot per token ({common.num_actual_tokens}), "
                f"got {common.slot_mapping.numel()}"
            )
        if common_prefix_len % self.block_size or common_prefix_len > min(seq, default=0):
            raise ValueError(
                f"common_prefix_len ({common_prefix_len}) must be a multiple of block_size ({self.block_size}) "
                f"within every sequence (shortest {min(seq, default=0)})"
            )

    def build(self, common_prefix_len: int, common: CommonAttentionMetadata) -> FlashAttentionMetadata:
        self.validate(common_prefix_len, common)
        qsl, seq, table = common.query_start_loc, common.seq_lens, common.block_table_tensor
        dev = qsl.device
        nd, npf, ndt, _ = split_decodes_and_prefills([int(x) for x in qsl.tolist()], self.reorder_batch_threshold)
        meta = FlashAttentionMetadata(
            num_actual_tokens=common.num_actual_tokens,
            max_query_len=common.max_query_len,
            query_start_loc=qsl,
            key_start_loc=common.key_start_loc,
            max_seq_len=common.max_seq_len,
            seq_lens=seq,
            block_table=table,
            slot_mapping=common.slot_mapping,
            num_decodes=nd,
            num_decode_tokens=ndt,
            num_prefills=npf,
            use_cascade=common_prefix_len > 0,
            common_prefix_len=common_prefix_len,
            causal=common.causal,
        )
        if self.dcp_world_size > 1:
            context = seq - (qsl[1:] - qsl[:-1])
            meta.dcp_context_kv_lens = get_dcp_local_seq_lens(
                context, self.dcp_world_size, self.dcp_rank, self.interleave
            )
            parts = self.dcp_world_size * self.interleave
            meta.max_dcp_context_kv_len = cdiv(common.max_seq_len, parts) * self.interleave
        elif meta.use_cascade:
            meta.cu_prefix_query_lens = torch.tensor([0, common.num_actual_tokens], dtype=torch.int32, device=dev)
            meta.prefix_kv_lens = torch.tensor([common_prefix_len], dtype=torch.int32, device=dev)
            meta.suffix_kv_lens = seq - common_prefix_len
        if npf:
            meta.prefill = PrefillMetadata(
                table[nd:], qsl[nd:] - qsl[nd], meta.key_start_loc[nd:] - meta.key_start_loc[nd], common.max_query_len
            )
        if nd:
            dq = qsl[: nd + 1]
            meta.decode = DecodeMetadata(table[:nd], dq, seq[:nd], int((dq[1:] - dq[:-1]).max()), int(seq[:nd].max()))
        return meta


# ---------------------------------------------------------------------------------------------- the step
@dataclass
class Step:
    """The runner's view of one step, tensors aside (shared by ``plan`` and ``forward``)."""

    order: list[int]  # order[i]: the caller's index of the request now at position i
    q_lens: list[int]  # reordered
    kv_lens: list[int]
    cached: list[int]
    threshold: int
    num_decodes: int
    num_decode_tokens: int
    table: list[list[int]]  # kernel block ids per reordered request (padded with the spare block)
    num_blocks: int  # kernel blocks in the cache
    block_size: int  # kernel block size
    common_prefix_len: int  # 0: no cascade
    dcp: int
    interleave: int
    token_index: list[int] = field(default_factory=list)  # reordered token -> caller token


class VllmV1FlashAttention(Engine):
    """Seed 001 replayed (see the module docstring)."""

    name = "vllm_v1_fa"
    seed = "001"
    description = "vLLM V1 FlashAttention (vendor fork): reorder, decode/prefill, cascade, DCP, layouts, int8"

    #: ``num_sms`` of the heuristic.
    num_sms: ClassVar[int] = NUM_SMS
    #: False: the fork (``s_aux`` reaches neither cascade call); True: upstream vLLM (the prefix call takes it).
    cascade_sinks_on_prefix: ClassVar[bool] = False

    # ------------------------------------------------------------------ cases and checks
    def cases(self) -> list[AttentionCase]:
        return [
            AttentionCase(
                requests=tuple((r.new, r.kv) for r in sc.requests), engine=self.name, scenario=name, **sc.layer
            )
            for name, sc in SCENARIOS.items()
        ]

    def scenario(self, case: AttentionCase) -> Scenario:
        if case.scenario not in SCENARIOS:
            raise ValueError(
                f"scenario must be one of {sorted(SCENARIOS)} for engine {self.name}, got {case.scenario!r}"
            )
        return SCENARIOS[case.scenario]

    def check(self, case: AttentionCase) -> None:
        sc = self.scenario(case)
        want = tuple((r.new, r.kv) for r in sc.requests)
        if case.requests != want:
            raise ValueError(f"requests must be scenario {case.scenario!r}'s {list(want)}, got {list(case.requests)}")
        problems = []
        if sc.encoder:
            if case.causal or case.paged:
                problems.append("encoder attention is bidirectional (causal=False) over contiguous q/k/v")
            if case.sinks or case.quant != "none":
                problems.append("the fork's encoder call passes no sinks and takes no quantized inputs")
        else:
            if not case.causal or not case.paged:
                problems.append("the fork's decoder calls are causal (hard-coded causal=True) over a paged cache")
            if case.paged and case.block_size % 16:
                problems.append(f"block_size must be a multiple of 16 (get_kv_cache_shape), got {case.block_size}")
        if case.dv != case.head_dim or case.qv or case.v_padded or case.append or case.num_splits is not None:
            problems.append("K and V share one cache tensor (head_dim_v == head_dim); no qv, V padding, append, splits")
        if case.quant_family == "fp8":
            problems.append("fp8: the fork's prefill/decode calls pass no q/k/v descales (scales read as 1)")
        if case.alibi or case.chunk is not None:
            problems.append("ALiBi (the fork's sqrt_alibi variant) and chunked local attention are not replayed")
        if case.quant_family == "int8":
            if sc.shared_prefix or sc.dcp > 1:
                problems.append("int8 with cascade or DCP: the fork's paths read key_cache, unbound for int8")
            if case.kv_layout != "HND" or sc.physical or sc.manager_block:
                problems.append("int8 caches are the fork's contiguous HND (num_blocks, num_kv_heads, block_size, d)")
            if case.sinks:
                problems.append("the fork's int8 kernels take no sinks")
        if sc.dcp > 1:
            if case.num_kv_heads != 1 or case.num_heads % sc.dcp:
                problems.append(
                    "DCP runs on kv heads replicated across the group: one kv head per rank, h % world == 0"
                )
            if case.sinks or case.has_window or case.alibi:
                problems.append("DCP drops sinks and applies windows/ALiBi to rank-local positions")
            if case.block_size % sc.interleave:
                problems.append("cp_kv_cache_interleave_size must divide block_size")
        if sc.manager_block and (
            sc.manager_block % case.block_size or kernel_block_size(sc.manager_block) != case.block_size
        ):
            problems.append(f"block_size must be the kernel block size of manager block {sc.manager_block}")
        for b in sc.sharers():
            if sc.requests[b].kv < sc.shared_prefix:
                problems.append(
                    f"request {b} shares a {sc.shared_prefix}-token prompt but holds {sc.requests[b].kv} keys"
                )
        if problems:
            raise ValueError(f"engine {self.name} scenario {case.scenario}: " + "; ".join(problems))

    # ------------------------------------------------------------------ the shared prompt (reference and forward)
    def layer_inputs(self, case: AttentionCase, inputs: CaseInputs) -> CaseInputs:
        """The case's inputs with the shared prompt made real: every sharer's first ``shared_prefix`` keys and
        values are the first sharer's (the same tokens, hence the same K/V in the shared blocks)."""
        sc = self.scenario(case)
        sharers = sc.sharers()
        if len(sharers) < 2:
            return inputs
        cu = [int(x) for x in inputs.cu_seqlens_k.tolist()]
        p, s0 = sc.shared_prefix, sharers[0]
        k, v = inputs.k.clone(), inputs.v.clone()
        for b in sharers[1:]:
            k[cu[b] : cu[b] + p] = k[cu[s0] : cu[s0] + p]
            v[cu[b] : cu[b] + p] = v[cu[s0] : cu[s0] + p]
        return dataclasses.replace(inputs, k=k, v=v)

    def reference(self, case: AttentionCase, inputs: CaseInputs) -> AttnResult:
        return super().reference(case, self.layer_inputs(case, inputs))

    def baseline(self, case: AttentionCase, inputs: CaseInputs) -> tuple[torch.Tensor, torch.Tensor]:
        return super().baseline(case, self.layer_inputs(case, inputs))

    # ------------------------------------------------------------------ runner: reorder, blocks, cascade decision
    def _num_common_prefix_blocks(self, rows: list[list[int]], owned: list[int]) -> int:
        """Leading manager blocks every request's table holds (the KV manager's blocks referenced by all)."""
        n = 0
        while n < min(owned) and all(r[n] == rows[0][n] for r in rows):
            n += 1
        return n

    def _cascade_prefix_len(self, shared_tokens: int, cached: list[int], block: int) -> int:
        """The runner's cap: at most the fewest computed tokens (no query may see a later prefix key unmasked),
        rounded down to the block size."""
        return min(shared_tokens, min(cached)) // block * block

    def step(self, case: AttentionCase, world: int | None = None) -> Step:
        """Reorder, block tables and the cascade decision of ``case`` (``world`` overrides the DCP size)."""
        self.check(case)
        sc = self.scenario(case)
        world = sc.dcp if world is None else world
        if world > 1 and (case.num_heads % world or case.num_kv_heads != 1 or sc.encoder):
            raise ValueError(f"DCP world {world} needs a decoder layer with one kv head and num_heads % world == 0")
        reqs = sc.requests
        threshold = 1 + sc.spec_tokens
        order = reorder_batch([r.new for r in reqs], [r.cached for r in reqs], threshold)
        bs = case.block_size or 16
        mb = sc.manager_block or bs
        span = mb * world  # DCP: a virtual block holds block_size tokens on every rank
        gen = torch.Generator().manual_seed(int(case.digest(), 16))
        sharers = set(sc.sharers())
        shared = sc.shared_prefix // mb if sharers else 0
        need = [max(1, cdiv(r.kv, span)) for r in reqs]
        own = [n - (shared if b in sharers else 0) for b, n in enumerate(need)]
        total = shared + sum(own) + 1
        perm = torch.randperm(total, generator=gen).tolist()
        cursor, rows = shared, []
        for b in range(len(reqs)):
            rows.append((perm[:shared] if b in sharers else []) + perm[cursor : cursor + own[b]])
            cursor += own[b]
        width = max(need)
        rows = [r + [perm[-1]] * (width - len(r)) for r in rows]
        common = 0
        if not sc.encoder:
            common = self._num_common_prefix_blocks(rows, need) * mb
            if common:
                common = self._cascade_prefix_len(common, [r.cached for r in reqs], mb)
            use = use_cascade_attention(
                common,
                [r.new for r in reqs],
                case.num_heads,
                case.num_kv_heads,
                case.alibi,
                case.has_window,
                case.chunk is not None,
                self.num_sms,
                world,
            )
            common = common if use else 0
        k = mb // bs  # manager block m = kernel blocks m * k .. m * k + k - 1
        table = [[m * k + j for m in rows[i] for j in range(k)] for i in order]
        q_lens = [reqs[i].new for i in order]
        cu_q = cu_seqlens([r.new for r in reqs]).tolist()
        nd = next((i for i, q in enumerate(q_lens) if q > threshold), len(q_lens))
        return Step(
            order=order,
            q_lens=q_lens,
            kv_lens=[reqs[i].kv for i in order],
            cached=[reqs[i].cached for i in order],
            threshold=threshold,
            num_decodes=nd,
            num_decode_tokens=sum(q_lens[:nd]),
            table=table,
            num_blocks=total * k,
            block_size=bs,
            common_prefix_len=common,
            dcp=world,
            interleave=sc.interleave,
            token_index=[t for i in order for t in range(cu_q[i], cu_q[i + 1])],
        )

    def slot(self, step: Step, b: int, pos: int, rank: int = 0) -> int:
        """Slot of token ``pos`` of reordered request ``b`` on ``rank`` (-1: another rank holds it)."""
        bs = step.block_size
        if step.dcp == 1:
            return step.table[b][pos // bs] * bs + pos % bs
        from .vllm_v1_dcp import dcp_slot

        return dcp_slot(self, step, b, pos, rank)

    def _dcp_owner(self, offset: int, world: int, interleave: int) -> int:
        """DCP rank of the token at ``offset`` in its virtual block (vLLM: ``offset // interleave % world``)."""
        return offset // interleave % world

    def common_metadata(self, case: AttentionCase, step: Step, rank: int, device) -> CommonAttentionMetadata:
        slots = [
            self.slot(step, b, p, rank) for b in range(len(step.order)) for p in range(step.cached[b], step.kv_lens[b])
        ]
        return CommonAttentionMetadata(
            query_start_loc=cu_seqlens(step.q_lens, device),
            seq_lens=torch.tensor(step.kv_lens, dtype=torch.int32, device=device),
            block_table_tensor=torch.tensor(step.table, dtype=torch.int32, device=device),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            causal=case.causal,
        )

    def builder(self, step: Step, rank: int = 0) -> FlashAttentionMetadataBuilder:
        return FlashAttentionMetadataBuilder(
            block_size=step.block_size,
            reorder_batch_threshold=step.threshold,
            dcp_world_size=step.dcp,
            dcp_rank=rank,
            cp_kv_cache_interleave_size=step.interleave,
        )

    # ------------------------------------------------------------------ the cache
    def _quantize_value(self, value: torch.Tensor, v_scale: torch.Tensor) -> torch.Tensor:
        """Type 1 V: ``scaled_int8_quant_for_attn(value, 0, scale=value_scale_cache)`` (static per channel)."""
        return quantize(value, v_scale, "int8")

    def write_cache(self, case: AttentionCase, inputs: CaseInputs, cache: KVCache, rows: list[int], slots: list[int]):
        """``reshape_and_cache_flash`` (int8: ``_int8`` / ``_mix``) of the layer's packed keys ``rows``."""
        if not rows:
            return
        idx = torch.tensor(rows, dtype=torch.long, device=inputs.k.device)
        sm = torch.tensor(slots, dtype=torch.int64, device=inputs.k.device)
        quant = inputs.quant
        if quant is None:
            write_kv_cache(inputs.k[idx], inputs.v[idx], cache.k, cache.v, sm, layout=cache.layout)
            return
        assert cache.k_scale is not None
        if case.quant == "int8_t1":
            assert cache.v_scale is not None
            value = self._quantize_value(inputs.v[idx], cache.v_scale)
        else:
            value = inputs.v[idx].to(case.torch_dtype)
        write_kv_cache(quant.k[idx], value, cache.k, cache.v, sm, layout=cache.layout)
        keep = sm >= 0
        sel, bs = sm[keep], cache.block_size
        cache.k_scale[sel // bs, :, sel % bs] = quant.k_descale[idx][keep].to(cache.k_scale)

    def make_cache(self, case: AttentionCase, inputs: CaseInputs, step: Step, rank: int = 0) -> KVCache:
        """Allocate the layer's cache (``rank``'s under DCP) and write the context earlier steps cached."""
        sc = self.scenario(case)
        cache = allocate_kv_cache(
            step.num_blocks,
            step.block_size,
            case.num_kv_heads,
            case.head_dim,
            dtype=case.torch_dtype,
            layout=case.kv_layout,
            physical=sc.physical,
            quant=case.quant,
            device=inputs.k.device,
        )
        if case.quant == "int8_t1":
            assert inputs.quant is not None
            cache.v_scale = inputs.quant.v_descale  # static, "loaded from a file"
        cu_k = [int(x) for x in inputs.cu_seqlens_k.tolist()]
        rows, slots = [], []
        for b, i in enumerate(step.order):
            for p in range(step.cached[b]):
                rows.append(cu_k[i] + p)
                slots.append(self.slot(step, b, p, rank))
        self.write_cache(case, inputs, cache, rows, slots)
        return cache

    def new_token_rows(self, inputs: CaseInputs, step: Step) -> list[int]:
        """Packed-key rows of the step's new tokens, in the reordered order (the write's token order)."""
        cu_k = [int(x) for x in inputs.cu_seqlens_k.tolist()]
        return [cu_k[i] + p for b, i in enumerate(step.order) for p in range(step.cached[b], step.kv_lens[b])]

    def _kernel_view(self, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """The K and V caches handed to the kernels: the logical views taken at allocation."""
        return cache.k, cache.v

    # ------------------------------------------------------------------ calls
    def calls(self, case: AttentionCase, step: Step) -> list[tuple[str, AttentionCase]]:
        """Every kernel call of the step, ``(label, call case)``, in the order the forward makes them."""
        if self.scenario(case).encoder:
            return [("encoder (bidirectional varlen)", call_case(case, case.requests, causal=False))]
        if step.dcp > 1:
            from .vllm_v1_dcp import dcp_calls

            return dcp_calls(case, step)
        reqs = list(zip(step.q_lens, step.kv_lens))
        if step.common_prefix_len:
            p = step.common_prefix_len
            sinks = case.sinks and self.cascade_sinks_on_prefix
            return [
                (
                    "cascade prefix (all tokens, unmasked)",
                    call_case(case, [(sum(step.q_lens), p)], causal=False, sinks=sinks),
                ),
                ("cascade suffix (causal)", call_case(case, [(q, k - p) for q, k in reqs], sinks=False)),
            ]
        nd = step.num_decodes
        out = []
        if nd < len(reqs):
            out.append(("prefill (varlen, paged)", call_case(case, reqs[nd:])))
        if nd:
            out.append(("decode (paged kvcache)", call_case(case, reqs[:nd])))
        return out

    def plan(self, case: AttentionCase) -> list[tuple[str, AttentionCase]]:
        return self.calls(case, self.step(case))

    def paged(
        self,
        label: str,
        ccase: AttentionCase,
        inputs: CaseInputs,
        q_rows: torch.Tensor,
        cache: KVCache,
        table: torch.Tensor,
        sinks: torch.Tensor | None = None,
    ) -> Call:
        """One call over the paged cache: ``q_rows`` indexes the layer's tokens (reordered) the call computes."""
        k_view, v_view = self._kernel_view(cache)
        quant = inputs.quant
        if quant is None:
            kv = PagedKV(k_view, v_view, table, [], cache.block_size, ccase.kv_layout)
            return paged_call(label, ccase, inputs.q[q_rows], kv, table, sinks=sinks)
        lens, layout, bs = ccase.kv_lens, ccase.kv_layout, cache.block_size
        k_st, _ = gather_kv(k_view, table, lens, layout)
        v_st, _ = gather_kv(v_view, table, lens, layout)
        scales = []
        assert cache.k_scale is not None and quant.q is not None and quant.q_descale is not None
        for b, n in enumerate(lens):
            pos = torch.arange(n, device=table.device)
            blocks = table[b].long()[pos // bs]
            scales.append(cache.k_scale[blocks, :, pos % bs])
        k_scales = torch.cat(scales) if scales else cache.k_scale.new_zeros(0, ccase.num_kv_heads)
        v_deq = v_st.float() if cache.v_scale is None else v_st.float() * cache.v_scale
        qt = QuantTensors(
            "int8",
            k=k_st,
            k_descale=k_scales,
            q=quant.q[q_rows],
            q_descale=quant.q_descale[q_rows],
            v=v_st if cache.v_scale is not None else None,
            v_descale=cache.v_scale,
            k_scale_cache=cache.k_scale,
        )
        dev = q_rows.device
        return Call(
            label,
            ccase,
            call_inputs(
                ccase,
                q=inputs.q[q_rows],
                k=k_st.float() * k_scales[..., None],
                v=v_deq,
                cu_seqlens_q=cu_seqlens(ccase.q_lens, dev),
                cu_seqlens_k=cu_seqlens(lens, dev),
                k_cache=k_view,
                v_cache=v_view,
                block_table=table,
                quant=qt,
            ),
        )

    # ------------------------------------------------------------------ forward
    def forward(self, case: AttentionCase, inputs: CaseInputs, kernel: Kernel) -> KernelOutput:
        inputs = self.layer_inputs(case, inputs)
        step = self.step(case)
        if self.scenario(case).encoder:  # _forward_encoder_attention: q, k, v as given, no cache
            ((label, ccase),) = self.calls(case, step)
            return kernel(contiguous_call(label, ccase, inputs.q, inputs.k, inputs.v))
        if step.dcp > 1:
            from .vllm_v1_dcp import dcp_forward

            out, lse = dcp_forward(self, case, inputs, step, kernel)
        else:
            out, lse = self._forward_step(case, inputs, step, kernel)
        return self._restore(step, out, lse)

    def _forward_step(self, case, inputs, step, kernel) -> tuple[torch.Tensor, torch.Tensor | None]:
        dev = inputs.q.device
        calls = dict(self.calls(case, step))
        cache = self.make_cache(case, inputs, step)
        meta = self.builder(step).build(step.common_prefix_len, self.common_metadata(case, step, 0, dev))
        self.write_cache(case, inputs, cache, self.new_token_rows(inputs, step), meta.slot_mapping.tolist())
        tok = torch.tensor(step.token_index, dtype=torch.long, device=dev)
        if meta.use_cascade:
            return self._cascade(case, inputs, tok, cache, meta, calls, kernel)
        ndt = meta.num_decode_tokens

        def run(label: str, rows: torch.Tensor, table: torch.Tensor) -> KernelOutput:
            return kernel(self.paged(label, calls[label], inputs, rows, cache, table, sinks=inputs.sinks))

        prefill = decode = None
        if meta.prefill is not None:  # flash_attn_varlen_func (int8: flash_attn_varlen_int8_func) -> output[ndt:]
            prefill = run("prefill (varlen, paged)", tok[ndt:], meta.prefill.block_table)
        if meta.decode is not None:  # flash_attn_with_kvcache (int8: vllm_paged_attention_int8 / _mix) -> output[:ndt]
            decode = run("decode (paged kvcache)", tok[:ndt], meta.decode.block_table)
        parts = [p for p in (decode, prefill) if p is not None]
        out = torch.cat([p.out for p in parts])
        lse = None if any(p.lse is None for p in parts) else torch.cat([p.lse for p in parts], dim=1)
        return out, lse

    def _merge(self, prefix_out, prefix_lse, suffix_out, suffix_lse) -> tuple[torch.Tensor, torch.Tensor]:
        """``merge_attn_states`` of the two cascade parts."""
        return merge_attn_states(prefix_out, prefix_lse, suffix_out, suffix_lse)

    def _cascade(self, case, inputs, tok, cache, meta, calls, kernel) -> tuple[torch.Tensor, torch.Tensor]:
        """``cascade_attention``: the shared prefix for all tokens at once, each request's suffix, merged by LSE."""
        k_view, _ = self._kernel_view(cache)
        block_size = k_view.shape[-2] if case.kv_layout == "HND" else k_view.shape[-3]
        if meta.common_prefix_len % block_size:
            raise ValueError(f"common_prefix_len {meta.common_prefix_len} is not a multiple of block_size {block_size}")
        blocks = meta.common_prefix_len // block_size
        label_p, label_s = "cascade prefix (all tokens, unmasked)", "cascade suffix (causal)"
        sinks = inputs.sinks if self.cascade_sinks_on_prefix else None
        prefix = kernel(self.paged(label_p, calls[label_p], inputs, tok, cache, meta.block_table[:1], sinks=sinks))
        suffix = kernel(self.paged(label_s, calls[label_s], inputs, tok, cache, meta.block_table[:, blocks:]))
        if prefix.lse is None or suffix.lse is None:
            raise ValueError("cascade attention needs both parts' LSE; this backend returned none")
        return self._merge(prefix.out, prefix.lse, suffix.out, suffix.lse)

    def _restore(self, step: Step, out: torch.Tensor, lse: torch.Tensor | None) -> KernelOutput:
        """The layer output back in the caller's token order (the replay's inverse of the runner's reorder)."""
        idx = torch.tensor(step.token_index, dtype=torch.long, device=out.device)
        restored = torch.empty_like(out)
        restored[idx] = out
        if lse is None:
            return KernelOutput(restored, None)
        lse_r = torch.empty_like(lse)
        lse_r[:, idx] = lse
        return KernelOutput(restored, lse_r)
