"""vLLM's FA3 fork (``vllm.vllm_flash_attn``, vLLM 0.24.0): the kernel vLLM and the seed engines call on Hopper.

One entry point, ``flash_attn_varlen_func(..., fa_version=3)``, every argument passed by keyword (the fork's
argument order differs from upstream), for every case:

* contiguous KV: packed k/v with ``cu_seqlens_k``; paged KV: the caches with ``block_table`` and ``seqused_k``
  (the fork takes exactly one of the two), any block size; an HND cache as its ``(num_blocks, page, hk, d)``
  strided view, as vLLM does;
* ``causal`` travels in the flag, the window in FA2 spelling (``-1`` = unbounded); ``softcap``;
* sinks through ``s_aux``, which takes bf16 only: the adapter converts, exactly, since the case's sinks are
  bf16-representable (:func:`conformance.cases.inputs.make_inputs`), and a record note says so;
* fp8 e4m3: the stored q/k/v with ``q/k/v_descale`` of shape ``(batch, hk)``, a per-tensor scale expanded to that
  shape as vLLM does; the output is bf16;
* MLA absorbed: ``q_v``; the paged MLA cache as SGLang's two strided views (``k_cache``/``v_cache``) of the one
  ``[c_kv | k_rope]`` cache;
* ``softmax_scale``: the case's, else None, the fork's default ``q.shape[-1] ** -0.5``: with ``q_v`` not the
  reference's ``1/sqrt(d + dv)``, so those cases fail and ``ledgers/fa3-vllm.toml`` says why;
* ``num_splits``: the case's, or 0 (the fork's heuristic) when unset; ``scheduler_metadata``, when the case asks
  for it: from ``get_scheduler_metadata`` with the call's own shapes, computed in ``prepare`` (vLLM's graph path);
* the record's variant (:func:`fa3_vllm_decided`: ``fa3_num_splits``, ``fa3_pack_gqa``): what the kernel decided,
  read back after the call from that scheduler metadata, or from what ``get_scheduler_metadata`` computes for the
  same call;
* ``v_padded``: V (or the V cache) zero-padded to ``head_dim``, the output stripped back to ``head_dim_v``
  (:func:`attnfast._fa_common.prepare_padded_v`);
* context parallel (``cp_world > 1``): ``cp_world_size``, ``cp_rank`` and ``cp_tot_seqused_k`` (int32 ``(batch,)``
  on the device, the inputs' totals checked against the call's shard by :func:`conformance.cases.inputs.cp_totals`);
  the fork applies them in its causal mask only and refuses them with a window, so the case model keeps cp causal.

LSE ``(h, total_q)``: ``-inf`` for rows that saw no key; the ``+inf`` the fork gives every row of a batch without
any key is normalised to ``-inf``.

Refusals, each measured on an H100 with vLLM 0.24.0's build (``scripts/probe_vllm_kernels.py``) unless it says
"by the wrapper": :attr:`FA3VllmBackend.refused` and :func:`fa3_vllm_support`.  The measured messages and values,
and where the cp rule was read in the fork's source: ``docs/concepts/backends.md`` (*fa3-vllm: what its adapter's
docstring leaves out*).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import torch

from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs, cp_totals

from ._fa_common import (
    KernelCall,
    GraphKernel,
    PreparedKernel,
    compute_capability,
    fa2_window,
    kernel_case,
    lse_posinf_to_neginf,
    prepare_padded_v,
    stored_tensors,
)
from ._vllm import FA3_MODULE, import_vllm_fa3, vllm_kernel_support, vllm_version
from .base import OK, Backend, KernelOutput, Support
from .decisions import fa3_vllm_head_swizzle, fa3_vllm_metadata_summary
from .fa3 import fa3_shape_support

__all__ = ["FA3VllmBackend", "fa3_vllm_decided", "fa3_vllm_plan", "fa3_vllm_support", "import_vllm_fa3"]

ENTRY = f"{FA3_MODULE}.flash_attn_varlen_func"
#: "HeaddimV > 256 requires fp16 and bf16 data type" (measured with qv 64 + 512 in fp8).
MAX_FP8_HEAD_DIM_V = 256
#: s_aux (sinks): "We only support query heads <= 64 with S aux" (measured: the total of query heads, any group size).
MAX_SINK_HEADS = 64
#: fp8 q/k/v: "head_size should be a multiple of 16" (measured on the H100 with d40 in fp8 e4m3).
FP8_HEAD_DIM_MULTIPLE = 16


def fa3_vllm_support(case: AttentionCase, cc: tuple[int, int] | None) -> Support:
    """Shape and dtype limits beyond the feature refusals (each measured, see the module docstring)."""
    shape = fa3_shape_support(case, cc)
    if not shape:
        return shape
    if case.quant_family == "fp8":
        if case.dtype != "bf16":
            return Support(False, f"fp8 with {case.dtype} activations: FA3's fp8 path writes bf16 output")
        if case.dv > MAX_FP8_HEAD_DIM_V:
            return Support(False, f"fp8 with head_dim_v {case.dv}: 'HeaddimV > 256 requires fp16 and bf16 data type'")
        if case.head_dim % FP8_HEAD_DIM_MULTIPLE or case.dv % FP8_HEAD_DIM_MULTIPLE:
            return Support(
                False,
                f"fp8 with head dims ({case.head_dim}, {case.dv}): 'head_size should be a multiple of 16' "
                "(measured on the H100 with d40; 16-bit inputs take multiples of 8)",
            )
    if case.sinks and case.head_dim != case.dv:
        return Support(
            False,
            f"sinks with head dims ({case.head_dim}, {case.dv}): 'We don't support S aux with hdim != hdim_v' "
            "(measured on the H100 by the fuzzer: 64/512 with and without qv, 192/128, 8/16)",
        )
    if case.sinks and case.num_heads > MAX_SINK_HEADS:
        return Support(
            False,
            f"sinks with {case.num_heads} query heads: 'We only support query heads <= 64 with S aux' (measured on the "
            "H100 by suite limits: 96, 128 and 256 heads, GQA, MHA and MQA alike; 64 heads pass)",
        )
    if case.qv and not (case.head_dim <= 64 and case.dv >= 256):
        return Support(False, f"qv with head dims ({case.head_dim}, {case.dv}): FA3 takes qv for d <= 64, dv >= 256")
    return OK


def fa3_vllm_plan(case: AttentionCase, inputs: CaseInputs, scheduler: Any = None) -> KernelCall:
    """The fork's call for ``case`` with every tensor converted (no kernel run).

    ``scheduler`` is ``get_scheduler_metadata`` (only called when the case asks for scheduler metadata).
    """
    t = stored_tensors(case, inputs)
    max_q, max_k = max(case.q_lens), max(case.kv_lens)
    window = fa2_window(case)
    notes: list[str] = []
    if case.paged:
        k, v = t.k_cache, t.v_cache
        assert k is not None and v is not None and case.block_size is not None
        if case.kv_layout == "HND":  # (num_blocks, hk, page, d) memory seen as (num_blocks, page, hk, d)
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        lens: dict[str, Any] = dict(
            seqused_k=torch.tensor(case.kv_lens, dtype=torch.int32, device=inputs.device),
            block_table=inputs.block_table,
        )
    else:
        k, v = t.k, t.v
        lens = dict(cu_seqlens_k=inputs.cu_seqlens_k)
    sinks = None
    if inputs.sinks is not None:
        sinks = inputs.sinks.to(torch.bfloat16)
        notes.append("sinks: passed to s_aux as bf16 (the kernel takes bf16 only; the case's sinks are bf16-exact)")
    kwargs: dict[str, Any] = dict(
        q=t.q,
        k=k,
        v=v,
        max_seqlen_q=max_q,
        cu_seqlens_q=inputs.cu_seqlens_q,
        max_seqlen_k=max_k,
        **lens,
        q_v=t.qv,
        softmax_scale=case.scale,
        causal=case.causal,
        window_size=list(window),
        softcap=case.softcap or 0.0,
        return_softmax_lse=True,
        q_descale=t.q_descale,
        k_descale=t.k_descale,
        v_descale=t.v_descale,
        num_splits=0 if case.num_splits is None else case.num_splits,
        fa_version=3,
        s_aux=sinks,
    )
    totals = cp_totals(inputs, case)
    if totals is not None:  # only a cp call passes them: every other call keeps the fork's defaults
        kwargs.update(
            cp_world_size=case.cp_world,
            cp_rank=case.cp_rank,
            cp_tot_seqused_k=torch.tensor(totals, dtype=torch.int32, device=inputs.device),
        )
    if case.scheduler_metadata:
        assert scheduler is not None, "a scheduler_metadata case needs get_scheduler_metadata"
        lens_k = torch.tensor(case.kv_lens, dtype=torch.int32, device=inputs.device)
        kwargs["scheduler_metadata"] = fa3_scheduler_metadata(case, inputs, scheduler, lens_k, kwargs["num_splits"])
        notes.append("scheduler_metadata: from get_scheduler_metadata with this call's shapes")

    def finish(result: Any) -> KernelOutput:
        out, lse = result
        return KernelOutput(out, lse_posinf_to_neginf(lse))

    return KernelCall(ENTRY, kwargs, finish, tuple(notes))


def fa3_scheduler_metadata(
    case: AttentionCase, inputs: CaseInputs, scheduler: Any, cache_seqlens: torch.Tensor, num_splits: int
) -> torch.Tensor:
    """``get_scheduler_metadata`` for the call of ``case`` with the key counts ``cache_seqlens`` (as vLLM V1's
    ``FlashAttentionMetadataBuilder`` calls it: batch, max query and key lengths, heads, head dims, page size,
    mask, soft-cap, the pinned ``num_splits``)."""
    return scheduler(
        case.batch,
        max(case.q_lens),
        max(case.kv_lens),
        case.num_heads,
        case.num_kv_heads,
        case.head_dim,
        cache_seqlens,
        qkv_dtype=stored_tensors(case, inputs).q.dtype,
        headdim_v=case.dv,
        cu_seqlens_q=inputs.cu_seqlens_q,
        page_size=case.block_size,
        causal=case.causal,
        window_size=fa2_window(case),
        has_softcap=case.softcap is not None,
        num_splits=num_splits,
    )


def fa3_vllm_decided(case: AttentionCase, inputs: CaseInputs, kwargs: Mapping[str, Any], scheduler: Any) -> dict:
    """What the fork decided for the call ``kwargs`` of ``case``: the summary of its scheduler metadata
    (:func:`attnfast.decisions.fa3_vllm_metadata_summary`).  A call that passes ``scheduler_metadata`` runs the plan
    that tensor holds; for one that does not, ``get_scheduler_metadata`` (``scheduler``) computes it with the call's
    own shapes and split count, the same host heuristic and ``prepare_varlen_num_blocks`` kernel ``mha_fwd`` runs
    before the attention kernel (``tests/attnfast/test_decisions.py`` checks on a GPU that passing it to the call
    leaves the output's bits unchanged).  One host read; called after the call, outside the timed region."""
    meta = kwargs.get("scheduler_metadata")
    if meta is None:
        lens_k = torch.tensor(case.kv_lens, dtype=torch.int32, device=inputs.device)
        meta = fa3_scheduler_metadata(case, inputs, scheduler, lens_k, kwargs["num_splits"])
    group = case.num_heads // case.num_kv_heads
    return fa3_vllm_metadata_summary(meta.tolist(), case.q_lens, group, fa3_vllm_head_swizzle(case))


class FA3VllmBackend(Backend):
    """vLLM's FA3 fork on Hopper: varlen, paged, fp8, qv, sinks, splits, scheduler metadata, context parallel."""

    name = "fa3-vllm"
    family = "vllm-flash-attn-3"
    description = "vLLM's FA3 fork (vllm.vllm_flash_attn, fa_version=3): varlen + paged, fp8, q_v, s_aux"
    accepts = frozenset({"fp8_e4m3", "descale_head", "qv", "v_pad", "sched_meta", "cp", "graph"})
    #: ``vllm.vllm_flash_attn.flash_attn_varlen_func(..., num_splits=0, ...)`` (vLLM 0.24.0), what vLLM's
    #: batch-invariant mode pins to 1
    batch_invariance_via = "num_splits"
    refused = {
        "alibi": "'Alibi is not supported in FA3' (the wrapper's assertion, measured)",
        "append": "by the wrapper: flash_attn_varlen_func passes no new keys (k_new/v_new = None); vLLM writes "
        "the cache with reshape_and_cache_flash before the call",
        "local_chunk": "by the wrapper: the fork's flash_attn_varlen_func has no attention_chunk argument (vLLM "
        "builds chunked local attention from virtual batches instead)",
        "fp32": "'FlashAttention only supports fp16, bf16, and fp8_e4m3 data type' (measured)",
        "fp8_e5m2": "'FlashAttention only supports fp16, bf16, and fp8_e4m3 data type' (measured with e5m2 q/k/v)",
        "fp8_kv_only": "'query and key must have the same dtype' (measured with bf16 q, fp8 k/v)",
        "int8_t1": "FA3 takes fp16, bf16 and fp8_e4m3 (seed 001's int8 path is a vendor kernel, "
        "flash_attn_varlen_int8_func, that vLLM does not ship)",
        "int8_t2": "FA3 takes fp16, bf16 and fp8_e4m3 (seed 001's int8 path is a vendor kernel, "
        "flash_attn_varlen_int8_func, that vLLM does not ship)",
    }

    def version(self) -> str:
        return vllm_version()

    def is_available(self) -> Support:
        return vllm_kernel_support(import_vllm_fa3, f"{FA3_MODULE} (FA3)")

    def supports(self, case: AttentionCase, device: str) -> Support:
        base = super().supports(case, device)
        return base if not base else fa3_vllm_support(kernel_case(case), compute_capability(device))

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> PreparedKernel:
        if case.v_padded:
            return prepare_padded_v(self.prepare, case, inputs)
        mod = import_vllm_fa3()
        call = fa3_vllm_plan(case, inputs, mod.get_scheduler_metadata)
        decided = functools.partial(fa3_vllm_decided, case, inputs, call.kwargs, mod.get_scheduler_metadata)
        return PreparedKernel(mod.flash_attn_varlen_func, dataclasses.replace(call, decided=decided))

    def prepare_graph(self, case: AttentionCase, inputs: CaseInputs) -> GraphKernel:
        """vLLM V1's full-CUDA-graph call: ``seqused_k`` bound to the live key counts; with scheduler metadata
        (``sched_meta``), the metadata computed for the bucket is the captured buffer, and ``refresh()``
        recomputes it for the live key counts before every replay and copies it in place (zeroing the rest), as
        the builder copies into its preallocated ``scheduler_metadata`` buffer; ``num_splits`` stays the case's
        (pinned) value at capture and replay."""
        mod = import_vllm_fa3()
        call = fa3_vllm_plan(case, inputs, mod.get_scheduler_metadata)
        refresh = None
        if case.scheduler_metadata:
            buffer = call.kwargs["scheduler_metadata"]
            splits = call.kwargs["num_splits"]

            def refresh() -> None:
                fresh = fa3_scheduler_metadata(case, inputs, mod.get_scheduler_metadata, inputs.seqlens_k, splits)
                if fresh.numel() > buffer.numel():
                    raise ValueError(
                        f"scheduler_metadata of {fresh.numel()} entries does not fit the captured buffer of "
                        f"{buffer.numel()} (bucket of {case.batch} requests)"
                    )
                buffer.view(-1)[: fresh.numel()].copy_(fresh.view(-1))
                buffer.view(-1)[fresh.numel() :].zero_()

        return GraphKernel(mod.flash_attn_varlen_func, call, {"seqused_k": inputs.seqlens_k}, refresh)
