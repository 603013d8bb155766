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
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

import torch

from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

from ._torch_common import sequences, softmax_scale, with_sink_column
from .autograd import AutogradBackward, GradLeaves, deterministic_algorithms, grad_leaves

__all__ = ["RequestGradCall", "sdpa_backward"]


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


def sdpa_backward(backend: Any, case: AttentionCase, inputs: CaseInputs, learn_sinks: bool) -> AutogradBackward:
    """The backward call of an SDPA adapter ``backend`` (an ``attnfast.sdpa`` backend: its ``_prepare_one`` and
    ``_plan`` give each request's call) for ``case``; ``learn_sinks``: rebuild the sink column from a sinks leaf."""
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

    def forward(leaves: GradLeaves) -> tuple[torch.Tensor, torch.Tensor]:
        from torch.nn.attention import sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        pieces, pos = [], 0
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
            with sdpa_kernel(c.backends):
                o = sdpa(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], **kwargs)
            o = o[0].transpose(0, 1)
            pieces.append(o.masked_fill(c.dead_rows[:, None, None] & o.isnan(), 0.0))
            pos = c.q0 + c.sq
        if pos < total_q:
            pieces.append(zeros(total_q - pos, h, dv))
        out = torch.cat(pieces) if pieces else zeros(0, h, dv)
        return out, lse

    context = deterministic_algorithms if case.deterministic else contextlib.nullcontext
    notes = () if learn or not case.sinks else ("sinks: a constant bias column here; dsinks not computed",)
    return AutogradBackward(forward, grad_leaves(inputs, learn_sinks=learn), inputs.dout, context=context, notes=notes)
