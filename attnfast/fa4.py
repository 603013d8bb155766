"""flash-attn 4 (package ``flash-attn-4``, module ``flash_attn.cute``): ``flash_attn_varlen_func``.

One entry point for every case:

* contiguous KV: packed q/k/v with ``cu_seqlens_q``/``cu_seqlens_k`` and integer max lengths;
* paged KV: k/v are the ``(num_pages, page_size, hk, d)`` caches, ``page_table`` the block table
  (int32) and ``seqused_k`` the kv lengths; ``cu_seqlens_k`` is left out because FA4 asserts
  "page_table is not supported with cu_seqlens_k".  Slots past ``seqused_k`` in a partially used
  page must be finite (FA4's docstring: P = 0 times a NaN V row is NaN); the case inputs fill them
  with large finite stale values.

Translations: window via :func:`attnref.window_to_fa4` (``None`` = unbounded; FA4 takes negatives
literally, so FA2's ``-1`` must never reach it) plus ``causal``; ``learnable_sink`` is the case's
fp32 ``(h,)`` sinks (FA4 accepts fp16/bf16/fp32: ``_LEARNABLE_SINK_DTYPES``; fp32 keeps the values
the reference uses); ``softcap`` 0 = off; ``num_splits`` the case's or 1 (FA4's default);
``return_lse=True`` gives ``(h, total_q)`` with ``-inf`` (or the sink) for rows that saw no key,
already the reference convention.

Limits by compute capability (``flash_attn/cute/interface.py``, 4.0.0b30 and main; measured on an
H200 with 4.0.0b36, ``SEMANTICS.md`` section 5): sm_90 refuses ``num_splits > 1`` ("SplitKV not
supported on SM 9.0"); head dims 8..256 divisible by 8 on sm_90, and of the ``d != dv`` pairs only
(192, 128) is measured there, so the others are refused until a GPU run shows them; SM100/110 take
d, dv <= 128, (192, 128) or (256, 256).  sm_80 and sm_120 have no paged KV and no split KV.  On
sm_90 a page size other than FA4's key tile (:func:`fa4_sm90_tile_n`) takes the non-TMA paged
loader, which asserts "Paged KV does not support irregular head dim" when a head dim is not a
multiple of 16 (measured on the H100: d40 with pages 1/16/32/64/256; page 128 = tile_n runs).

Backward (``prepare_backward``, :mod:`attnfast.autograd`): ``flash_attn_varlen_func`` through its
``FlashAttnVarlenFunc`` autograd rule on leaf q/k/v (and the fp32 ``learnable_sink`` as a leaf, so d(sinks) is the
kernel's ``dsink``), ``deterministic=case.deterministic`` (semaphore-ordered dQ/dK/dV accumulation), ``softcap`` 0.0
when off (the backward builds a soft-cap score_mod for any value ``!= 0.0``, so ``None`` would reach it; SEMANTICS
section 12 saw a compile error with ``softcap=None``).  What ``_flash_attn_bwd`` refuses (``flash_attn/cute/
interface.py`` and ``flash_bwd_sm90.py`` at the fa4-v4.0.0.beta27 tag, 2026-08-15, the newest source in reach; the
installed 4.0.0b36 is later): no backward on sm_8x ("Unsupported compute capability. Supported: 9.x, 10.x, 11.x,
12.x"); sm_90 GQA needs ``d == dv`` ("GQA backward requires head_dim == head_dim_v"); sm_12x has no deterministic,
score_mod (soft-cap) or learnable-sink backward; SM100/110 at (256, 256) has no soft-cap or sink backward.
:func:`fa4_backward_support` mirrors those asserts.
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
    compute_capability,
    cuda_device_support,
    fa4_window,
    prepare_padded_v,
)
from .autograd import AutogradBackward, grad_leaves
from .base import OK, Backend, KernelOutput, Support, package_version

__all__ = [
    "FA4Backend",
    "fa4_backward_support",
    "fa4_plan",
    "fa4_shape_support",
    "fa4_sm90_local",
    "fa4_sm90_tile_n",
]

ENTRY = "flash_attn.cute.flash_attn_varlen_func"
SM90_DV_PAIRS = {(192, 128)}


def fa4_causal_window(case: AttentionCase) -> tuple[int | None, int | None]:
    """The case's FA4 window with causal's right side 0 applied, as FA4 sets it before it normalises."""
    left, right = fa4_window(case)
    return left, 0 if case.causal else right


def fa4_sm90_local(case: AttentionCase) -> tuple[bool, bool]:
    """(causal, local) as FA4 sees the case after its own window normalisation (``interface.py``): causal
    plus an unbounded left side is causal; any other window, causal or not, is local."""
    left, right = fa4_causal_window(case)
    if left is None and right is None:
        return case.causal, False
    if left is None and right == 0:
        return True, False
    return False, True


def fa4_sm90_tile_n(case: AttentionCase) -> int:
    """FA4's key-tile width on sm_90 (``_tile_size_fwd_sm90`` in ``flash_attn/cute/interface.py``,
    4.0.0b36).  A paged cache whose page size equals it is read with TMA; any other page size takes
    the non-TMA paged loader."""
    causal, local = fa4_sm90_local(case)
    d, dv = case.head_dim, case.dv
    if d <= 64:
        return 128
    if d <= 96:
        return 128 if causal or local else 144
    if d <= 128:
        return 128
    if d <= 192:
        return 96 if local else (128 if dv <= 128 else 112)
    return 64 if local else 80


def fa4_shape_support(case: AttentionCase, cc: tuple[int, int]) -> Support:
    """What FA4 refuses for ``case`` on a GPU of compute capability ``cc`` (see the module docstring)."""
    major = cc[0]
    d, dv = case.head_dim, case.dv
    arch = f"sm_{major}{cc[1]}"
    splits = case.num_splits is not None and case.num_splits > 1
    if splits and major in (8, 9, 12):
        return Support(False, f"num_splits={case.num_splits}: SplitKV not supported on {arch} (FA4 asserts it)")
    if case.paged and major in (8, 12):
        return Support(False, f"paged KV: FA4 has no paged KV on {arch}")
    if d % 8 or dv % 8:
        return Support(False, f"head dims ({d}, {dv}): FA4 needs head dims divisible by 8 for 16-bit inputs")
    if major == 9:
        if case.paged and (d % 16 or dv % 16) and case.block_size != fa4_sm90_tile_n(case):
            return Support(
                False,
                f"paged KV, head dims ({d}, {dv}), page {case.block_size}: on {arch} a page size other than FA4's "
                f'tile_n ({fa4_sm90_tile_n(case)}) takes the non-TMA loader, which asserts "Paged KV does not '
                'support irregular head dim" for head dims not divisible by 16',
            )
        if not (8 <= d <= 256 and 8 <= dv <= 256):
            return Support(False, f"head dims ({d}, {dv}): FA4 on {arch} takes head dims 8..256")
        if d != dv and (d, dv) not in SM90_DV_PAIRS:
            return Support(
                False,
                f"head dims ({d}, {dv}): on {arch} FA4's d != dv is measured only for {sorted(SM90_DV_PAIRS)}",
            )
    elif major in (10, 11):
        if not ((d <= 128 and dv <= 128) or (d, dv) in ((192, 128), (256, 256))):
            return Support(False, f"head dims ({d}, {dv}): FA4 on {arch} takes d, dv <= 128, (192, 128) or (256, 256)")
    elif d != dv or d > 256:
        return Support(False, f"head dims ({d}, {dv}): FA4 on {arch} is only known to take d == dv <= 256")
    return OK


_BWD_SOURCE = "FA4's _flash_attn_bwd (flash_attn/cute/interface.py, fa4-v4.0.0.beta27)"


def fa4_backward_support(case: AttentionCase, cc: tuple[int, int]) -> Support:
    """What FA4's backward refuses for ``case`` on compute capability ``cc``, from the asserts of its source (see the
    module docstring); the forward's limits (:func:`fa4_shape_support`) apply too."""
    major = cc[0]
    arch = f"sm_{major}{cc[1]}"
    d, dv = case.head_dim, case.dv
    if major not in (9, 10, 11, 12):
        return Support(False, f"backward: {_BWD_SOURCE} asserts 'Supported: 9.x, 10.x, 11.x, 12.x', this is {arch}")
    if major == 9 and case.num_heads != case.num_kv_heads and d != dv:
        return Support(
            False,
            f"backward, head dims ({d}, {dv}) with GQA: FA4's sm_90 backward asserts 'GQA backward requires head_dim "
            "== head_dim_v' (flash_attn/cute/flash_bwd_sm90.py, fa4-v4.0.0.beta27)",
        )
    if major == 12:
        for on, what in ((case.deterministic, "deterministic"), (case.softcap, "score_mod (soft-cap)")):
            if on:
                return Support(False, f"backward: {_BWD_SOURCE} has no {what} backward on {arch}")
        if case.sinks:
            return Support(
                False,
                f"backward: {_BWD_SOURCE}: 'Learnable sink backward is supported on SM90 and "
                f"SM100/SM110', this is {arch}",
            )
    if major in (10, 11) and (d, dv) == (256, 256) and (case.softcap or case.sinks):
        return Support(
            False,
            f"backward at head dims (256, 256) on {arch}: {_BWD_SOURCE}'s dedicated kernel has no soft-cap or "
            "learnable-sink backward",
        )
    return OK


def fa4_plan(case: AttentionCase, inputs: CaseInputs) -> KernelCall:
    """The FA4 call for ``case`` with every tensor converted (no kernel import, no kernel run)."""
    kwargs: dict[str, Any] = dict(
        q=inputs.q,
        cu_seqlens_q=inputs.cu_seqlens_q,
        max_seqlen_q=max(case.q_lens),
        softmax_scale=case.scale,
        causal=case.causal,
        window_size=fa4_window(case),
        learnable_sink=inputs.sinks,
        softcap=case.softcap or 0.0,
        num_splits=case.num_splits or 1,
        return_lse=True,
    )
    if case.paged:
        kwargs.update(
            k=inputs.k_cache,
            v=inputs.v_cache,
            page_table=inputs.block_table,
            seqused_k=inputs.seqlens_k,
        )
    else:
        kwargs.update(
            k=inputs.k,
            v=inputs.v,
            cu_seqlens_k=inputs.cu_seqlens_k,
            max_seqlen_k=max(case.kv_lens),
        )

    def finish(result: Any) -> KernelOutput:
        out, lse = result[0], result[1]
        return KernelOutput(out, None if lse is None else lse.float())

    return KernelCall(ENTRY, kwargs, finish)


class FA4Backend(Backend):
    """flash-attn 4 (CuTe DSL) on CUDA; see the module docstring for the translation."""

    name = "fa4"
    family = "flash-attn-4"
    description = "flash-attn 4 (flash_attn.cute.flash_attn_varlen_func): contiguous and paged KV, sinks, softcap"
    refused = {
        "alibi": (
            "FA4 has no ALiBi argument (a score_mod could add it, but that would test our score_mod, not the kernel)"
        ),
        "local_chunk": "FA4 has no chunked local attention argument",
        "hnd": "FA4 reads pages as (num_pages, page_size, hk, d) only",
        "append": "FA4 has no kvcache entry point that writes new keys into the cache",
        "fp32": "FA4 takes fp16 and bf16 inputs (fp8 on SM100 only)",
    }
    #: seed 004's padded-V path (vLLM pads V for kernels without its head-dim pair); the backward of
    #: flash_attn_varlen_func and its ``deterministic`` argument.
    accepts = frozenset({"v_pad", "graph", "backward", "bwd_deterministic"})
    #: ``flash_attn.cute.flash_attn_varlen_func(..., num_splits=1, ...)`` (sm_90 takes 1 only: the ``splits``
    #: refusal)
    batch_invariance_via = "num_splits"

    def version(self) -> str:
        return package_version("flash-attn-4")

    def is_available(self) -> Support:
        try:
            from flash_attn.cute import flash_attn_varlen_func  # noqa: F401
        except ImportError as exc:
            return Support(False, f"flash-attn-4 (flash_attn.cute) is not importable: {exc}")
        return cuda_device_support(min_major=8)

    def supports(self, case: AttentionCase, device: str) -> Support:
        base = super().supports(case, device)
        if not base:
            return base
        cc = compute_capability(device)
        if cc is None:
            return OK
        shape = fa4_shape_support(case.padded_v_call(), cc)
        return fa4_backward_support(case, cc) if shape and case.backward else shape

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> PreparedKernel:
        if case.v_padded:
            return prepare_padded_v(self.prepare, case, inputs)
        from flash_attn.cute import flash_attn_varlen_func

        call = fa4_plan(case, inputs)
        return PreparedKernel(flash_attn_varlen_func, dataclasses.replace(call, variant=fa4_variant(case)))

    def prepare_graph(self, case: AttentionCase, inputs: CaseInputs) -> GraphKernel:
        """The bucket's call: ``fa4_plan`` already passes the live ``seqused_k`` buffer and the block table."""
        from flash_attn.cute import flash_attn_varlen_func

        return GraphKernel(flash_attn_varlen_func, fa4_plan(case, inputs), {"seqused_k": inputs.seqlens_k})

    def prepare_backward(self, case: AttentionCase, inputs: CaseInputs) -> AutogradBackward:
        """``flash_attn_varlen_func`` through autograd on leaf q/k/v and sinks (see the module docstring)."""
        from flash_attn.cute import flash_attn_varlen_func

        kwargs: dict[str, Any] = dict(
            cu_seqlens_q=inputs.cu_seqlens_q,
            cu_seqlens_k=inputs.cu_seqlens_k,
            max_seqlen_q=max(case.q_lens),
            max_seqlen_k=max(case.kv_lens),
            softmax_scale=case.scale,
            causal=case.causal,
            window_size=fa4_window(case),
            softcap=case.softcap or 0.0,
            deterministic=case.deterministic,
            return_lse=True,
        )

        def forward(leaves: Any) -> tuple[Any, Any]:
            out, lse = flash_attn_varlen_func(leaves.q, leaves.k, leaves.v, learnable_sink=leaves.sinks, **kwargs)
            return out, None if lse is None else lse.detach().float()

        variant = {**call_variant(ENTRY, kwargs), **fa4_variant(case)}  # its compile key names the backward kernel
        return AutogradBackward(forward, grad_leaves(inputs, learn_sinks=case.sinks), inputs.dout, variant=variant)

    def compile_key(self, case: AttentionCase) -> tuple[Any, ...]:
        """FA4's forward compile key for ``case``, approximated from the case (:func:`fa4_compile_key`)."""
        return fa4_compile_key(case)


def fa4_variant(case: AttentionCase) -> dict[str, Any]:
    """The compiled kernel FA4 runs for ``case`` (:func:`fa4_compile_key`, joined by ``|``) and its sm_90 key
    tile (:func:`fa4_sm90_tile_n`; a paged cache of another page size takes the non-TMA loader)."""
    return {
        "compile_key": "|".join(str(x) for x in fa4_compile_key(case)),
        "tile_n": fa4_sm90_tile_n(case.padded_v_call()),
    }


def fa4_compile_key(case: AttentionCase) -> tuple[Any, ...]:
    """An approximation of ``_flash_attn_fwd.compile_cache``'s key (``flash_attn/cute/interface.py``) for the
    call :func:`fa4_plan` makes: cases with equal keys run one compiled kernel.  Its parts: dtype, head
    dims (of the padded-V call the kernel sees), query heads per KV head (pack_gqa follows it), the mask
    after FA4's window normalisation (causal with an unbounded left side is causal; any other window is
    local), which window sides stay bounded, paged (``page_table`` and ``seqused_k``, else ``cu_seqlens_k``),
    whether the page size is FA4's sm_90 key tile (TMA loader) or not, sinks, the soft-cap's *value* (FA4 turns it
    into a score_mod and keys its cache on ``utils.hash_callable`` of that closure, value included: one kernel per
    value; ``docs/concepts/performance.md``, "The first warm run after attnconf warmup"), split KV, and whether every
    request's queries (times the GQA group when pack_gqa packs them) fit one sm_90 query tile (192 rows at head
    dims up to 96, else 128): FA4 then compiles its static persistent scheduler (``is_static_persistent`` from
    ``max_m_blocks_leq_one`` in ``_flash_attn_fwd``), a kernel of its own.  Without this part, the compile
    phase's one case per key left the other kernel to the checks: 1,262 worker-s of FA4 compiles in a warm
    ``default`` run on an H100, ``reports/h100-2026-11-26-speed-3/warm6b``.  A backward case adds its backward
    kernel (``_flash_attn_bwd.compile_cache``: deterministic or not, and whether the longest request's queries and
    keys each fit one backward tile, :func:`fa4_sm90_bwd_single_blocks`): with the forward key alone the compile phase
    picked the key's forward case and left every backward kernel to the checks (``reports/h100-2026-11-26-speed-4``:
    backward records of 4-5 s of kernel time after a complete warmup).  Other sequence lengths, block
    tables, the scale and the page size among non-tile sizes are runtime arguments."""
    case = case.padded_v_call()
    causal, local = fa4_sm90_local(case)
    left, right = fa4_causal_window(case)
    return (
        "fa4-fwd",
        case.dtype,
        case.head_dim,
        case.dv,
        case.num_heads // case.num_kv_heads,
        causal,
        local,
        local and left is not None,
        local and right is not None,
        case.paged,
        case.paged and case.block_size != fa4_sm90_tile_n(case),  # the tile follows from dims and mask above
        case.sinks,
        repr(case.softcap) if case.softcap else False,  # the value: FA4 hashes the closure that holds it
        (case.num_splits or 1) > 1,
        fa4_sm90_one_query_tile(case),
    ) + ((("bwd", case.deterministic, *fa4_sm90_bwd_single_blocks(case)),) if case.backward else ())


def fa4_sm90_bwd_tile(case: AttentionCase) -> tuple[int, int]:
    """FA4's backward (query, key) tile on sm_90 (``_tile_size_bwd_sm90`` in ``flash_attn/cute/interface.py``,
    4.0.0b36): (128, 128) at head dims up to 64, (64, 128) up to 96, (64 or, neither causal nor local, 80, 128) up to
    128, (64, 96) up to 192, else (64, 48)."""
    causal, local = fa4_sm90_local(case)
    d = case.head_dim
    if d <= 64:
        return 128, 128
    if d <= 96:
        return 64, 128
    if d <= 128:
        return (64 if causal or local else 80), 128
    return (64, 96) if d <= 192 else (64, 48)


def fa4_sm90_bwd_single_blocks(case: AttentionCase) -> tuple[bool, bool]:
    """Whether the longest request's queries, and its keys, fit one backward tile (:func:`fa4_sm90_bwd_tile`):
    ``single_q_block`` and ``single_k_block`` of ``_flash_attn_bwd``'s compile key (``max_seqlen_q`` and
    ``max_seqlen_k`` rounded up to the tile, against one tile), each a kernel variant of its own."""
    m, n = fa4_sm90_bwd_tile(case)
    return max(case.q_lens) <= m, max(case.kv_lens) <= n


def fa4_sm90_one_query_tile(case: AttentionCase) -> bool:
    """Whether the longest request's query rows fit one sm_90 query tile of FA4 (``max_m_blocks_leq_one`` in
    ``_flash_attn_fwd``, ``flash_attn/cute/interface.py``, 4.0.0b36): ``max_seqlen_q`` times the GQA group (pack_gqa
    is on whenever the group is over 1) against the tile of ``_tile_size_fwd_sm90``, 192 rows at head dims up to 96
    and 128 above (q_stage is 1 on sm_90).  Padding V changes neither."""
    group = case.num_heads // case.num_kv_heads
    rows = max(case.q_lens) * (group if group > 1 else 1)
    return rows <= (192 if case.head_dim <= 96 else 128)
