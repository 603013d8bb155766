"""Building blocks the engine replays share: describing a kernel call, and an engine's paged KV cache.

* :func:`call_case` turns the layer's case into the case of one call (its requests and options);
* :func:`contiguous_call` / :func:`paged_call` build a :class:`~conformance.engines.base.Call` from the
  engine's tensors (what an adapter's ``prepare`` reads: packed ``q``, packed or paged keys, block table);
* :func:`hand_out_blocks` is an engine's block manager (shuffled block ids handed out request by request, a spare
  block owned by nobody), :func:`token_slots` its slot mapping (``block * block_size + offset``),
  :func:`prefix_sums` / :func:`cu_seqlens` the query and key start locations;
* :func:`allocate_cache` is the block manager and ``reshape_and_cache`` of an engine: blocks handed out per
  request in a shuffled order, every key written through a slot mapping with
  :func:`attnref.write_kv_cache` (vLLM's ``reshape_and_cache_flash``), unused slots stale.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from attnref import gather_kv, write_kv_cache
from attnref.paged import as_layout
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

from .base import Call, call_inputs

__all__ = [
    "STALE",
    "PagedKV",
    "allocate_cache",
    "blocks_needed",
    "call_case",
    "contiguous_call",
    "tree_sequences",
    "cu_seqlens",
    "hand_out_blocks",
    "paged_call",
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


def call_case(layer: AttentionCase, requests: Sequence[tuple[int, int]], **changes) -> AttentionCase:
    """The case of one kernel call: the layer's configuration with this call's ``(q_len, kv_len)`` requests and
    option changes (``causal``, ``window``, ``kv_layout``, ``block_size``, ...); a plain call, not a replay nor an
    invariance (an engine invariance case's calls are each variant's)."""
    fields = dict(engine="", scenario="", batch_name="", append=False, invariance="") | changes
    return layer.replace(requests=tuple((int(q), int(k)) for q, k in requests), **fields)


def contiguous_call(
    label: str,
    case: AttentionCase,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    qv: torch.Tensor | None = None,
) -> Call:
    """A call over packed keys: request ``b``'s queries ``q[cu_q[b]:cu_q[b+1]]`` see ``k[cu_k[b]:cu_k[b+1]]``."""
    dev = q.device
    inputs = call_inputs(
        case,
        q=q,
        k=k,
        v=v,
        cu_seqlens_q=cu_seqlens(case.q_lens, dev),
        cu_seqlens_k=cu_seqlens(case.kv_lens, dev),
        sinks=sinks,
        alibi_slopes=alibi_slopes,
        qv=qv,
    )
    return Call(label, case, inputs)


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


def paged_call(
    label: str,
    case: AttentionCase,
    q: torch.Tensor,
    paged: PagedKV,
    block_table: torch.Tensor,
    *,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    qv: torch.Tensor | None = None,
) -> Call:
    """A call over a paged cache: request ``b`` sees the first ``case.kv_lens[b]`` keys of ``block_table[b]``.

    ``case`` must carry the cache's layout and block size.  The packed ``k``/``v`` of the inputs are the keys
    read back through the table (only reference-reading fakes use them)."""
    if not case.paged or case.block_size != paged.block_size or case.kv_layout != paged.layout:
        raise ValueError(
            f"case must describe the cache: layout {paged.layout}, block size {paged.block_size}; "
            f"got {case.kv_layout}, {case.block_size}"
        )
    k, _ = gather_kv(paged.k_cache, block_table, case.kv_lens, as_layout(paged.layout))
    v, _ = gather_kv(paged.v_cache, block_table, case.kv_lens, as_layout(paged.layout))
    dev = q.device
    inputs: CaseInputs = call_inputs(
        case,
        q=q,
        k=k,
        v=v,
        cu_seqlens_q=cu_seqlens(case.q_lens, dev),
        cu_seqlens_k=cu_seqlens(case.kv_lens, dev),
        k_cache=paged.k_cache,
        v_cache=paged.v_cache,
        block_table=block_table,
        sinks=sinks,
        alibi_slopes=alibi_slopes,
        qv=qv,
    )
    return Call(label, case, inputs)


def tree_sequences(
    layer: AttentionCase,
    inputs: CaseInputs,
    prefix_lens: Sequence[int],
    paths: Sequence[Sequence[int]],
    **changes,
) -> tuple[AttentionCase, CaseInputs]:
    """Top-k > 1 tree attention as plain attention (SGLang's verify and draft decode): for request ``b`` and each
    path, one sequence of one query over the request's first ``prefix_lens[b]`` keys and the draft tokens the path
    names (offsets past the prefix), packed from ``inputs``' contiguous keys; query rows in (request, path) order.
    ``changes`` go to the call's case (:func:`call_case`)."""
    cu = [int(x) for x in inputs.cu_seqlens_k.tolist()]
    idx, reqs = [], []
    for b, s in enumerate(prefix_lens):
        for path in paths:
            keys = list(range(cu[b], cu[b] + s)) + [cu[b] + s + j for j in path]
            idx += keys
            reqs.append((1, len(keys)))
    call = call_case(layer, reqs, kv_layout="contiguous", block_size=None, causal=True, **changes)
    dev = inputs.device
    sel = torch.tensor(idx, device=dev)
    ins = call_inputs(
        call,
        q=inputs.q,
        k=inputs.k[sel],
        v=inputs.v[sel],
        cu_seqlens_q=torch.arange(len(reqs) + 1, device=dev),
        cu_seqlens_k=torch.tensor(prefix_sums([n for _, n in reqs]), device=dev),
        sinks=inputs.sinks,
    )
    return call, ins
