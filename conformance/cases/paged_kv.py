"""An engine's paged KV cache: its block manager, slot mapping and cache writes, the way vLLM and SGLang build them.

* :func:`hand_out_blocks` is an engine's block manager (shuffled block ids handed out request by request, a spare
  block owned by nobody), :func:`token_slots` its slot mapping (``block * block_size + offset``),
  :func:`prefix_sums` / :func:`cu_seqlens` the query and key start locations;
* :func:`allocate_cache` is the block manager and ``reshape_and_cache`` of an engine: blocks handed out per
  request in a shuffled order, every key written through a slot mapping with
  :func:`attnref.write_kv_cache` (vLLM's ``reshape_and_cache_flash``), unused slots stale (:data:`STALE`).

Part of the case model's inputs, below the compositions: the engine replays (:mod:`conformance.engines.calls`) and
the invariance batches (:mod:`conformance.graphs.assemble`) both build their caches here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from attnref import gather_kv, write_kv_cache
from attnref.paged import as_layout

__all__ = [
    "STALE",
    "PagedKV",
    "allocate_cache",
    "blocks_needed",
    "cu_seqlens",
    "hand_out_blocks",
    "prefix_sums",
    "slot_mapping",
    "token_slots",
]

#: Value of cache slots no request owns (large and finite, as stale data in a real engine).
STALE = 100.0


def prefix_sums(lens: Iterable[int]) -> list[int]:
    """``[0, l0, l0 + l1, ...]`` (SGLang's ``pad(cumsum(lens), (1, 0))``)."""
    out = [0]
    for n in lens:
        out.append(out[-1] + int(n))
    return out


def cu_seqlens(lens: Sequence[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """int32 ``[0, l0, l0 + l1, ...]``: the engines' ``query_start_loc`` / ``cu_seqlens``."""
    return torch.tensor(prefix_sums(lens), dtype=torch.int32, device=device)


def blocks_needed(tokens: int, block_size: int) -> int:
    """Blocks a block manager gives a sequence of ``tokens`` tokens: ``ceil(tokens / block_size)``, at least one."""
    return max(1, -(-int(tokens) // block_size))


def hand_out_blocks(
    lens: Sequence[int], block_size: int, generator: torch.Generator | None = None, spare_blocks: int = 1
) -> tuple[list[int], list[list[int]]]:
    """An engine's block manager: ``sum(blocks_needed) + spare_blocks`` block ids in an order shuffled by
    ``generator``, handed out in that order, request by request.  Returns the shuffled ids (the spare ones last;
    ``len`` is the number of blocks) and each request's blocks."""
    need = [blocks_needed(n, block_size) for n in lens]
    perm = torch.randperm(sum(need) + spare_blocks, generator=generator).tolist()
    blocks, cursor = [], 0
    for n in need:
        blocks.append(perm[cursor : cursor + n])
        cursor += n
    return perm, blocks


def token_slots(blocks: Sequence[int], positions: Iterable[int], block_size: int) -> list[int]:
    """The slot mapping of a request: token position ``p`` lives in slot ``blocks[p // bs] * bs + p % bs``."""
    return [int(blocks[p // block_size]) * block_size + p % block_size for p in positions]


@dataclass
class PagedKV:
    """An engine's paged cache: ``k_cache``/``v_cache`` in ``layout``, ``block_table (b, max_blocks)`` int32, and
    the slot of every key of every request (``slots[b][t]`` for token ``t`` of request ``b``)."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    slots: list[list[int]]
    block_size: int
    layout: str

    def gather(self, lens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed keys and values of each request's first ``lens[b]`` tokens, read back through the table."""
        k, _ = gather_kv(self.k_cache, self.block_table, list(lens), as_layout(self.layout))
        v, _ = gather_kv(self.v_cache, self.block_table, list(lens), as_layout(self.layout))
        return k, v


def slot_mapping(paged: PagedKV, spans: Sequence[tuple[int, int]], device: torch.device | str) -> torch.Tensor:
    """int64 slot of token ``t`` of request ``b`` for every ``(b, t)`` in ``spans`` order."""
    return torch.tensor([paged.slots[b][t] for b, t in spans], dtype=torch.int64, device=device)


def allocate_cache(
    kv_lens: Sequence[int],
    keys: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor],
    *,
    block_size: int,
    layout: str = "NHD",
    generator: torch.Generator | None = None,
    spare_blocks: int = 1,
) -> PagedKV:
    """Allocate blocks for requests of ``kv_lens`` keys (shuffled block ids, ``spare_blocks`` owned by nobody),
    then write request ``b``'s ``keys[b]``/``values[b]`` (``(kv_lens[b], hk, d)``) through their slot mapping.

    Block-table columns past a request's last block point at a spare block, as an engine's padding would.
    """
    if len(keys) != len(kv_lens) or len(values) != len(kv_lens):
        raise ValueError(f"keys and values must hold one tensor per request ({len(kv_lens)})")
    perm, blocks = hand_out_blocks(kv_lens, block_size, generator, spare_blocks)
    num_blocks = len(perm)
    k0, v0 = keys[0], values[0]
    hk, d, dv = k0.shape[1], k0.shape[2], v0.shape[2]
    dev, dt = k0.device, k0.dtype
    k_cache = torch.full((num_blocks, block_size, hk, d), STALE, dtype=torch.float32).to(dev, dt)
    v_cache = torch.full((num_blocks, block_size, hk, dv), STALE, dtype=torch.float32).to(dev, dt)
    if layout == "HND":
        k_cache, v_cache = k_cache.transpose(1, 2).contiguous(), v_cache.transpose(1, 2).contiguous()
    table = torch.full((len(kv_lens), max(len(row) for row in blocks)), perm[-1], dtype=torch.int32)
    slots: list[list[int]] = []
    for b, n in enumerate(kv_lens):
        table[b, : len(blocks[b])] = torch.tensor(blocks[b], dtype=torch.int32)
        slots.append(token_slots(blocks[b], range(int(n)), block_size))
    flat = torch.tensor([s for row in slots for s in row], dtype=torch.int64, device=dev)
    if flat.numel():
        write_kv_cache(torch.cat(list(keys)), torch.cat(list(values)), k_cache, v_cache, flat, layout=as_layout(layout))
    return PagedKV(k_cache, v_cache, table.to(dev), slots, block_size, layout)
