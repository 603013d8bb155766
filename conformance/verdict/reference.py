"""The reference answer of a case: :mod:`attnref` in fp32 (fp64 for fp32 inputs) on the case's inputs.

The reference reads the contiguous keys ``inputs.k``/``inputs.v`` (every key of every request, the
new tokens included) through ``cu_seqlens_k``, whatever the case's KV layout: a paged or appending
kernel must give the same answer as if the keys had been contiguous, so the reference never
depends on the cache the kernel reads (nor on what the kernel writes into it).  A context-parallel
case (``cp_world > 1``) holds one rank's shard of each sequence's keys and the totals
``inputs.cp_tot_seqused_k``: the reference applies the kernel's cp rule (``attnref.ContextParallel``).  For a quantized
case those are the dequantized values (:mod:`conformance.cases.quant_inputs`), in fp32; with ``qv``
(MLA absorbed) the score adds ``qv . v``.

On CUDA, TF32 is switched off for the duration (:func:`strict_fp32`): with TF32 an fp32 matmul
keeps only 10 mantissa bits, which would make the "exact" side of every comparison as noisy as
the bf16 kernels it judges.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

import attnref
from attnref import AttnOptions, AttnResult, ContextParallel, Numerics, Window

from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs, cp_totals, host_ints

__all__ = ["case_options", "default_numerics", "reference", "strict_fp32"]


def case_options(case: AttentionCase) -> AttnOptions:
    """The reference's option object for ``case`` (causal, window, softcap, scale, chunk, context parallel; the
    per-sequence cp totals travel in the inputs)."""
    return AttnOptions(
        causal=case.causal,
        window=Window(*case.window),
        softcap=case.softcap,
        scale=case.scale,
        chunk=case.chunk,
        cp=ContextParallel(case.cp_world, case.cp_rank) if case.cp_world > 1 else None,
    )


def default_numerics(case: AttentionCase) -> Numerics:
    """fp32 for bf16/fp16 inputs; fp64 for fp32 inputs, so the reference stays more precise than them."""
    return Numerics(dtype=torch.float64 if case.dtype == "fp32" else torch.float32)


@contextlib.contextmanager
def strict_fp32() -> Iterator[None]:
    """Disable TF32 for cuBLAS matmuls and cuDNN while the block runs; restore the settings after.

    Uses the legacy ``allow_tf32`` flags; torch >= 2.9 raises when they are read after someone set
    the newer ``fp32_precision`` API, and then this falls back to that API for the same flag.
    """
    if not torch.cuda.is_available():
        yield
        return
    flags = [
        (torch.backends.cuda.matmul, "allow_tf32", False, "fp32_precision", "ieee"),
        (torch.backends.cudnn, "allow_tf32", False, "fp32_precision", "ieee"),
    ]
    saved: list[tuple[object, str, object]] = []
    try:
        for owner, legacy, legacy_off, modern, modern_off in flags:
            try:
                saved.append((owner, legacy, getattr(owner, legacy)))
                setattr(owner, legacy, legacy_off)
            except RuntimeError:  # mixed legacy/new API use elsewhere in the process
                saved.append((owner, modern, getattr(owner, modern)))
                setattr(owner, modern, modern_off)
        yield
    finally:
        for owner, attr, value in reversed(saved):
            setattr(owner, attr, value)


@torch.no_grad()
def reference(
    case: AttentionCase,
    inputs: CaseInputs,
    numerics: Numerics | None = None,
    alibi_dtype: torch.dtype | None = None,
) -> AttnResult:
    """Reference ``out (total_q, h, dv)`` and ``lse (h, total_q)`` of ``case`` on ``inputs``' device.

    Args:
        case: what to compute (the masking and score options are read from it).
        inputs: the case's tensors (:func:`conformance.cases.inputs.make_inputs`).
        numerics: accumulation dtype and tile budget; None = :func:`default_numerics`.
        alibi_dtype: ALiBi as a kernel handed a bias in this dtype (:func:`attnref.core.alibi_penalty`: what the
            backward baseline of such a kernel recomputes its forward with); None = exact.
    """
    numerics = default_numerics(case) if numerics is None else numerics
    with strict_fp32():
        return attnref.attention_varlen(
            inputs.q,
            inputs.k,
            inputs.v,
            host_ints(inputs.cu_seqlens_q),  # known on the host: no read of the device's copy
            host_ints(inputs.cu_seqlens_k),
            options=case_options(case),
            alibi_slopes=inputs.alibi_slopes,
            sinks=inputs.sinks,
            qv=inputs.qv,
            numerics=numerics,
            cp_tot_seqused_k=cp_totals(inputs, case),
            alibi_dtype=alibi_dtype,
        )
