"""Seed ``000``'s metadata: what ``DifferentialFlashAttentionMetadataBuilder.build`` hands the impl
(:class:`DiffMetadata`; built by :meth:`~conformance.engines.vllm_diff.attention.VllmDifferentialAttention.metadata`)
and its validation (:func:`validate_metadata`: ``ValueError`` naming the field)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["DiffMetadata", "diffs", "validate_metadata"]


@dataclass
class DiffMetadata:
    """What ``DifferentialFlashAttentionMetadataBuilder.build`` hands the impl (device tensors), plus the block
    manager's per-sequence ``blocks`` and the cache's ``num_blocks``.  ``block_tables`` rows are padded with 0
    (``make_tensor_with_pad``); a prompt without a prefix-cache hit has an empty row."""

    num_prefills: int
    num_prefill_tokens: int
    num_decode_tokens: int
    query_start_loc: torch.Tensor  # int32 (b + 1,)
    seq_start_loc: torch.Tensor  # int32 (b + 1,)
    seq_lens: torch.Tensor  # int32 (b,)
    block_tables: torch.Tensor  # int32 (b, max_blocks)
    slot_mapping: torch.Tensor  # int64 (num_tokens,): the step's new tokens
    prefix_cache_hit: bool
    blocks: list[list[int]]
    num_blocks: int


def diffs(cu: Sequence[int]) -> list[int]:
    """Lengths from start locations: ``[cu[1] - cu[0], cu[2] - cu[1], ...]``."""
    return [int(b) - int(a) for a, b in zip(cu, cu[1:])]


def validate_metadata(meta: DiffMetadata, *, num_tokens: int, block_size: int) -> None:
    """Raise ``ValueError`` naming the field when the metadata cannot describe a step of ``num_tokens`` tokens."""
    qsl = [int(x) for x in meta.query_start_loc.tolist()]
    seq = [int(x) for x in meta.seq_lens.tolist()]
    b, np_ = len(seq), meta.num_prefills
    if len(qsl) != b + 1 or qsl[0] != 0 or any(x > y for x, y in zip(qsl, qsl[1:])) or qsl[-1] != num_tokens:
        raise ValueError(
            f"query_start_loc must be non-decreasing from 0 to the {num_tokens} query tokens with one entry per "
            f"sequence plus one ({b + 1}), got {qsl}"
        )
    qls = diffs(qsl)
    for i, (ql, sl) in enumerate(zip(qls, seq)):
        if sl < ql:
            raise ValueError(f"seq_lens[{i}] = {sl} is shorter than the {ql} query tokens query_start_loc gives it")
        if i >= np_ and ql != 1:
            raise ValueError(f"query_start_loc gives decode {i} {ql} query tokens; V0 decodes have 1")
    if not 0 <= np_ <= b or qsl[np_] != meta.num_prefill_tokens or meta.num_decode_tokens != num_tokens - qsl[np_]:
        raise ValueError(
            f"num_prefills ({np_}), num_prefill_tokens ({meta.num_prefill_tokens}) and num_decode_tokens "
            f"({meta.num_decode_tokens}) must match query_start_loc {qsl}"
        )
    ssl = [int(x) for x in meta.seq_start_loc.tolist()]
    if not meta.prefix_cache_hit and ssl[: np_ + 1] != qsl[: np_ + 1]:
        raise ValueError(f"seq_start_loc {ssl} must equal query_start_loc {qsl} over the prompts (no cached context)")
    table = meta.block_tables
    if table.dim() != 2 or table.shape[0] != b:
        raise ValueError(f"block_tables must have one row per sequence ({b}), got shape {tuple(table.shape)}")
    for i in range(0 if meta.prefix_cache_hit else np_, b):  # the sequences read through the cache
        need = -(-seq[i] // block_size)
        if need > table.shape[1]:
            raise ValueError(
                f"block_tables has {table.shape[1]} columns; sequence {i} needs {need} blocks of {block_size} "
                f"for seq_lens[{i}] = {seq[i]}"
            )
        row = [int(x) for x in table[i, :need].tolist()]
        if any(not 0 <= x < meta.num_blocks for x in row):
            raise ValueError(f"block_tables[{i}] = {row} holds a block outside the cache's {meta.num_blocks}")
    slots = meta.slot_mapping
    if slots.numel() != num_tokens or bool(((slots < -1) | (slots >= meta.num_blocks * block_size)).any()):
        raise ValueError(
            f"slot_mapping must hold one slot per query token ({num_tokens}) in [-1, {meta.num_blocks * block_size})"
        )
