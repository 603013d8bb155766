"""The backward call of the SDPA adapters (``sdpa-cpu``, ``sdpa-cuda`` and its single-backend variants): each
request's SDPA call of :mod:`attnfast.sdpa` rebuilt inside an autograd forward over leaf q/k/v
(:mod:`attnfast.autograd`), so the gradients flow through SDPA's own backward kernels and autograd un-slices them
into the varlen layouts and sums a GQA group repeated for a backend without ``enable_gqa``.

The plan, mask and bias of each request are the forward adapter's (``_prepare_one``, ``_plan``), made once in
``prepare_backward``; only the slicing, the sink column, the K/V head repeat and SDPA itself run inside the closure.
Sinks: the sink is a key whose bias is the sink's logit; where the bias is fp32 and unshifted (``sdpa-cpu``, MATH
backend: an fp32 ``attn_mask`` is differentiable there) the adapter learns the sinks, rebuilding the bias's last
column from an fp32 sinks leaf, so ``dsinks`` is what SDPA's backward gives for that column.  On CUDA the bias is in
the query dtype and shifted per row (:func:`attnfast.sdpa.bias_for_kernel`), so the sinks stay a constant and
``dsinks`` is None.  A request with no query row runs nothing (its gradients are 0); the LSE is the forward
adapter's fp32 derivation.  A deterministic case runs under ``torch.use_deterministic_algorithms(True)``: SDPA has
no deterministic argument, and torch's flash and memory-efficient backward kernels read that switch
(``attention_backward.cu``) while cuDNN is then not eligible (``sdp_utils.cpp``: ``check_cudnn_deterministic``).

The call's ``variant`` (the backward record's ``extra["variant"]``): ``sdpa``, the backend torch's dispatcher picks
for each request's call as the forward adapter reads it (``choices``: :func:`attnfast.sdpa.sdpa_choices`), here on
the first call's own arguments (leaves with ``requires_grad``, the learned sink column), read after the call with
grad mode on and under the deterministic switch (both change torch's pick); that backend's autograd node runs the
gradient, so it names the backward kernel too.  ``deterministic``: whether the switch was on.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

from ._torch_common import sequences, softmax_scale, with_sink_column
from .autograd import AutogradBackward, GradLeaves, deterministic_algorithms, grad_leaves

__all__ = ["RequestGradCall", "SdpaArgs", "sdpa_backward"]


@dataclass(frozen=True)
class RequestGradCall:
    """One request's SDPA call for the backward: rows ``q0 .. q0 + sq``, keys ``k0 .. k0 + sk`` of the packed
    tensors, the forward adapter's keyword arguments (mask, scale, enable_gqa), backends and fully masked rows."""

    q0: int
    sq: int
    k0: int
    sk: int
    kwargs: dict[str, Any]
    backends: list[Any]
    dead_rows: torch.Tensor
    expand_kv: bool


@dataclass(frozen=True)
class SdpaArgs:
    """The arguments of one SDPA call as the backward's forward passed them (what ``choices`` reads)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kwargs: dict[str, Any]
    backends: list[Any]


def sdpa_backward(
    backend: Any,
    case: AttentionCase,
    inputs: CaseInputs,
    learn_sinks: bool,
    choices: Callable[[Sequence[SdpaArgs]], str],
) -> AutogradBackward:
    """The backward call of an SDPA adapter ``backend`` (an ``attnfast.sdpa`` backend: its ``_prepare_one`` and
    ``_plan`` give each request's call) for ``case``; ``learn_sinks``: rebuild the sink column from a sinks leaf;
    ``choices``: which backend torch picks for calls (the call's ``variant``, see the module docstring)."""
    scale = softmax_scale(case)
    h, dv, total_q = case.num_heads, case.dv, case.total_q
    lse = torch.full((h, total_q), -math.inf, dtype=torch.float32, device=inputs.q.device)
    cu_k = [int(x) for x in inputs.cu_seqlens_k.tolist()]
    calls: list[RequestGradCall] = []
    for seq in sequences(case, inputs):
        prepared, seq_lse = backend._prepare_one(case, inputs, seq, scale)
        lse[:, seq.q0 : seq.q0 + seq.sq] = seq_lse
        if prepared is not None:
            plan = backend._plan(case, seq.sq, seq.sk)
            calls.append(
                RequestGradCall(
                    seq.q0,
                    seq.sq,
                    cu_k[seq.index],
                    seq.sk,
                    prepared.kwargs,
                    prepared.backends,
                    prepared.dead_rows,
                    plan.expand_kv,
                )
            )
    learn = learn_sinks and case.sinks
    group = case.num_heads // case.num_kv_heads
    first: list[SdpaArgs] | None = None  # the first call's SDPA arguments, for the variant

    def forward(leaves: GradLeaves) -> tuple[torch.Tensor, torch.Tensor]:
        from torch.nn.attention import sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        nonlocal first
        pieces, pos, seen = [], 0, []
        zeros = leaves.q.new_zeros
        for c in calls:
            if c.q0 > pos:
                pieces.append(zeros(c.q0 - pos, h, dv))
            q = leaves.q[c.q0 : c.q0 + c.sq]
            k, v = leaves.k[c.k0 : c.k0 + c.sk], leaves.v[c.k0 : c.k0 + c.sk]
            if case.sinks:
                k, v = with_sink_column(k, v)
            if c.expand_kv:
                k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            kwargs = c.kwargs
            if learn:
                assert leaves.sinks is not None
                mask = kwargs["attn_mask"]  # (1, h, sq, sk + 1), the sink column last
                col = leaves.sinks.to(mask.dtype).reshape(1, h, 1, 1).expand(1, h, c.sq, 1)
                kwargs = {**kwargs, "attn_mask": torch.cat([mask[..., :-1].expand(1, h, c.sq, c.sk), col], dim=-1)}
            args = SdpaArgs(
                q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], kwargs, c.backends
            )
            if first is None:
                seen.append(args)
            with sdpa_kernel(c.backends):
                o = sdpa(args.q, args.k, args.v, **kwargs)
            o = o[0].transpose(0, 1)
            pieces.append(o.masked_fill(c.dead_rows[:, None, None] & o.isnan(), 0.0))
            pos = c.q0 + c.sq
        if pos < total_q:
            pieces.append(zeros(total_q - pos, h, dv))
        out = torch.cat(pieces) if pieces else zeros(0, h, dv)
        if first is None:
            first = seen
        return out, lse

    def variant() -> dict[str, Any]:
        return {} if first is None else {"sdpa": choices(first), "deterministic": case.deterministic}

    context = deterministic_algorithms if case.deterministic else contextlib.nullcontext
    notes = () if learn or not case.sinks else ("sinks: a constant bias column here; dsinks not computed",)
    leaves = grad_leaves(inputs, learn_sinks=learn)
    return AutogradBackward(forward, leaves, inputs.dout, context=context, notes=notes, variant=variant)
