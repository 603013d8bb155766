"""Seed ``001``'s metadata side: the functions of the seed and of vLLM's attention utilities that the runner and
the builder call, and the fork's :class:`FlashAttentionMetadataBuilder` (written from the seed's ``build``).

* :func:`use_cascade_attention`: the seed's heuristic (>= 256 prefix tokens, >= 8 requests, no ALiBi / window /
  local attention / DCP, then FlashDecoding's performance model with ``num_sms`` = :data:`NUM_SMS`);
* :func:`reorder_batch`: the decode -> extend -> prefill order ``reorder_batch_to_split_decodes_and_prefills``
  leaves (only misplaced requests move); :func:`split_decodes_and_prefills` of a batch ordered decodes first;
* :class:`CommonAttentionMetadata` (what the runner hands the builder), :class:`FlashAttentionMetadata` with its
  prefill and decode halves, :func:`get_dcp_local_seq_lens` (the tokens a DCP rank holds);
* :class:`FlashAttentionMetadataBuilder`: ``validate`` (bad metadata raises ``ValueError`` naming the field) and
  ``build`` (the split, the prefill metadata rebased at the first prefill, the decode metadata, the cascade tensors,
  the DCP local context lengths).

The runner side that fills these in (block tables, slot mapping, the common prefix) is
:mod:`conformance.engines.vllm_v1.runner`; the forwards that read them, :mod:`conformance.engines.vllm_v1.fa` and,
for the DCP fields, :mod:`conformance.engines.vllm_v1.dcp`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from conformance.cases.paged_kv import cu_seqlens

__all__ = [
    "NUM_SMS",
    "CommonAttentionMetadata",
    "DecodeMetadata",
    "FlashAttentionMetadata",
    "FlashAttentionMetadataBuilder",
    "PrefillMetadata",
    "cdiv",
    "get_dcp_local_seq_lens",
    "reorder_batch",
    "split_decodes_and_prefills",
    "use_cascade_attention",
]

#: SMs of an H100 / H200 (the heuristic's ``num_sms``).
NUM_SMS = 132


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


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
    """The seed's ``FlashAttentionMetadataBuilder.build`` (its AOT scheduling and CUDA-graph part:
    :class:`~conformance.engines.vllm_v1.graph_builder.V1GraphBuilder`)."""

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
            # The seed's bound on any rank's local context, ceil(L / (N * I)) * I of the longest sequence (no
            # GPU->CPU sync for the real maximum): the context call's max_seqlen_k (dcp.context_kv_lens checks it).
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
