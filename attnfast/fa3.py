"""flash-attn 3 (the Hopper build, module ``flash_attn_interface``).  UNVERIFIED on a GPU.

FA3 has no package on the index (``docs/concepts/backends.md`` says how it stands on a GPU); the translation
follows ``hopper/flash_attn_interface.py`` and ``hopper/flash_api.cpp``
(flash-attention main) and is tested on CPU against ``tests/attnfast/fake_fa3.py``, a fake module
that implements the documented conventions with :mod:`attnref`.  Treat results as unverified until
``tests/attnfast/test_fa3.py``'s GPU tests pass against a real build.

Entry point per case (:func:`fa3_entry`):

* ``flash_attn_varlen_func`` for contiguous KV without append: packed q/k/v, ``cu_seqlens_q/k``,
  ``max_seqlen_q/k``, ``return_attn_probs=True`` for ``(out, lse)``;
* ``flash_attn_with_kvcache`` for paged KV or append: q stays packed (``cu_seqlens_q``,
  ``max_seqlen_q``); ``page_table`` is the block table (any page size); ``cache_seqlens`` (int32)
  counts the keys already in the cache (``kv_len - n`` when appending ``n`` keys per request: ``q_len``, the
  case's ``append_len`` for a short append, or ``append_lens[b]`` for an uneven one); new keys are packed
  ``k``/``v`` ``(total_k_new, hk, d)`` with ``cu_seqlens_k_new`` (their cumulative counts, ``cu_seqlens_q`` when
  every query is a new key; ``hopper/flash_api.cpp`` ``mha_fwd``: ``k_new`` is ``(b, s_k_new, h_k, d) or
  (total_k_new, h_k, d) if there is cu_seqlens_k_new``, so each request has its own count, as
  ``test_flash_attn_kvcache``'s ``varlen_q`` appends pass them; hopper/test_flash_attn.py
  ``test_flash_attn_kvcache`` at commit 01afd16d, ``seqlen_new_eq_seqlen_q=False``, aligns the query rows to the end
  of ``cache_seqlens + seqlen_new`` keys); a contiguous
  appending case gets a ``(b, max_kv, hk, d)`` cache whose unused slots hold stale finite values.
  An HND cache is passed as its ``(num_blocks, page, hk, d)`` strided view (FA3 reads the cache
  through its strides, as vLLM does for HND layouts).

Translations: window ``-1`` = unbounded (:func:`attnref.window_to_fa2`); ``attention_chunk`` = the
case's chunk (0 = off); ``softcap`` 0 = off; ``num_splits`` the case's, or FA3's heuristic (0)
when unset (the engines' path; suites pin it in separate cases).  LSE ``(h, total_q)``: ``-inf`` for
rows that saw no key, but ``+inf`` for the whole batch when it has no key at all
(``flash_api.cpp``: ``softmax_lse.fill_(infinity)``), normalised to ``-inf``.

Limits (``flash_api.cpp``): head dims <= 256, multiples of 8; ``d != dv`` only for d in (128, 192]
with dv in (96, 128], or d <= 64 with dv <= 512, and only on Hopper.  No ALiBi, no sinks upstream.
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType
from typing import Any


from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

from ._fa_common import (
    KernelCall,
    PreparedKernel,
    compute_capability,
    cuda_device_support,
    fa2_window,
    kvcache_caches,
    lse_posinf_to_neginf,
    sm_count,
)
from .base import OK, Backend, KernelOutput, Support, package_version
from .decisions import fa3_decision

__all__ = ["FA3Backend", "fa3_entry", "fa3_plan", "fa3_shape_support", "import_fa3"]

VARLEN = "flash_attn_interface.flash_attn_varlen_func"
KVCACHE = "flash_attn_interface.flash_attn_with_kvcache"
#: Where Hopper builds put the interface: the top-level module, or inside the flash_attn_3 package.
MODULES = ("flash_attn_interface", "flash_attn_3.flash_attn_interface")


def import_fa3() -> ModuleType:
    """The FA3 interface module; ``ImportError`` naming every place looked at."""
    errors = []
    for name in MODULES:
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
    raise ImportError("flash-attn 3 (Hopper build) is not importable: " + "; ".join(errors))


def fa3_entry(case: AttentionCase) -> str:
    """:data:`KVCACHE` for paged or appending cases, else :data:`VARLEN`."""
    return KVCACHE if case.paged or case.append else VARLEN


def fa3_shape_support(case: AttentionCase, cc: tuple[int, int] | None) -> Support:
    """FA3's head-dim limits for ``case``; ``cc`` None skips the Hopper-only check."""
    d, dv = case.head_dim, case.dv
    if d > 256 or (dv > 256 and d == dv):
        return Support(
            False, f"head dims ({d}, {dv}): 'FlashAttention forward only supports head dimension at most 256'"
        )
    if d % 8 or dv % 8:
        return Support(False, f"head dims ({d}, {dv}): FA3 needs head dims divisible by 8 for 16-bit inputs")
    if d != dv:
        if not ((128 < d <= 192 and 96 < dv <= 128) or (d <= 64 and dv <= 512)):
            return Support(
                False,
                f"head dims ({d}, {dv}): FA3 takes d != dv only for d in (128, 192] with dv in (96, 128], or d <= 64",
            )
        if cc is not None and cc[0] != 9:
            return Support(False, f"head dims ({d}, {dv}): FA3 supports a different V head dim on Hopper (sm_90) only")
    return OK


def fa3_plan(case: AttentionCase, inputs: CaseInputs, num_sms: int | None = None) -> KernelCall:
    """The FA3 call for ``case`` with every tensor converted (no kernel import, no kernel run).

    ``num_sms``: the SM count of the sm_90 GPU it runs on; given, the call's variant carries what FA3's host code
    decides there (:func:`attnfast.decisions.fa3_decision`: ``fa3_max_splits``, ``fa3_pack_gqa``)."""
    common: dict[str, Any] = dict(
        softmax_scale=case.scale,
        causal=case.causal,
        window_size=fa2_window(case),
        attention_chunk=case.chunk or 0,
        softcap=case.softcap or 0.0,
        num_splits=0 if case.num_splits is None else case.num_splits,
    )
    if fa3_entry(case) == VARLEN:
        kwargs = dict(
            q=inputs.q,
            k=inputs.k,
            v=inputs.v,
            cu_seqlens_q=inputs.cu_seqlens_q,
            cu_seqlens_k=inputs.cu_seqlens_k,
            max_seqlen_q=max(case.q_lens),
            max_seqlen_k=max(case.kv_lens),
            return_attn_probs=True,
            **common,
        )
        return _with_decision(KernelCall(VARLEN, kwargs, _finish), case, max(case.kv_lens), num_sms)
    # an appending call needs a cache at least max_seqlen_q wide (flash_api.cpp: "If k_new is supplied, it must have
    # seqlen <= the seqlen of the KV cache" checks seqlen_q <= seqlen_k): a short append can leave it narrower
    k_cache, v_cache, table, cache_seqlens, width = kvcache_caches(case, inputs, max(case.q_lens) if case.append else 1)
    kwargs = dict(
        q=inputs.q,
        k_cache=k_cache,
        v_cache=v_cache,
        k=inputs.k_new if case.append else None,
        v=inputs.v_new if case.append else None,
        cache_seqlens=cache_seqlens,
        page_table=table,
        cu_seqlens_q=inputs.cu_seqlens_q,
        cu_seqlens_k_new=inputs.cu_seqlens_k_new if case.append else None,
        max_seqlen_q=max(case.q_lens),
        return_softmax_lse=True,
        **common,
    )
    return _with_decision(KernelCall(KVCACHE, kwargs, _finish), case, width, num_sms)


def _with_decision(call: KernelCall, case: AttentionCase, seqlen_k: int, num_sms: int | None) -> KernelCall:
    """``call`` with FA3's host decision in its variant (``seqlen_k``: what ``mha_fwd`` reads as such: ``max_seqlen_k``
    for varlen, the cache width for kvcache, which passes none)."""
    if num_sms is None:
        return call
    element_size = call.kwargs["q"].element_size()
    decided = fa3_decision(case, call.entry == KVCACHE, seqlen_k, num_sms, element_size)
    return dataclasses.replace(call, variant=decided)


def _finish(result: Any) -> KernelOutput:
    """``(out, lse, ...)`` from either entry point (kvcache returns 4 values with the LSE)."""
    return KernelOutput(result[0], lse_posinf_to_neginf(result[1]))


class FA3Backend(Backend):
    """flash-attn 3 (Hopper build) on CUDA.  Unverified: see the module docstring."""

    name = "fa3"
    family = "flash-attn-3"
    description = "flash-attn 3 Hopper build (flash_attn_interface), UNVERIFIED: varlen and kvcache"
    refused = {
        "alibi": "FA3 has no ALiBi argument",
        "sinks": "upstream FA3 (hopper/flash_attn_interface.py) has no attention-sink argument",
        "fp32": "FA3 takes fp16, bf16 and fp8 e4m3 inputs only",
        "append_quant": (
            "this adapter passes no fp8 inputs (fp8_e4m3 undeclared); FA3's fp8 append would pass k/v already in "
            "e4m3 with the cache's k_descale/v_descale (hopper/test_flash_attn.py test_flash_attn_kvcache)"
        ),
    }
    #: short and uneven appends: packed new keys with their own cu_seqlens_k_new (see the module docstring)
    accepts = frozenset({"append_short", "append_uneven"})
    #: both entry points take ``num_splits`` (``hopper/flash_attn_interface.py``: ``flash_attn_varlen_func``,
    #: ``flash_attn_with_kvcache``)
    batch_invariance_via = "num_splits"

    def version(self) -> str:
        return package_version("flash_attn_3", "flash-attn-3")

    def is_available(self) -> Support:
        try:
            import_fa3()
        except ImportError as exc:
            return Support(False, str(exc))
        return cuda_device_support(min_major=8)

    def supports(self, case: AttentionCase, device: str) -> Support:
        base = super().supports(case, device)
        return base if not base else fa3_shape_support(case, compute_capability(device))

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> PreparedKernel:
        """The call, with FA3's host decision in its variant on an sm_90 GPU (the one architecture
        :func:`attnfast.decisions.fa3_decision` reproduces)."""
        sm90 = compute_capability(inputs.device) == (9, 0)
        call = fa3_plan(case, inputs, sm_count(inputs.device) if sm90 else None)
        fn = getattr(import_fa3(), call.entry.rsplit(".", 1)[1])
        return PreparedKernel(fn, call)
