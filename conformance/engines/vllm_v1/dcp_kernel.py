"""Decode context parallelism through the kernel's own context-parallel arguments: one call per rank.

Seed ``001``'s DCP (:mod:`conformance.engines.vllm_v1.dcp`) splits each rank's work in two calls: the all-gathered
query heads over the rank's share of the *context*, unmasked, and the rank's own heads over the step's *new* tokens,
causal, merged by LSE.  vLLM's FA3 fork can do it in one: ``flash_attn_varlen_func(..., causal=True,
cp_world_size=W, cp_rank=r, cp_tot_seqused_k=seq_lens)`` reads the rank's keys (``seqused_k``, its share of
*every* key, context and new tokens) as the interleave-1 shard of each sequence, local key ``j`` being absolute key
``j * W + r``, and applies the causal mask in absolute positions against the sequence's total ``cp_tot_seqused_k``
(``hopper/mask.h``; :class:`attnref.ContextParallel`).  That also covers what the two-call path cannot do in one
unmasked context call: speculative decode and extend steps (``q_len > 1``), whose new tokens are spread over the
ranks like the context.

Per rank (:func:`kernel_cp_rank_forward`), with the same runner, cache and builder as the seed's path:

1. the cache write of the step's new tokens through the DCP slot mapping (every token on rank ``t % W``: the
   kernel's rule is interleave 1, so ``cp_kv_cache_interleave_size`` must be 1; a scenario asking for kernel cp
   with another interleave is rejected by :class:`~conformance.engines.vllm_v1.scenarios.Scenario`);
2. ``query_across_dcp = all_gather(query, dim=1)``;
3. one call: all gathered heads, the shared block table, ``seqused_k = get_dcp_local_seq_lens(seq_lens, W, r,
   interleave)``, ``cp_tot_seqused_k = seq_lens``, causal, with LSE;
4. ``cp_lse_ag_out_rs`` (:mod:`conformance.engines.vllm_v1.collectives`): the LSE-corrected all-gather /
   reduce-scatter keeps the rank's heads.

Steps 1 and 2 and the paged call over the rank's cache are the seed's path's too (:func:`rank_start`,
:func:`cache_call`).  No second merge: the step's new tokens are already in the one call.  :func:`kernel_cp_calls`
lists the calls for ``plan``; backends that do not declare the ``cp`` feature refuse them (``cp: not declared by this
adapter``), so the replay is ``unsupported`` on them.  Across processes:
``python -m conformance.engines.vllm_v1.dcp_dist --kernel-cp``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch

from attnfast.base import KernelOutput
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from conformance.cases.paged_kv import PagedKV

from ..base import Call, Kernel
from ..calls import call_case, paged_call
from .collectives import cp_lse_ag_out_rs
from .metadata import FlashAttentionMetadata, get_dcp_local_seq_lens
from .runner import KVCache, Step, VllmV1Runner

__all__ = ["RankStart", "cache_call", "kernel_cp_calls", "kernel_cp_rank_forward", "lse_of", "rank_start"]


def _label(rank: int, world: int) -> str:
    return f"rank {rank}: all keys (kernel cp_rank {rank} of {world}, causal)"


def _call_case(case: AttentionCase, q_lens: list[int], local: list[int], world: int, rank: int) -> AttentionCase:
    return call_case(case, list(zip(q_lens, local)), cp_world=world, cp_rank=rank)


class RankStart(NamedTuple):
    """A rank's DCP forward after its first steps (both paths): the cache with the step's new tokens written through
    the DCP slot mapping, the builder's metadata, the query of the rank's heads (reordered tokens) and every rank's
    heads all-gathered (``query_across_dcp``)."""

    cache: KVCache
    meta: FlashAttentionMetadata
    query: torch.Tensor
    query_across_dcp: torch.Tensor


def rank_start(
    engine: VllmV1Runner, case: AttentionCase, inputs: CaseInputs, step: Step, rank: int, group: Any
) -> RankStart:
    """Rank ``rank``'s cache, metadata and queries (:class:`RankStart`)."""
    dev = inputs.q.device
    heads = case.num_heads // step.dcp
    cache = engine.make_cache(case, inputs, step, rank)
    meta = engine.builder(step, rank).build(0, engine.common_metadata(case, step, rank, dev))
    engine.write_cache(case, inputs, cache, engine.new_token_rows(inputs, step), meta.slot_mapping.tolist())
    tok = torch.tensor(step.token_index, dtype=torch.long, device=dev)
    query = inputs.q[tok][:, rank * heads : (rank + 1) * heads].contiguous()
    return RankStart(cache, meta, query, group.all_gather(query, dim=1))


def cache_call(engine: VllmV1Runner, case: AttentionCase, start: RankStart, label: str, ccase: AttentionCase) -> Call:
    """The call of the gathered query over the rank's paged cache (its block table), as ``ccase``."""
    k_view, v_view = engine._kernel_view(start.cache)
    block_table = start.meta.block_table
    paged = PagedKV(k_view, v_view, block_table, [], start.cache.block_size, case.kv_layout)
    return paged_call(label, ccase, start.query_across_dcp, paged, block_table)


def lse_of(res: KernelOutput, label: str) -> torch.Tensor:
    """The call's LSE; ``ValueError`` naming the call when the backend returned none (DCP merges by LSE)."""
    if res.lse is None:
        raise ValueError(f"{label}: DCP needs the LSE; this backend returned none")
    return res.lse


def kernel_cp_calls(case: AttentionCase, step: Step) -> list[tuple[str, AttentionCase]]:
    """Each rank's one call: all heads over its share of every key of the step, causal, with the cp arguments."""
    seq_lens = torch.tensor(step.kv_lens, dtype=torch.int32)
    out = []
    for rank in range(step.dcp):
        local = get_dcp_local_seq_lens(seq_lens, step.dcp, rank, step.interleave).tolist()
        out.append((_label(rank, step.dcp), _call_case(case, step.q_lens, local, step.dcp, rank)))
    return out


def kernel_cp_rank_forward(
    engine: VllmV1Runner,
    case: AttentionCase,
    inputs: CaseInputs,
    step: Step,
    rank: int,
    group: Any,
    kernel: Kernel,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One rank's forward (see the module docstring): output ``(tokens, h / world, d)`` and LSE ``(h / world,
    tokens)`` of its heads, tokens in the reordered order."""
    world = step.dcp
    start = rank_start(engine, case, inputs, step, rank, group)
    local = get_dcp_local_seq_lens(start.meta.seq_lens, world, rank, step.interleave).tolist()
    label, ccase = _label(rank, world), _call_case(case, step.q_lens, local, world, rank)
    call = cache_call(engine, case, start, label, ccase)
    totals = start.meta.seq_lens.to(device=inputs.q.device, dtype=torch.int32)
    res = kernel(Call(label, ccase, dataclasses.replace(call.inputs, cp_tot_seqused_k=totals)))
    out, lse = cp_lse_ag_out_rs(res.out, lse_of(res, label).transpose(0, 1), group, return_lse=True)
    return out, lse.transpose(0, 1).contiguous()
