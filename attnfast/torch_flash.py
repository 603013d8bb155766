"""PyTorch's vendored FlashAttention-2: ``torch.ops.aten._flash_attention_forward`` (varlen form).

Why the aten op and not ``torch.nn.attention.varlen.varlen_attn``: on torch 2.11 (the GPU machine)
``varlen_attn`` takes only ``window_size`` and ``scale``; the aten op it wraps also takes
``is_causal``, ``alibi_slopes`` and ``seqused_k``, so more of the kernel can be checked, and the
call is exactly what SDPA's flash backend runs.

Call: packed q/k/v, ``cum_seq_q``/``cum_seq_k`` (int32), ``max_q``/``max_k``, ``dropout_p=0``,
``is_causal``, ``scale``, ``window_size_left/right`` in FA2 spelling (``-1`` = unbounded; the
vendored kernel has FA2's clamping, including flash-attention issue 895 for ``(w, -1)`` when
``sq > sk + 1``), ``alibi_slopes`` fp32 ``(h,)``.  ``seqused_k`` is left None: contiguous cases have
exact ``cum_seq_k`` spans.  Returns ``(out, logsumexp (h, total_q), rng_state, unused, debug_mask)``;
the LSE of a row that saw no key is ``+inf`` (measured on the H200, torch 2.11) and becomes
``-inf``; on the causal path ALiBi's LSE is shifted exactly as in FA2 (same kernel) and corrected
the same way (:func:`attnfast._fa_common.alibi_causal_lse_shift`).

Backward (``prepare_backward``, :mod:`attnfast.autograd`): the same aten call on leaf q/k/v through its autograd
formula (``FlashAttentionBackward0``, which saves the scale and both window sides and calls
``aten._flash_attention_backward``).  That op has no deterministic argument: it reads torch's global switch
(``attention_backward.cu``: ``deterministic = ctx.deterministicAlgorithms()`` unless warn-only), so a
``deterministic`` case runs forward and backward under ``torch.use_deterministic_algorithms(True)``
(:func:`attnfast.autograd.deterministic_algorithms`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

from ._fa_common import (
    KernelCall,
    PreparedKernel,
    call_variant,
    cuda_device_support,
    fa2_alibi_fix,
    fa2_window,
    lse_posinf_to_neginf,
)
from .autograd import AutogradBackward, deterministic_algorithms, grad_leaves
from .base import OK, Backend, KernelOutput, Support

__all__ = ["TorchFlashBackend", "torch_flash_plan"]

ENTRY = "torch.ops.aten._flash_attention_forward"
MAX_HEAD_DIM = 256
#: ``aten._flash_attention_forward`` takes head dims that are multiples of this (SDPA pads others before it).
HEAD_DIM_MULTIPLE = 8


def torch_flash_plan(case: AttentionCase, inputs: CaseInputs) -> KernelCall:
    """The aten call for ``case`` with every tensor converted (no kernel run)."""
    left, right = fa2_window(case)
    max_k = max(case.kv_lens)
    kwargs: dict[str, Any] = dict(
        query=inputs.q,
        key=inputs.k,
        value=inputs.v,
        cum_seq_q=inputs.cu_seqlens_q,
        cum_seq_k=inputs.cu_seqlens_k,
        max_q=max(case.q_lens),
        max_k=max_k,
        dropout_p=0.0,
        is_causal=case.causal,
        return_debug_mask=False,
        scale=case.scale,
        window_size_left=left,
        window_size_right=right,
        seqused_k=None,
        alibi_slopes=inputs.alibi_slopes,
    )
    shift, slack, notes = fa2_alibi_fix(case, inputs, (left, right), max_k, kernel="vendored FA2")

    def finish(result: Any) -> KernelOutput:
        out, lse = result[0], lse_posinf_to_neginf(result[1])
        return KernelOutput(out, lse if shift is None else lse - shift, slack)

    return KernelCall(ENTRY, kwargs, finish, notes)


class TorchFlashBackend(Backend):
    """torch's vendored FlashAttention-2 on CUDA (sm80+); see the module docstring."""

    name = "torch-flash"
    family = "torch-flash"
    description = "torch.ops.aten._flash_attention_forward (vendored FA2, varlen): causal, windows, seqused_k"
    refused = {
        # measured on torch 2.11.0+cu130 (H200): the call raises this RuntimeError for any alibi_slopes
        "alibi": "torch's vendored FA2 build raises 'This flash attention build does not support alibi.'",
        "softcap": "aten._flash_attention_forward has no softcap argument",
        "sinks": "aten._flash_attention_forward has no attention-sink argument",
        "paged": "aten._flash_attention_forward takes no block table",
        "hnd": "aten._flash_attention_forward takes no block table",
        "local_chunk": "aten._flash_attention_forward has no chunked local attention",
        "dv": "torch's vendored FA2 needs the value head dim equal to the qk head dim",
        "fp32": "torch's vendored FA2 takes fp16 and bf16 inputs only",
        "append": "aten._flash_attention_forward does not write into a KV cache",
        "splits": "aten._flash_attention_forward has no num_splits argument",
        "graph": "graph mode replays paged decode buckets, and aten._flash_attention_forward takes no block table "
        "(a contiguous decode call does capture: measured on an H100 with scripts/probe_graph_capture.py)",
    }

    #: the op's autograd formula; deterministic through torch.use_deterministic_algorithms (module docstring).
    accepts = frozenset({"backward", "bwd_deterministic"})
    #: the call passes no split count: ``aten::_flash_attention_forward`` of torch 2.11 (the GPU machine's) has none
    #: (2.13's schema adds ``num_splits``, which the adapter does not pass)
    batch_invariance_via = None

    def version(self) -> str:
        return torch.__version__

    def is_available(self) -> Support:
        cuda = cuda_device_support(min_major=8)
        if not cuda:
            return cuda
        flash_ok = getattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)()
        if not flash_ok:
            return Support(False, f"torch {torch.__version__} was built without flash attention")
        return OK

    def supports(self, case: AttentionCase, device: str) -> Support:
        base = super().supports(case, device)
        if base and case.head_dim > MAX_HEAD_DIM:
            return Support(
                False,
                f"head dim {case.head_dim}: torch's vendored FA2 supports head dims up to {MAX_HEAD_DIM}",
            )
        if base and case.head_dim % HEAD_DIM_MULTIPLE:
            return Support(
                False,
                f"head dim {case.head_dim}: 'head_size must be a multiple of 8, this is ensured by padding!' (the "
                "aten op leaves the padding to SDPA; measured on the H100 by the fuzzer with d1, d20, d47, d126)",
            )
        return base

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> PreparedKernel:
        return PreparedKernel(torch.ops.aten._flash_attention_forward, torch_flash_plan(case, inputs))

    def prepare_backward(self, case: AttentionCase, inputs: CaseInputs) -> AutogradBackward:
        """The forward's aten call through autograd on leaf q/k/v (see the module docstring)."""
        call = torch_flash_plan(case, inputs)

        def forward(leaves: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
            kwargs = {**call.kwargs, "query": leaves.q, "key": leaves.k, "value": leaves.v}
            res = call.finish(torch.ops.aten._flash_attention_forward(**kwargs))
            return res.out, None if res.lse is None else res.lse.detach()

        context = deterministic_algorithms if case.deterministic else contextlib.nullcontext
        notes = call.notes + (
            ("deterministic: torch.use_deterministic_algorithms(True)",) if case.deterministic else ()
        )
        # the forward's variant, and torch's global deterministic switch (the backward op has no argument for it)
        variant = {**call_variant(call.entry, call.kwargs), **call.variant, "deterministic": case.deterministic}
        return AutogradBackward(
            forward, grad_leaves(inputs), inputs.dout, context=context, notes=notes, variant=variant
        )
