"""flash-attn 2.x (``flash_attn``): ``flash_attn_varlen_func`` and ``flash_attn_with_kvcache``.

Entry point per case (:func:`fa2_entry`):

* ``flash_attn_with_kvcache`` when the case appends (only that entry point writes new keys into the cache), pins
  ``num_splits > 1`` (only that entry point takes ``num_splits``), or is a decode / spec-decode batch (every request
  has the same ``q_len`` in ``1..16``).  Queries become a padded ``(b, q_len, h, d)`` view; ``cache_seqlens`` (int32)
  holds the keys already in the cache (``kv_len - q_len`` when appending, ``kv_len - append_len`` for a short append,
  else ``kv_len``); the new keys ``k``/``v`` are ``(b, seqlen_new, hk, d)`` with ``seqlen_new`` the case's
  ``append_len`` (else ``q_len``): ``flash_attn_with_kvcache`` (2.8.3) writes them at ``cache_seqlens`` and aligns the
  query rows to the end of ``cache_seqlens + seqlen_new`` keys, as the peer test
  ``tests/test_flash_attn.py::test_flash_attn_kvcache`` (2.8.3, ``seqlen_new_eq_seqlen_q=False``) checks it; an uneven
  append (``append_lens``, a count per request) is refused: ``k`` is dense, ``CHECK_SHAPE(k, batch_size, seqlen_knew,
  num_heads_k, head_size_og)`` in ``mha_fwd_kvcache`` (``csrc/flash_attn/flash_api.cpp``, 2.8.3), and
  ``flash_attn_varlen_func`` writes no cache; the cache is the paged cache with ``block_table``, or a contiguous ``(b,
  max_kv, hk, d)`` copy whose unused slots hold stale finite values.  ``num_splits`` is the case's, or FA2's own
  heuristic (0) when the case leaves it unset (the path engines run); cases that need a pinned split count say so.
* ``flash_attn_varlen_func`` otherwise: packed q/k/v with ``cu_seqlens_q/k``; with a paged cache k/v are the caches,
  ``block_table`` addresses them and ``cu_seqlens_k`` (cumulative kv lengths) is read only for the lengths
  (``block_info.h``: the key offset comes from the block table).

Outputs: LSE ``+inf`` of rows that saw no key becomes ``-inf``.  ALiBi: on FA2's causal path
(:func:`attnfast._fa_common.fa2_alibi_uses_causal_form`) the kernel adds ``+slope * j`` and its LSE is larger by
``slope * (i + sk - sq)``; the adapter subtracts that (read from ``alibi.h``/``mask.h``;
``tests/attnfast/test_fa2.py::test_gpu_alibi_lse_form`` shows which form the kernel really uses) and declares the
kernel's fp32 rounding at that magnitude as the rows' ``lse_slack``
(:func:`attnfast._fa_common.alibi_causal_lse_slack`).

Known FA2 behaviour left visible on purpose (flash-attention issue 895): FA2 normalises the window against
``max_seqlen_k`` without the bottom-right offset ``sk - sq`` (:func:`attnfast._fa_common.fa2_kernel_window`); the
adapter passes the window as a user would, the check reports the mismatch and ``ledgers/fa2.toml`` explains it.
Paged + ``num_splits > 1`` runs through ``flash_attn_with_kvcache``: only ``varlen_fwd`` rejects it
(``flash_api.cpp`` 2.8.3, "num_splits > 1 is not supported for varlen paged KV").

Backward (``prepare_backward``, :mod:`attnfast.autograd`): ``flash_attn_varlen_func`` on leaf q/k/v through its
``autograd.Function`` (``FlashAttnVarlenFunc``, 2.8.3), with the forward's scale, causal flag, window, soft-cap and
ALiBi slopes, and ``deterministic=case.deterministic``.  Every backward case takes this entry point, decode shapes
included (the kvcache entry point has no backward).  The LSE gets the same ALiBi and ``+inf`` corrections as the
forward's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

from ._fa_common import (
    KernelCall,
    GraphKernel,
    PreparedKernel,
    call_variant,
    cuda_device_support,
    fa2_alibi_fix,
    fa2_window,
    kvcache_caches,
    lse_posinf_to_neginf,
    padded_lse_to_varlen,
    padded_new_tokens,
    prepare_padded_v,
    sm_count,
    uniform_q_len,
)
from .decisions import fa2_split_decision
from .autograd import AutogradBackward, grad_leaves
from .base import OK, Backend, KernelOutput, Support, package_version

__all__ = [
    "FA2Backend",
    "fa2_entry",
    "fa2_kvcache_min_width",
    "fa2_plan",
    "MAX_DECODE_Q_LEN",
    "PAGE_MULTIPLE",
    "MAX_HEAD_DIM",
]

#: Largest common q_len routed to flash_attn_with_kvcache (decode and speculative decode).
MAX_DECODE_Q_LEN = 16
#: FA2 paged KV: "Paged KV cache block size must be divisible by 256" (flash_api.cpp).
PAGE_MULTIPLE = 256
#: "FlashAttention forward only supports head dimension at most 256".
MAX_HEAD_DIM = 256

VARLEN = "flash_attn.flash_attn_varlen_func"
KVCACHE = "flash_attn.flash_attn_with_kvcache"


def fa2_entry(case: AttentionCase) -> str:
    """:data:`KVCACHE` or :data:`VARLEN` for ``case`` (see the module docstring)."""
    q_len = uniform_q_len(case)
    splits = case.num_splits is not None and case.num_splits > 1
    if case.append or splits:
        return KVCACHE
    if q_len is not None and 1 <= q_len <= MAX_DECODE_Q_LEN:
        return KVCACHE
    return VARLEN


def fa2_kvcache_min_width(case: AttentionCase) -> int:
    """The keys per sequence the cache of ``case``'s ``flash_attn_with_kvcache`` call holds at least (the
    ``min_width`` of :func:`attnfast._fa_common.kvcache_caches`), always >= 1: ``ngroups`` for a one-token append
    with a GQA group, ``q_len`` for an append of more tokens, 1 without an append (and for an append that has no
    one q_len >= 1, which :func:`_shape_support` refuses).  The cache's width is the ``seqlen_k`` FA2 normalises a
    window against (:func:`attnfast._fa_common.fa2_kernel_window`; the ledger field ``fa2_window_misread``)."""
    # FA2 runs a one-token GQA call (without window or ALiBi, after clamping window sides >= the cache width) as
    # ngroups query rows of hk heads (seqlenq_ngroups_swapped) and then demands "If key is supplied, it must have
    # seqlen <= the seqlen of the KV cache" of those ngroups rows: an appending call needs a cache at least
    # ngroups wide (the fuzzer on the H100: MQA 2/1 appending one token to an empty cache of width 1).  The
    # capacity changes no result (cache_seqlens bounds the keys), so every one-token GQA append gets it.  Any
    # appending call is held to the same check with seqlen_q = q_len (flash_api.cpp, mha_fwd_kvcache: "seqlen_q <=
    # seqlen_k"): a short append of q_len tokens into a cache narrower than q_len (peer-fa2-kvcache on the H100:
    # q_len 128, kv_lens 127/126, append_len 126) needs the cache q_len wide.
    q_len = uniform_q_len(case)
    if not case.append or not q_len:
        return 1
    return case.num_heads // case.num_kv_heads if q_len == 1 else q_len


def _shape_support(case: AttentionCase) -> Support:
    if max(case.head_dim, case.dv) > MAX_HEAD_DIM:
        return Support(False, f"head dim {case.head_dim}: FA2 supports head dims up to {MAX_HEAD_DIM}")
    if case.block_size is not None and case.block_size % PAGE_MULTIPLE:  # set exactly when paged
        return Support(
            False,
            f"block size {case.block_size}: FA2 paged KV needs a block size divisible by {PAGE_MULTIPLE}",
        )
    q_len = uniform_q_len(case)
    if not case.backward and fa2_entry(case) == KVCACHE and (q_len is None or q_len < 1):  # backward: varlen
        why = "append" if case.append else f"num_splits={case.num_splits}"
        return Support(
            False,
            f"{why} needs flash_attn_with_kvcache, which takes one q_len >= 1 for the whole batch; "
            f"this case has q_lens {sorted(set(case.q_lens))}",
        )
    return OK


def fa2_plan(case: AttentionCase, inputs: CaseInputs, num_sms: int | None = None) -> KernelCall:
    """The FA2 call for ``case`` with every tensor converted (no kernel import, no kernel run).

    ``num_sms``: the GPU's SM count; given, the call's variant carries the split-KV decision FA2 takes on that GPU
    (:func:`attnfast.decisions.fa2_split_decision`: ``fa2_num_splits``, ``fa2_splitkv``)."""
    window = fa2_window(case)
    common: dict[str, Any] = {
        "softmax_scale": case.scale,
        "causal": case.causal,
        "window_size": window,
        "softcap": case.softcap or 0.0,
        "alibi_slopes": inputs.alibi_slopes,
    }
    if fa2_entry(case) == VARLEN:
        call = _varlen_call(case, inputs, common, window)
        seqlen_k = call.kwargs["max_seqlen_k"]
    else:
        call = _kvcache_call(case, inputs, common, window)
        table, page = call.kwargs["block_table"], call.kwargs["k_cache"].shape[1]
        seqlen_k = page if table is None else table.shape[1] * page  # mha_fwd_kvcache: the cache width, table's reach
    if num_sms is None:
        return call
    decided = fa2_split_decision(case, call.entry == KVCACHE, seqlen_k, num_sms)
    return dataclasses.replace(call, variant=decided)


def _varlen_call(case: AttentionCase, inputs: CaseInputs, common: dict, window: tuple[int, int]) -> KernelCall:
    max_k = max(case.kv_lens)
    k, v = (inputs.k_cache, inputs.v_cache) if case.paged else (inputs.k, inputs.v)
    kwargs = dict(
        q=inputs.q,
        k=k,
        v=v,
        cu_seqlens_q=inputs.cu_seqlens_q,
        cu_seqlens_k=inputs.cu_seqlens_k,
        max_seqlen_q=max(case.q_lens),
        max_seqlen_k=max_k,
        dropout_p=0.0,
        return_attn_probs=True,  # (out, lse, S); S is not materialised without dropout
        block_table=inputs.block_table if case.paged else None,
        **common,
    )
    shift, slack, notes = fa2_alibi_fix(case, inputs, window, max_k)

    def finish(result: Any) -> KernelOutput:
        out, lse = result[0], lse_posinf_to_neginf(result[1])
        return KernelOutput(out, lse if shift is None else lse - shift, slack)

    return KernelCall(VARLEN, kwargs, finish, notes)


def _kvcache_call(case: AttentionCase, inputs: CaseInputs, common: dict, window: tuple[int, int]) -> KernelCall:
    q_len = uniform_q_len(case)
    assert q_len is not None and q_len >= 1, "supports() refuses kvcache cases without one q_len >= 1"
    k_cache, v_cache, table, cache_seqlens, width = kvcache_caches(case, inputs, fa2_kvcache_min_width(case))
    # a short append (append_len < q_len) passes seqlen_new = append_len: FA2 takes any seqlen_new <= the cache width
    k_new, v_new = padded_new_tokens(inputs, case.new_kv_lens[0]) if case.append else (None, None)
    h, d = case.num_heads, case.head_dim
    kwargs = dict(
        q=inputs.q.view(case.batch, q_len, h, d),
        k_cache=k_cache,
        v_cache=v_cache,
        k=k_new,
        v=v_new,
        cache_seqlens=cache_seqlens,
        block_table=table,
        num_splits=0 if case.num_splits is None else case.num_splits,
        return_softmax_lse=True,
        **common,
    )
    shift, slack, notes = fa2_alibi_fix(case, inputs, window, width)
    total_q, dv = case.total_q, case.dv

    def finish(result: Any) -> KernelOutput:
        out, lse = result
        lse = padded_lse_to_varlen(lse_posinf_to_neginf(lse))
        return KernelOutput(out.reshape(total_q, h, dv), lse if shift is None else lse - shift, slack)

    return KernelCall(KVCACHE, kwargs, finish, notes)


class FA2Backend(Backend):
    """flash-attn 2.x on CUDA (sm80+); see the module docstring for the translation."""

    name = "fa2"
    family = "flash-attn-2"
    description = (
        "flash-attn 2.x: flash_attn_varlen_func (prefill, chunked, paged), "
        "flash_attn_with_kvcache (decode, append, splits)"
    )
    refused = {
        "sinks": "FA2 has no attention-sink argument",
        "local_chunk": "FA2 has no chunked local attention (attention_chunk is FA3's)",
        "fp32": "FA2 takes fp16 and bf16 inputs only",
        "dv": "FA2 needs the value head dim equal to the qk head dim",
        "hnd": "FA2 reads NHD pages (num_blocks, block_size, hk, d) only",
        "append_quant": "FA2 takes fp16 and bf16 inputs only: it has no quantized cache to append to",
        "append_uneven": "flash_attn_with_kvcache (2.8.3) takes the new keys as one dense (batch, seqlen_new, hk, d) "
        "tensor (flash_api.cpp mha_fwd_kvcache: CHECK_SHAPE(k, batch_size, seqlen_knew, ...)), one count for every "
        "request; flash_attn_varlen_func writes no cache",
    }
    #: seed 004's path for FA2: V zero-padded to the qk head dim, output stripped; the backward of
    #: flash_attn_varlen_func and its ``deterministic`` argument.
    accepts = frozenset({"v_pad", "graph", "backward", "bwd_deterministic", "append_short"})
    #: ``flash_attn_with_kvcache(..., num_splits=0, ...)`` (2.8.3); ``flash_attn_varlen_func`` takes none, hence
    #: :meth:`pins_splits`.
    batch_invariance_via = "num_splits"

    def version(self) -> str:
        return package_version("flash-attn", "flash_attn")

    def pins_splits(self, case: AttentionCase) -> bool:
        """Only ``flash_attn_with_kvcache`` takes ``num_splits`` (:func:`fa2_entry`)."""
        return super().pins_splits(case) and fa2_entry(case) == KVCACHE

    def is_available(self) -> Support:
        try:
            from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache  # noqa: F401
        except ImportError as exc:  # flash-attn-4 alone installs a flash_attn namespace without these
            return Support(False, f"flash-attn 2.x is not importable: {exc}")
        return cuda_device_support(min_major=8)

    def supports(self, case: AttentionCase, device: str) -> Support:
        base = super().supports(case, device)
        return base if not base else _shape_support(case.padded_v_call())

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> PreparedKernel:
        if case.v_padded:
            return prepare_padded_v(self.prepare, case, inputs)
        import flash_attn

        call = fa2_plan(case, inputs, sm_count(inputs.device))
        fn = getattr(flash_attn, call.entry.rsplit(".", 1)[1])
        return PreparedKernel(fn, call)

    def prepare_graph(self, case: AttentionCase, inputs: CaseInputs) -> GraphKernel:
        """The bucket's call with ``cache_seqlens`` bound to the live key counts (``flash_attn_with_kvcache``,
        vLLM V0's and SGLang's decode); the varlen entry reads the live ``cu_seqlens_k`` buffer already."""
        import flash_attn

        call = fa2_plan(case, inputs)
        live = {"cache_seqlens": inputs.seqlens_k} if call.entry == KVCACHE else {}
        return GraphKernel(getattr(flash_attn, call.entry.rsplit(".", 1)[1]), call, live)

    def prepare_backward(self, case: AttentionCase, inputs: CaseInputs) -> AutogradBackward:
        """``flash_attn_varlen_func`` through autograd on leaf q/k/v (see the module docstring)."""
        import flash_attn

        window = fa2_window(case)
        max_k = max(case.kv_lens)
        shift, slack, notes = fa2_alibi_fix(case, inputs, window, max_k)
        kwargs = dict(
            cu_seqlens_q=inputs.cu_seqlens_q,
            cu_seqlens_k=inputs.cu_seqlens_k,
            max_seqlen_q=max(case.q_lens),
            max_seqlen_k=max_k,
            dropout_p=0.0,
            softmax_scale=case.scale,
            causal=case.causal,
            window_size=window,
            softcap=case.softcap or 0.0,
            alibi_slopes=inputs.alibi_slopes,
            deterministic=case.deterministic,
            return_attn_probs=True,  # (out, lse, S); S is not materialised without dropout
        )

        def forward(leaves: Any) -> tuple[Any, Any]:
            out, lse, _ = flash_attn.flash_attn_varlen_func(leaves.q, leaves.k, leaves.v, **kwargs)
            lse = lse_posinf_to_neginf(lse.detach())
            return out, lse if shift is None else lse - shift

        variant = call_variant(VARLEN, kwargs)  # the entry point and deterministic
        return AutogradBackward(
            forward, grad_leaves(inputs), inputs.dout, notes=notes, lse_slack=slack, variant=variant
        )
