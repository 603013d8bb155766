"""Seed ``001``'s runner side: the cache layout and its allocation, and what vLLM's model runner does for the
builder, as :class:`VllmV1Runner`, the base of :class:`~conformance.engines.vllm_v1.fa.VllmV1FlashAttention`.

* **Cache layout** (the backend's ``get_kv_cache_shape`` / ``get_kv_cache_stride_order``, ``kernel_block_size``):
  :func:`allocate_kv_cache` allocates ``shape[order]`` and views it back in the logical order, as
  :class:`KVCache` (int8: the K scale cache; type 2: V in the last two int8 slabs viewed as the activation dtype).
* **The step** (:meth:`VllmV1Runner.step`, a :class:`Step`): the reorder, the block manager's tables (shuffled
  blocks; a shared prompt in the same physical blocks of every sharer; manager blocks split into kernel blocks),
  the common prefix (leading blocks shared by all, capped by the fewest computed tokens) and the cascade decision
  (:func:`~conformance.engines.vllm_v1.metadata.use_cascade_attention`); the slot mapping (:meth:`~VllmV1Runner.slot`,
  DCP's in :meth:`~VllmV1Runner._dcp_slot`); the builder's inputs (:meth:`~VllmV1Runner.common_metadata`,
  :meth:`~VllmV1Runner.builder`).
* **The cache writes**: ``reshape_and_cache_flash`` (int8: ``_int8`` / ``_mix``) of the cached context before the
  step (:meth:`~VllmV1Runner.make_cache`) and of the step's new tokens (:meth:`~VllmV1Runner.write_cache`).

The methods are the engine's (planted bugs override them one at a time); the engine supplies
:meth:`~VllmV1Runner.scenario` and ``check``.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from attnref import quantize, write_kv_cache
from attnref.paged import as_layout
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

from ..base import Engine
from ..calls import STALE, cu_seqlens
from .metadata import (
    NUM_SMS,
    CommonAttentionMetadata,
    FlashAttentionMetadataBuilder,
    cdiv,
    reorder_batch,
    use_cascade_attention,
)
from .scenarios import Scenario

__all__ = [
    "KERNEL_BLOCK_SIZES",
    "NUM_LAYERS",
    "KVCache",
    "Step",
    "VllmV1Runner",
    "allocate_kv_cache",
    "get_kv_cache_shape",
    "get_kv_cache_stride_order",
    "kernel_block_size",
]

#: ``get_supported_kernel_block_sizes``.
KERNEL_BLOCK_SIZES = (16, 32, 64)
#: Layers of the cross-layer cache (``include_num_layers_dimension``); the replay's layer is the last.
NUM_LAYERS = 2


# ---------------------------------------------------------------------------------------------- the cache layout
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


class VllmV1Runner(Engine):
    """The model runner's side of seed 001 (see the module docstring); the engine subclasses it."""

    #: ``num_sms`` of the heuristic.
    num_sms: ClassVar[int] = NUM_SMS

    @abc.abstractmethod
    def scenario(self, case: AttentionCase) -> Scenario:
        """The :class:`~conformance.engines.vllm_v1.scenarios.Scenario` ``case`` names."""

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
        return self._dcp_slot(step, b, pos, rank)

    def _dcp_slot(self, step: Step, b: int, pos: int, rank: int) -> int:
        """vLLM's DCP slot (``compute_slot_mapping``): a virtual block spans ``block_size * world`` tokens; the
        token at offset ``o`` in it lives on :meth:`_dcp_owner` at local offset ``o // (world * interleave) *
        interleave + o % interleave`` of the rank's block; -1 on every other rank."""
        bs, world, inter = step.block_size, step.dcp, step.interleave
        offset = pos % (bs * world)
        if self._dcp_owner(offset, world, inter) != rank:
            return -1
        local = offset // (world * inter) * inter + offset % inter
        return step.table[b][pos // (bs * world)] * bs + local

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
            write_kv_cache(inputs.k[idx], inputs.v[idx], cache.k, cache.v, sm, layout=as_layout(cache.layout))
            return
        assert cache.k_scale is not None
        if case.quant == "int8_t1":
            assert cache.v_scale is not None
            value = self._quantize_value(inputs.v[idx], cache.v_scale)
        else:
            value = inputs.v[idx].to(case.torch_dtype)
        write_kv_cache(quant.k[idx], value, cache.k, cache.v, sm, layout=as_layout(cache.layout))
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
