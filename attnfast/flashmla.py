"""FlashMLA (``vllm.third_party.flashmla``, vLLM 0.24.0's build): DeepSeek MLA absorbed decode on Hopper.

``flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, sched_meta, None,
softmax_scale, causal)`` computes the case's ``qv`` attention in FlashMLA's spelling: one 576-wide query
``[qv (512, absorbed q_nope) | q (64, q_rope)]`` per head and one paged cache ``(num_blocks, 64, 1, 576)``
``[c_kv (512) | k_rope (64)]`` (the case's ``mla_cache``) whose first ``head_dim_v = 512`` channels are V.
So the score is ``scale * (q_rope . k_rope + q_nope . c_kv)``, the reference's ``qv`` rule
(:mod:`attnref.mla`), and the default scale is ``1/sqrt(576)``, the reference's ``1/sqrt(d + dv)``.

Queries come as ``(batch, s_q, h, 576)``: every request must have the same ``q_len`` (decode, or
speculative decode with ``s_q > 1``, causal bottom-right aligned: measured correct on an H100 at s_q = 4).
The scheduler metadata (``get_mla_metadata()``) is created in ``prepare`` and filled by the first call; the record's
variant summarises what it planned (:func:`flashmla_decided`: SM parts, the most and the total splits), read after the
call.
Outputs: ``(batch, s_q, h, 512)`` to varlen; LSE ``(batch, h, s_q)`` natural log (measured: 9e-7 from an
fp64 reference; not log2) to ``(h, total_q)``, with ``+inf`` (written for rows that see no key: an empty
cache, or the top rows of a causal ``s_q > kv_len`` request, measured) normalised to ``-inf``.

Limits, measured with ``scripts/probe_vllm_kernels.py`` on an H100: page size 64 only ("Currently
page_block_size must be 64"); one kv head (MLA); bf16 and fp16; 1 to 256 query heads (256 by suite
``limits``).  The dense decode path takes no descale, and an fp8 cache with a bf16 query raises "query and
key must have the same dtype".
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch

from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

from ._fa_common import (
    GraphKernel,
    KernelCall,
    PreparedKernel,
    lse_posinf_to_neginf,
    padded_lse_to_varlen,
    uniform_q_len,
)
from ._vllm import FLASHMLA_MODULE, import_flashmla, vllm_kernel_support, vllm_version
from .base import OK, Backend, KernelOutput, Support
from .decisions import flashmla_sched_summary

__all__ = ["FlashMLABackend", "flashmla_decided", "flashmla_plan", "flashmla_support"]

ENTRY = f"{FLASHMLA_MODULE}.flash_mla_with_kvcache"
#: FlashMLA's MLA geometry: rope (the case's head_dim) and latent (head_dim_v) widths.
ROPE_DIM, LATENT_DIM = 64, 512
#: "Currently page_block_size must be 64" (measured with 16, 32 and 128).
PAGE_SIZE = 64


def flashmla_support(case: AttentionCase) -> Support:
    """FlashMLA's geometry: qv with (64, 512), one kv head, paged with page 64, one q_len for the batch."""
    if not case.qv:
        return Support(False, "FlashMLA computes MLA absorbed attention only: the case needs qv")
    if (case.head_dim, case.dv) != (ROPE_DIM, LATENT_DIM):
        return Support(
            False,
            f"head dims ({case.head_dim}, {case.dv}): FlashMLA's cache is {LATENT_DIM} latent + {ROPE_DIM} rope "
            f"(head_dim {ROPE_DIM}, head_dim_v {LATENT_DIM})",
        )
    if case.num_kv_heads != 1:
        return Support(False, f"{case.num_kv_heads} kv heads: FlashMLA's dense decode reads one latent head")
    if not case.paged or case.block_size != PAGE_SIZE:
        return Support(False, f"FlashMLA reads a paged cache with page size {PAGE_SIZE} only (measured)")
    q_len = uniform_q_len(case)
    if q_len is None or q_len < 1:
        return Support(
            False, f"FlashMLA takes one q_len >= 1 for the whole batch; this case has {sorted(set(case.q_lens))}"
        )
    return OK


def flashmla_plan(case: AttentionCase, inputs: CaseInputs, metadata: Any) -> KernelCall:
    """The FlashMLA call for ``case`` (no kernel run); ``metadata`` is ``get_mla_metadata()[0]``."""
    q_len = uniform_q_len(case)
    assert q_len is not None and inputs.qv is not None and inputs.mla_cache is not None
    b, h = case.batch, case.num_heads
    q = torch.cat([inputs.qv, inputs.q], dim=-1).reshape(b, q_len, h, LATENT_DIM + ROPE_DIM)
    cache = inputs.mla_cache if case.kv_layout == "NHD" else inputs.mla_cache.transpose(1, 2)
    kwargs = dict(
        q=q,
        k_cache=cache,
        block_table=inputs.block_table,
        cache_seqlens=torch.tensor(case.kv_lens, dtype=torch.int32, device=inputs.device),
        head_dim_v=LATENT_DIM,
        tile_scheduler_metadata=metadata,
        num_splits=None,
        softmax_scale=case.scale,
        causal=case.causal,
    )

    def finish(result: Any) -> KernelOutput:
        out, lse = result
        return KernelOutput(out.reshape(b * q_len, h, LATENT_DIM), lse_posinf_to_neginf(padded_lse_to_varlen(lse)))

    notes = ("mla: q = [qv | q] (576), cache = [c_kv | k_rope] (576), V = its first 512 channels",)
    return KernelCall(ENTRY, kwargs, finish, notes)


def flashmla_decided(metadata: Any) -> dict[str, Any]:
    """What FlashMLA's scheduler planned for the calls of ``metadata`` (the ``FlashMLASchedMeta`` of ``prepare``,
    filled by the first call): :func:`attnfast.decisions.flashmla_sched_summary` of its ``tile_scheduler_metadata``
    rows and ``num_splits``.  One host read; called after the call, outside the timed region."""
    tile, splits = getattr(metadata, "tile_scheduler_metadata", None), getattr(metadata, "num_splits", None)
    if tile is None or splits is None:
        raise ValueError("FlashMLA's scheduler metadata is not filled (no call has run with it)")
    return flashmla_sched_summary(int(tile.shape[0]), splits.tolist())


class FlashMLABackend(Backend):
    """FlashMLA dense decode (vLLM 0.24.0's build) on Hopper."""

    name = "flashmla"
    family = "flashmla"
    description = "FlashMLA flash_mla_with_kvcache: MLA absorbed decode, 576-wide paged cache (page 64)"
    accepts = frozenset({"qv", "graph"})
    #: ``flash_mla_with_kvcache`` has a ``num_splits`` parameter, but the dense path must be given None (the
    #: tile scheduler chooses the splits): nothing pins them
    batch_invariance_via = None
    _DENSE = "FlashMLA's dense decode (flash_mla_with_kvcache without indices) has no"
    refused = {
        "window": f"{_DENSE} window argument",
        "local_chunk": f"{_DENSE} chunk argument",
        "softcap": f"{_DENSE} soft-cap argument",
        "alibi": f"{_DENSE} ALiBi argument",
        "sinks": "attn_sink is taken by the sparse path only (the dense path asserts it is None)",
        "splits": "num_splits must be None (FlashMLA schedules splits itself)",
        "append": f"{_DENSE} new-token argument",
        "fp32": "FlashMLA takes bf16 and fp16 (measured)",
        "fp8_e4m3": "the dense decode path takes no descale, and an fp8 cache with a bf16 query raises 'query "
        "and key must have the same dtype' (measured)",
    }

    def version(self) -> str:
        return vllm_version()

    def is_available(self) -> Support:
        return vllm_kernel_support(import_flashmla, f"FlashMLA ({FLASHMLA_MODULE})")

    def supports(self, case: AttentionCase, device: str) -> Support:
        base = super().supports(case, device)
        return base if not base else flashmla_support(case)

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> PreparedKernel:
        mod = import_flashmla()
        metadata, _ = mod.get_mla_metadata()
        call = flashmla_plan(case, inputs, metadata)
        decided = functools.partial(flashmla_decided, metadata)
        return PreparedKernel(mod.flash_mla_with_kvcache, dataclasses.replace(call, decided=decided))

    def prepare_graph(self, case: AttentionCase, inputs: CaseInputs) -> GraphKernel:
        """The bucket's call reading the live ``cache_seqlens``, the 576-wide query concatenated inside the call
        (so from the live buffers), and a fresh ``FlashMLASchedMeta``: its tile-scheduler metadata is computed by
        the first call, which is then the captured one, so every replay plans for its own key counts (the
        interface: reuse a sched_meta "only when the tensor shapes and the values of cache_seqlens ... remain the
        same")."""
        mod = import_flashmla()
        metadata, _ = mod.get_mla_metadata()
        call = flashmla_plan(case, inputs, metadata)
        q_shape = tuple(call.kwargs["q"].shape)
        qv, q = inputs.qv, inputs.q
        assert qv is not None

        def run(**kwargs: Any) -> Any:
            kwargs["q"] = torch.cat([qv, q], dim=-1).reshape(q_shape)
            return mod.flash_mla_with_kvcache(**kwargs)

        note = "graph: a fresh get_mla_metadata() per capture, computed by the captured call from cache_seqlens"
        return GraphKernel(run, call, {"cache_seqlens": inputs.seqlens_k}, note=note)
