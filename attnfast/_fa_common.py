"""Plumbing shared by the flash-attention family adapters (``fa2``, ``fa3``, ``fa4``, ``torch-flash``).

Everything here is pure tensor and metadata work, importable without any kernel package, so the
translation logic can be tested on a CPU machine.  An adapter builds a :class:`KernelCall` (which
entry point, with which keyword arguments, and how to read the result back) in ``prepare``; the
returned :class:`PreparedKernel` runs only that call plus the few elementwise ops that bring the
result into the reference's conventions (:mod:`attnfast.base`).

Conventions converted here (``../shared/SEMANTICS.md`` sections 2-4):

* windows: the case spells ``None`` = unbounded; FA2/FA3 spell it ``-1``; FA4 keeps ``None``;
* LSE of a fully masked row: FA2 (and torch's vendored FA2) write ``+inf``, FA3 ``+inf`` when the
  batch has no key at all; the reference says ``-inf``;
* ALiBi: FA2's causal kernel adds ``+slope * j`` instead of ``-slope * |i + sk - sq - j|``; the
  softmax is the same but the LSE is larger by ``slope * (i + sk - sq)``, which the kernel's fp32 arithmetic
  carries (its rounding at that magnitude is declared per row: :func:`alibi_causal_lse_slack`).

Size: one layer of plumbing the four family adapters share (call and prepared-kernel types, windows, caches, padded
V, LSE conventions); FA2's window and ALiBi conventions (the last third) are the part to give a module of its own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from attnref import Window, window_to_fa2, window_to_fa4
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

from .base import KernelOutput, Support

__all__ = [
    "ALIBI_LSE_ROUNDINGS",
    "KernelCall",
    "PreparedKernel",
    "STALE_VALUE",
    "alibi_causal_lse_shift",
    "alibi_causal_lse_slack",
    "call_variant",
    "compute_capability",
    "cuda_device_support",
    "fa2_alibi_fix",
    "fa2_alibi_uses_causal_form",
    "fa2_kernel_window",
    "fa2_window",
    "fa4_window",
    "kvcache_caches",
    "lse_posinf_to_neginf",
    "padded_lse_to_varlen",
    "padded_new_tokens",
    "pad_v",
    "kernel_case",
    "sm_count",
    "prepare_padded_v",
    "stale_padded_cache",
    "stored_tensors",
    "StoredTensors",
    "uniform_q_len",
]

#: Value of cache slots no request owns.  Large and finite, as stale data in a real engine: a
#: kernel that reads past its sequence length is then far off instead of hidden by zeros.
STALE_VALUE = 100.0


@dataclass(frozen=True)
class KernelCall:
    """One planned kernel invocation.

    Attributes:
        entry: the entry point's qualified name (for messages and tests), e.g.
            ``"flash_attn.flash_attn_varlen_func"``.
        kwargs: the keyword arguments, every tensor already converted and on the device.
        finish: turns the entry point's raw return value into a :class:`KernelOutput`.
        notes: translation facts worth showing when a case fails (e.g. the ALiBi LSE correction).
        variant: what an adapter knows of the kernel variant beyond the arguments (FA4: its compile key and
            key tile; FA2, FA3: the split count their host code decides, :mod:`attnfast.decisions`).
        decided: reads back what the kernel decided (vLLM's FA3 fork, FlashMLA: their scheduler metadata) as more
            variant facts; :attr:`PreparedKernel.variant` calls it, after the call (it may read the device).
    """

    entry: str
    kwargs: Mapping[str, Any]
    finish: Callable[[Any], KernelOutput]
    notes: tuple[str, ...] = field(default=())
    variant: Mapping[str, Any] = field(default_factory=dict)
    decided: Callable[[], Mapping[str, Any]] | None = None


#: Keyword arguments that select a kernel variant, recorded by :func:`call_variant` when passed (a tensor argument
#: as ``True``: given, its values are the kernel's runtime data); ``deterministic`` is the backward's (FA2, FA4).
VARIANT_ARGS = (
    "num_splits",
    "pack_gqa",
    "scheduler_metadata",
    "tile_scheduler_metadata",
    "block_table",
    "page_table",
    "deterministic",
)


def call_variant(entry: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The variant a call of ``entry`` with ``kwargs`` selects: the entry point and the :data:`VARIANT_ARGS` passed
    (not None), JSON scalars only.  :attr:`PreparedKernel.variant` and the FA adapters' backward calls start
    from it."""
    out: dict[str, Any] = {"entry": entry}
    for name in VARIANT_ARGS:
        value = kwargs.get(name)
        if value is not None:
            out[name] = value if isinstance(value, (bool, int, float, str)) else True
    return out


class PreparedKernel:
    """The zero-argument callable ``prepare`` returns.

    ``kernel()`` runs only the kernel and returns its raw result (the GPU tests read the kernel's own
    LSE convention through it); calling the object runs the kernel and converts the result, and
    that whole call is what :mod:`conformance.perf.timing` times.  It holds no state that the call
    changes, so calling it twice gives the same result (a kvcache append rewrites the same slots).
    """

    def __init__(self, fn: Callable[..., Any], call: KernelCall) -> None:
        self._fn = fn
        self.call = call

    @property
    def notes(self) -> tuple[str, ...]:
        """Translation facts the record carries (``extra["notes"]``), e.g. a dtype conversion."""
        return self.call.notes

    @property
    def variant(self) -> dict[str, Any]:
        """The kernel variant this call selects, for the record's ``extra["variant"]``: the entry point, the
        variant-selecting arguments passed (:func:`call_variant`), :attr:`KernelCall.variant` and what the kernel
        decided (:attr:`KernelCall.decided`: read it once, after the kernel ran; a failed read becomes ``decided:
        "unread: <error>"``, nothing else: the variant judges nothing).  JSON scalars only."""
        out = call_variant(self.call.entry, self.call.kwargs)
        out.update(self.call.variant)
        if self.call.decided is not None:
            try:
                out.update(self.call.decided())
            except Exception as exc:  # noqa: BLE001 - any failure of an informational read is recorded as such
                out["decided"] = f"unread: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
        return out

    def kernel(self) -> Any:
        return self._fn(**self.call.kwargs)

    def __call__(self) -> KernelOutput:
        return self.call.finish(self.kernel())

    def __repr__(self) -> str:
        names = ", ".join(k for k, v in self.call.kwargs.items() if v is not None)
        return f"PreparedKernel({self.call.entry}({names}))"


class GraphKernel(PreparedKernel):
    """A :class:`PreparedKernel` for CUDA-graph mode (:meth:`attnfast.base.Backend.prepare_graph`): the planned
    call with its per-batch arguments bound to the bucket's live buffers (``live``: keyword -> static tensor),
    and ``refresh`` run before every replay, outside the graph."""

    def __init__(
        self,
        fn: Callable[..., Any],
        call: KernelCall,
        live: Mapping[str, Any],
        refresh: Callable[[], None] | None = None,
        note: str = "",
    ) -> None:
        missing = sorted(set(live) - set(call.kwargs))
        if missing:
            raise ValueError(f"graph binding names arguments the call does not take: {missing}")
        notes = call.notes + ((note,) if note else ())
        super().__init__(fn, KernelCall(call.entry, {**call.kwargs, **live}, call.finish, notes))
        self._refresh = refresh

    def refresh(self) -> None:
        if self._refresh is not None:
            self._refresh()


# ---------------------------------------------------------------------------------- devices
def compute_capability(device: str | torch.device = "cuda") -> tuple[int, int] | None:
    """(major, minor) of the CUDA device, or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    return torch.cuda.get_device_capability(dev)


def sm_count(device: str | torch.device) -> int | None:
    """The SM count of a CUDA ``device`` (what FA2 and FA3 read as ``multiProcessorCount``), or None off CUDA."""
    cc = compute_capability(device)
    return None if cc is None else torch.cuda.get_device_properties(torch.device(device)).multi_processor_count


def cuda_device_support(min_major: int = 8) -> Support:
    """Whether a CUDA device of compute capability ``>= min_major`` is present, and why not."""
    cc = compute_capability("cuda")
    if cc is None:
        return Support(False, "no CUDA device (torch.cuda.is_available() is False)")
    if cc[0] < min_major:
        return Support(False, f"needs compute capability >= {min_major}.0, this GPU is {cc[0]}.{cc[1]}")
    return Support(True)


# ---------------------------------------------------------------------------------- windows
def fa2_window(case: AttentionCase) -> tuple[int, int]:
    """The case's window in FA2/FA3 spelling (``-1`` = unbounded; causal travels in the separate flag)."""
    return window_to_fa2(Window(*case.window))


def fa4_window(case: AttentionCase) -> tuple[int | None, int | None]:
    """The case's window in FA4 spelling (``None`` = unbounded, negatives would be literal)."""
    return window_to_fa4(Window(*case.window), causal=case.causal)


# ---------------------------------------------------------------------------------- batches
def uniform_q_len(case: AttentionCase) -> int | None:
    """The common q_len of every request, or None when they differ."""
    lens = set(case.q_lens)
    return lens.pop() if len(lens) == 1 else None


def stale_padded_cache(inputs: CaseInputs, width: int, keep: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Contiguous ``(b, width, hk, d)`` / ``(b, width, hk, dv)`` caches for a kvcache entry point.

    Request ``b``'s first ``keep[b]`` keys are its real keys; every other slot holds
    :data:`STALE_VALUE` (a kernel that reads past ``cache_seqlens`` is then visibly wrong).
    """
    case = inputs.case
    kc = inputs.k.new_full((case.batch, width, case.num_kv_heads, case.head_dim), STALE_VALUE)
    vc = inputs.v.new_full((case.batch, width, case.num_kv_heads, case.dv), STALE_VALUE)
    for b, n in enumerate(keep):
        kc[b, :n] = inputs.k_of(b)[:n]
        vc[b, :n] = inputs.v_of(b)[:n]
    return kc, vc


def kvcache_caches(
    case: AttentionCase, inputs: CaseInputs, min_width: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, int]:
    """``(k_cache, v_cache, page_table, cache_seqlens, width)`` for a kvcache entry point (FA2/FA3).

    Paged: the case's caches (HND memory seen as NHD by a transpose) and block table, ``width`` the
    table's reach in keys.  Contiguous: :func:`stale_padded_cache` of width ``max(kv_lens)``.
    ``cache_seqlens`` (int32, on the device) counts the keys already cached, before any append.
    ``min_width``: the capacity (keys per sequence) the call needs at least; a contiguous cache is made that
    wide, a block table gets more columns (repeating its last one: never read, ``cache_seqlens`` bounds the
    keys and an append writes inside the real blocks).
    """
    keep = case.cached_kv_lens
    if case.paged:
        k_cache, v_cache, table = inputs.k_cache, inputs.v_cache, inputs.block_table
        assert k_cache is not None and v_cache is not None and table is not None and case.block_size is not None
        if case.kv_layout == "HND":  # (num_blocks, hk, page, d) memory seen as (num_blocks, page, hk, d)
            k_cache, v_cache = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
        short = -(-min_width // case.block_size) - table.shape[1]
        if short > 0:
            table = torch.cat([table, table[:, -1:].expand(-1, short)], dim=1).contiguous()
        width = table.shape[1] * case.block_size
    else:
        width = max(1, max(case.kv_lens), min_width)
        k_cache, v_cache = stale_padded_cache(inputs, width, keep)
        table = None
    return k_cache, v_cache, table, torch.tensor(keep, dtype=torch.int32, device=inputs.device), width


def padded_new_tokens(inputs: CaseInputs, new_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``inputs.k_new``/``v_new`` (packed, ``new_len`` per request: ``q_len``, or ``append_len`` for a short
    append) as ``(b, new_len, hk, d)`` views; ``ValueError`` for an uneven append (``append_lens``: no one
    ``new_len``, the dense layout cannot hold it)."""
    case = inputs.case
    if any(n != new_len for n in case.new_kv_lens):
        raise ValueError(f"new keys per request {case.new_kv_lens} are not {new_len} each: no dense (b, n, hk, d) view")
    if inputs.k_new is None or inputs.v_new is None:
        raise ValueError("the case appends but inputs.k_new / v_new are missing")
    kn = inputs.k_new.reshape(case.batch, new_len, case.num_kv_heads, case.head_dim)
    vn = inputs.v_new.reshape(case.batch, new_len, case.num_kv_heads, case.dv)
    return kn, vn


# ---------------------------------------------------------------------------------- stored tensors
@dataclass(frozen=True)
class StoredTensors:
    """What an FA-family kernel is handed for a case: q/k/v/qv as stored (fp8 for a quantized case, the
    activation dtype otherwise), paged caches as stored, and fp32 descales ``(batch, hk)`` or None."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    qv: torch.Tensor | None
    k_cache: torch.Tensor | None
    v_cache: torch.Tensor | None
    q_descale: torch.Tensor | None
    k_descale: torch.Tensor | None
    v_descale: torch.Tensor | None


def _descale(scale: torch.Tensor | None, case: AttentionCase, name: str) -> torch.Tensor | None:
    """A case's fp8 descale as FA3 takes it: ``(batch, hk)``; a per-tensor ``(1,)`` scale is expanded the way
    vLLM and SGLang do (``scale.expand(batch, hk)``, no copy)."""
    if scale is None:
        return None
    from attnref.quant import expand_descale

    return expand_descale(scale, case.batch, case.num_kv_heads, name)


def stored_tensors(case: AttentionCase, inputs: CaseInputs) -> StoredTensors:
    """The tensors an FA-family kernel reads for ``case`` (see :class:`StoredTensors`).

    Not quantized: the inputs as they are.  fp8: the stored fp8 q/k/v/qv (q and qv in the activation
    dtype when ``quant_q`` is False) with their descales.  Paged MLA (``qv``) caches are SGLang's two
    strided views of the one ``[c_kv | k_rope]`` cache.  int8 has no FA-family kernel: ``ValueError``.
    """
    quant = inputs.quant
    k_cache, v_cache = inputs.k_cache, inputs.v_cache
    if case.qv and inputs.mla_cache is not None:
        dv = case.dv
        joint = inputs.mla_cache if case.kv_layout == "NHD" else inputs.mla_cache.transpose(1, 2)
        k_cache, v_cache = joint[..., dv:], joint[..., :dv]
        if case.kv_layout == "HND":
            k_cache, v_cache = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
    if quant is None:
        return StoredTensors(inputs.q, inputs.k, inputs.v, inputs.qv, k_cache, v_cache, None, None, None)
    if quant.fmt == "int8" or quant.v is None:
        raise ValueError(f"quant {case.quant!r}: no flash-attention kernel reads seed 001's int8 layouts")
    dt = case.torch_dtype
    q = quant.q if quant.q is not None else inputs.q.to(dt)
    qv = quant.qv if quant.qv is not None else (None if inputs.qv is None else inputs.qv.to(dt))
    return StoredTensors(
        q,
        quant.k,
        quant.v,
        qv,
        k_cache,
        v_cache,
        _descale(quant.q_descale, case, "q_descale"),
        _descale(quant.k_descale, case, "k_descale"),
        _descale(quant.v_descale, case, "v_descale"),
    )


def pad_v(v: torch.Tensor, head_dim: int) -> torch.Tensor:
    """V (or a V cache) zero-padded on its last dim to ``head_dim`` (seed ``004``'s
    ``torch.nn.functional.pad(v, [0, q.shape[-1] - v.shape[-1]], value=0)``)."""
    out = v.new_zeros(*v.shape[:-1], head_dim)  # new_zeros + copy: also for fp8, where F.pad is not implemented
    out[..., : v.shape[-1]] = v
    return out


def kernel_case(case: AttentionCase) -> AttentionCase:
    """The call the kernel sees: for a ``v_padded`` case the same case with ``head_dim_v == head_dim``."""
    return case.padded_v_call()


def prepare_padded_v(
    prepare: Callable[[AttentionCase, CaseInputs], PreparedKernel], case: AttentionCase, inputs: CaseInputs
) -> PreparedKernel:
    """Seed ``004``'s path for a kernel that needs equal head dims: V (the packed V, the V cache, the appended
    V and a quantized V) zero-padded to ``head_dim``, ``prepare`` run on that equal-dims call, the output stripped
    back to the case's ``head_dim_v`` in the call's ``finish`` (so the strip is part of what is timed)."""
    d, dv = case.head_dim, case.dv
    quant = inputs.quant
    if quant is not None and quant.v is not None:
        quant = dataclasses.replace(quant, v=pad_v(quant.v, d))
    padded = dataclasses.replace(
        inputs,
        case=kernel_case(case),
        v=pad_v(inputs.v, d),
        v_cache=None if inputs.v_cache is None else pad_v(inputs.v_cache, d),
        v_new=None if inputs.v_new is None else pad_v(inputs.v_new, d),  # an append writes V into the padded cache
        quant=quant,
    )
    prepared = prepare(padded.case, padded)
    inner = prepared.call.finish

    def finish(result: Any) -> KernelOutput:
        res = inner(result)
        return KernelOutput(res.out[..., :dv], res.lse, res.lse_slack)

    note = f"v_padded: V zero-padded from {dv} to {d}, output stripped back to {dv}"
    call = dataclasses.replace(prepared.call, finish=finish, notes=prepared.call.notes + (note,))
    return PreparedKernel(prepared._fn, call)


# ---------------------------------------------------------------------------------- LSE
def lse_posinf_to_neginf(lse: torch.Tensor) -> torch.Tensor:
    """fp32 LSE with ``+inf`` (FA2's mark of a row that saw no key) replaced by ``-inf``."""
    lse = lse.float()
    return lse.masked_fill(lse == math.inf, -math.inf)


def padded_lse_to_varlen(lse: torch.Tensor) -> torch.Tensor:
    """``(b, h, sq)`` LSE of a padded batch with equal q lengths to the varlen ``(h, b * sq)``."""
    b, h, sq = lse.shape
    return lse.permute(1, 0, 2).reshape(h, b * sq)


def _fa2_clamped(causal: bool, window: tuple[int, int], seqlen_k: int) -> tuple[int, int]:
    left, right = window
    if causal:
        right = 0
    if left >= seqlen_k:
        left = -1
    if right >= seqlen_k:
        right = -1
    return left, right


def fa2_kernel_window(causal: bool, window: tuple[int, int], seqlen_k: int) -> tuple[int, int]:
    """The ``(left, right)`` window FA2's kernel really applies (``-1`` = unbounded).

    Mirrors ``csrc/flash_attn/flash_api.cpp`` and ``set_params_fprop`` (2.8.3; torch's vendored copy
    has the same lines): ``causal`` forces ``right = 0``; a side ``>= seqlen_k`` becomes ``-1``
    (``seqlen_k`` is ``max_seqlen_k`` for varlen, the cache width for kvcache); then one bounded
    side turns the other's ``-1`` into ``seqlen_k``.  Both steps ignore the bottom-right offset
    ``sk - sq``, which is flash-attention issue 895: with ``sq > sk`` neither a right side
    ``>= seqlen_k`` nor one of exactly ``seqlen_k`` reaches every key from the top rows.
    """
    left, right = _fa2_clamped(causal, window, seqlen_k)
    if left >= 0 and right < 0:
        right = seqlen_k
    elif left < 0 and right >= 0:
        left = seqlen_k
    return left, right


def fa2_alibi_uses_causal_form(causal: bool, window: tuple[int, int], seqlen_k: int) -> bool:
    """Whether FA2 takes its causal kernel path, where ALiBi is added as ``+slope * j``.

    FA2's ``is_causal`` is ``left < 0 and right == 0`` after the clamp of :func:`fa2_kernel_window`
    (before a side is filled in with ``seqlen_k``).  A bounded left window takes the local path,
    which adds ALiBi in the symmetric form.
    """
    left, right = _fa2_clamped(causal, window, seqlen_k)
    return left < 0 and right == 0


def fa2_alibi_fix(
    case: AttentionCase, inputs: CaseInputs, window: tuple[int, int], seqlen_k: int, kernel: str = "FA2"
) -> tuple[torch.Tensor | None, torch.Tensor | None, tuple[str, ...]]:
    """``(shift, slack, notes)``: the LSE shift to subtract from an FA2-family kernel's LSE, the per-row LSE
    allowance that goes with it (the output's ``KernelOutput.lse_slack``) and a note for the record.

    ``None, None`` and no note when the kernel's ALiBi is already symmetric (no slopes, or not its causal path:
    :func:`fa2_alibi_uses_causal_form`); else :func:`alibi_causal_lse_shift` and :func:`alibi_causal_lse_slack`.
    """
    if inputs.alibi_slopes is None or not fa2_alibi_uses_causal_form(case.causal, window, seqlen_k):
        return None, None, ()
    shift = alibi_causal_lse_shift(case, inputs.alibi_slopes)
    slack = alibi_causal_lse_slack(shift)
    widest = float(slack.max()) if slack.numel() else 0.0
    note = (
        f"alibi: {kernel} causal path adds +slope*j; LSE corrected by -slope*(i + sk - sq), its bound widened by "
        f"{ALIBI_LSE_ROUNDINGS} x 2^-24 x that (the kernel's fp32 rounding at that magnitude; at most {widest:.1e})"
    )
    return shift, slack, (note,)


def alibi_causal_lse_shift(case: AttentionCase, slopes: torch.Tensor) -> torch.Tensor:
    """``(h, total_q)`` fp32: ``slope[h] * (i + sk - sq)`` for each query row.

    Subtracting it from the LSE of FA2's causal ALiBi path gives the LSE of the symmetric form
    the reference uses (``SEMANTICS.md`` section 3 step 4).  ``slopes`` is ``(h,)`` or ``(b, h)``.
    """
    rows = []
    for ql, kl in case.requests:
        rows.append(torch.arange(ql, dtype=torch.float32) + float(kl - ql))
    pos = torch.cat(rows) if rows else torch.zeros(0)
    pos = pos.to(slopes.device)
    if slopes.dim() == 1:
        return slopes.float()[:, None] * pos[None, :]
    per_token = torch.repeat_interleave(
        slopes.float(), torch.tensor(case.q_lens, device=slopes.device), dim=0
    )  # (total_q, h)
    return per_token.transpose(0, 1) * pos[None, :]


#: fp32 roundings, each at most ``2^-24 x |shift|`` (half an ulp), that the LSE of FA2's causal ALiBi path takes at
#: the magnitude of its shift ``C = slope * (i + sk - sq)`` (FA2 2.8.3, built with ``--use_fast_math``): 4 for
#: ``alibi_slope = slope / scale_softmax`` (a fast-math division, within 2 ulps; every key's bias, and so ``C``,
#: carries its relative error), 1 for each biased score ``q.k + alibi_slope * j`` (an FMA), 1 for the scaled row max
#: the exponentials are taken against, 1 for ``lse = row_max * scale + log(sum)``, 1 for the split-KV combine
#: ``lse_max + log(...)``, 1 for the adapter's fp32 shift (exact for power-of-two slopes).  Every other rounding
#: acts on O(1) values, which the dtype's ``lse_atol`` and ``lse_rtol`` already cover.  What an fp32 model of the
#: kernel's arithmetic reaches: docs/concepts/verdict.md, "A kernel's own LSE convention".
ALIBI_LSE_ROUNDINGS = 9


def alibi_causal_lse_slack(shift: torch.Tensor) -> torch.Tensor:
    """``(h, total_q)`` fp32 >= 0: what FA2's causal ALiBi convention can cost the LSE of each row,
    ``ALIBI_LSE_ROUNDINGS x 2^-24 x |shift|`` (see :data:`ALIBI_LSE_ROUNDINGS`).

    The kernel computes every score, its running max and the LSE it returns with ``shift`` folded in, in fp32, so
    subtracting the shift afterwards cannot recover what those roundings lost; the verdict adds this to the row's LSE
    bound, and nothing to any other row or case.
    """
    return shift.abs() * (ALIBI_LSE_ROUNDINGS * 2.0**-24)
