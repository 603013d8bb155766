"""Seed ``001``'s decode context parallelism (``FlashAttentionImpl._forward_with_dcp``), every rank in this process.

Under DCP every rank of the group holds every ``block_size * world``-token *virtual block* of a sequence's
table, but only its share of the tokens: token ``t`` lives on rank ``(t // interleave) % world`` (vLLM's
``compute_slot_mapping``: offset ``o = t % (block_size * world)`` in the virtual block, owner ``o // interleave %
world``, local offset ``o // (world * interleave) * interleave + o % interleave``; other ranks get slot -1:
:meth:`~conformance.engines.vllm_v1.runner.VllmV1Runner.slot`), so a rank holds ``get_dcp_local_seq_lens`` tokens
of each context.  The kv heads are replicated across the group (DCP needs ``tp_size > num_kv_heads``, so a rank
has one kv head) while the query heads are the ranks' tensor-parallel shards.  Per rank (:func:`dcp_rank_forward`):

1. ``query_across_dcp = all_gather(query, dim=1)``: every rank's query heads;
2. the context: ``flash_attn_varlen_func`` of all gathered heads over the rank's local context (the cache through
   the shared block table), no mask, with LSE.  As in the seed, the call's keys come from the builder's metadata:
   ``cu_seqlens_k`` is the prefix sum of ``dcp_context_kv_lens`` and ``max_seqlen_k`` is
   ``max_dcp_context_kv_len`` (:func:`context_kv_lens`);
3. ``cp_lse_ag_out_rs`` (:mod:`conformance.engines.vllm_v1.collectives`): the LSE-corrected all-gather /
   reduce-scatter that keeps the rank's heads and their global LSE;
4. the new tokens: ``flash_attn_varlen_func`` of the rank's heads over the step's own keys (``cu_seqlens_k =
   cu_seqlens_q``), causal, with LSE;
5. ``merge_attn_states`` of 3 and 4 into the rank's heads of the output.

The layer output is the ranks' head shards side by side.  :func:`dcp_forward` runs the ranks as threads of one
process (:class:`~conformance.engines.vllm_v1.collectives.ThreadGroup`, the replay the verdict judges); across real
processes: :mod:`conformance.engines.vllm_v1.dcp_dist`.

``max_dcp_context_kv_len`` is the builder's bound on any rank's local context, ``ceil(max_seq_len / (world *
interleave)) * interleave`` (the seed: no GPU->CPU sync to find the real maximum); the seed passes it as the context
call's ``max_seqlen_k`` and as ``max_seq_len`` of the AOT scheduler.  A varlen kernel sizes its key loop, its
split-KV partitions and its scheduler metadata by ``max_seqlen_k``, so a bound below a real local length would drop
keys; the adapters here take the exact lengths, so the replay checks the bound against them instead
(:func:`context_kv_lens`: ``ValueError`` naming the field when it falls short).

Scenarios marked ``kernel_cp`` replay the variant that gives the kernel its own context-parallel arguments
(``cp_world_size`` / ``cp_rank`` / ``cp_tot_seqused_k``): one causal call per rank over its share of every key,
no second merge (:mod:`conformance.engines.vllm_v1.dcp_kernel`); :func:`dcp_calls` and :func:`dcp_rank_forward`
dispatch to it.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

from ..base import Kernel
from ..calls import call_case, contiguous_call
from ..merge import merge_attn_states
from .collectives import ThreadGroup, cp_lse_ag_out_rs
from .dcp_kernel import cache_call, kernel_cp_calls, kernel_cp_rank_forward, lse_of, rank_start
from .metadata import FlashAttentionMetadata, get_dcp_local_seq_lens
from .runner import Step, VllmV1Runner
from .scenarios import SCENARIOS

__all__ = ["context_kv_lens", "dcp_calls", "dcp_forward", "dcp_rank_forward"]


# ---------------------------------------------------------------------------------------------- the calls
def _local_context(step: Step, rank: int) -> list[int]:
    ctx = torch.tensor([k - q for q, k in zip(step.q_lens, step.kv_lens)], dtype=torch.int32)
    return get_dcp_local_seq_lens(ctx, step.dcp, rank, step.interleave).tolist()


def _context_label(rank: int) -> str:
    return f"rank {rank}: context (all-gathered q, local KV, unmasked)"


def dcp_calls(case: AttentionCase, step: Step) -> list[tuple[str, AttentionCase]]:
    """Each rank's two calls: the gathered heads over its context share, its own heads over the new tokens (a
    ``kernel_cp`` scenario: each rank's one call, :func:`~conformance.engines.vllm_v1.dcp_kernel.kernel_cp_calls`)."""
    if SCENARIOS[case.scenario].kernel_cp:
        return kernel_cp_calls(case, step)
    out = []
    heads = case.num_heads // step.dcp
    for rank in range(step.dcp):
        ctx = [(q, c) for q, c in zip(step.q_lens, _local_context(step, rank))]
        out.append((_context_label(rank), call_case(case, ctx, causal=False)))
        new = [(q, q) for q in step.q_lens]
        query = call_case(case, new, num_heads=heads, kv_layout="contiguous", block_size=None)
        out.append((f"rank {rank}: new tokens (causal)", query))
    return out


def context_kv_lens(meta: FlashAttentionMetadata, rank: int) -> list[int]:
    """The keys of ``rank``'s context call as the seed reads them from the builder's metadata: ``cu_seqlens_k``
    from ``dcp_context_kv_lens``, ``max_seqlen_k = max_dcp_context_kv_len``.  ``ValueError`` naming the field when
    the lengths are missing or the bound falls short of one of them (a kernel would read fewer keys)."""
    if meta.dcp_context_kv_lens is None:
        raise ValueError(f"dcp_context_kv_lens: rank {rank}'s builder set none (the builder's dcp_world_size is 1)")
    lens = [int(n) for n in meta.dcp_context_kv_lens.tolist()]
    longest = max(lens, default=0)
    if longest > meta.max_dcp_context_kv_len:
        raise ValueError(
            f"max_dcp_context_kv_len ({meta.max_dcp_context_kv_len}), the context call's max_seqlen_k, must cover "
            f"rank {rank}'s longest local context (dcp_context_kv_lens holds {longest})"
        )
    return lens


# ---------------------------------------------------------------------------------------------- the forward
def dcp_rank_forward(
    engine: VllmV1Runner,
    case: AttentionCase,
    inputs: CaseInputs,
    step: Step,
    rank: int,
    group: Any,
    kernel: Kernel,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One rank's ``_forward_with_dcp``: output ``(tokens, h / world, d)`` and LSE of its heads (reordered tokens);
    a ``kernel_cp`` scenario runs :func:`~conformance.engines.vllm_v1.dcp_kernel.kernel_cp_rank_forward`."""
    if engine.scenario(case).kernel_cp:
        return kernel_cp_rank_forward(engine, case, inputs, step, rank, group, kernel)
    calls = dict(dcp_calls(case, step))
    start = rank_start(engine, case, inputs, step, rank, group)
    meta = start.meta
    label = _context_label(rank)
    q_lens = [int(n) for n in (meta.query_start_loc[1:] - meta.query_start_loc[:-1]).tolist()]
    ccase = call_case(case, list(zip(q_lens, context_kv_lens(meta, rank))), causal=False)
    context = kernel(cache_call(engine, case, start, label, ccase))
    out_cor, lse_cor = cp_lse_ag_out_rs(context.out, lse_of(context, label).transpose(0, 1), group, return_lse=True)
    lse_cor = lse_cor.transpose(0, 1).contiguous()
    label = f"rank {rank}: new tokens (causal)"
    rows = engine.new_token_rows(inputs, step)
    new = kernel(contiguous_call(label, calls[label], start.query, inputs.k[rows], inputs.v[rows]))
    return merge_attn_states(out_cor, lse_cor, new.out, lse_of(new, label))


def dcp_forward(
    engine: VllmV1Runner, case: AttentionCase, inputs: CaseInputs, step: Step, kernel: Kernel
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank as a thread of this process; the head shards side by side (reordered tokens).

    The ranks' kernel calls run one at a time (a lock, never held across a collective): a JIT kernel compiled
    from several threads at once is not safe (FA4 on the H100: SIGABRT in ``dcp3_mixed`` when three ranks met
    its first call together), and the ranks' calls are independent, so the order changes no result."""
    lock = threading.Lock()

    def one_at_a_time(call: Any) -> Any:
        with lock:
            return kernel(call)

    results = ThreadGroup(step.dcp).run(lambda r, g: dcp_rank_forward(engine, case, inputs, step, r, g, one_at_a_time))
    return torch.cat([o for o, _ in results], dim=1), torch.cat([lse for _, lse in results], dim=0)
