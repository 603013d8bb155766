"""An example third-party attnfast backend: key-chunked online-softmax attention in plain PyTorch.

It stands for a vendor's kernel: it lives outside the attnconf repository, registers itself
through the ``attnfast.backends`` entry point (see ``pyproject.toml``), declares what it supports
with a reason for every refusal, does its per-case conversions in ``prepare`` and returns a
callable that runs only the "kernel".  The kernel walks each sequence's keys in chunks of
:data:`CHUNK` with a running max and sum (the FlashAttention recurrence), so it is an independent
implementation, not a call into :mod:`attnref`.

Semantics (bottom-right aligned masks, ``../shared/SEMANTICS.md``): query row ``i`` of a sequence
with ``sq`` queries and ``sk`` keys sees key ``j`` iff ``p - left <= j <= p + right`` with
``p = i + sk - sq`` (``None`` = unbounded; causal means ``right = 0``); soft-cap before masking;
sinks join only the softmax denominator.  LSE of a row that sees no key: ``-inf`` (or the sink).

Backward: the kernel is plain differentiable PyTorch, so the backend declares the opt-in ``backward`` feature and its
``prepare_backward`` runs the same kernel through autograd with :class:`attnfast.autograd.AutogradBackward` (leaf
q/k/v and the sinks; the gradients come back in the varlen layouts).  A kernel with its own backward would call it
there instead and return an :class:`attnfast.base.GradOutput`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attnfast.autograd import AutogradBackward, GradLeaves, grad_leaves
from attnfast.base import Backend, KernelOutput, Support, package_version
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

__all__ = ["ChunkedTorchBackend", "chunked_attention", "CHUNK"]

#: Keys processed per step; small so that short test sequences still cross chunk boundaries.
CHUNK = 64


def chunked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    causal: bool,
    left: int | None,
    right: int | None,
    softcap: float | None,
    sinks: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: q (sq, h, d), k (sk, hk, d), v (sk, hk, dv) -> out (sq, h, dv) fp32, lse (h, sq)."""
    sq, h, _ = q.shape
    sk, hk, dv = v.shape
    group = h // hk
    qf = q.float().transpose(0, 1)  # (h, sq, d)
    m = torch.full((h, sq), -math.inf, device=q.device)
    denom = torch.zeros(h, sq, device=q.device)
    acc = torch.zeros(h, sq, dv, device=q.device)
    pos = torch.arange(sq, device=q.device) + (sk - sq)  # each row's diagonal position
    right = 0 if causal else right
    for start in range(0, sk, CHUNK):
        kc = k[start : start + CHUNK].float().repeat_interleave(group, dim=1).transpose(0, 1)  # (h, c, d)
        vc = v[start : start + CHUNK].float().repeat_interleave(group, dim=1).transpose(0, 1)
        s = torch.matmul(qf, kc.transpose(1, 2)) * scale  # (h, sq, c)
        if softcap is not None:
            s = softcap * torch.tanh(s / softcap)
        j = torch.arange(start, start + kc.shape[1], device=q.device)
        visible = torch.ones(sq, j.numel(), dtype=torch.bool, device=q.device)
        if left is not None:
            visible &= j[None, :] >= (pos - left)[:, None]
        if right is not None:
            visible &= j[None, :] <= (pos + right)[:, None]
        s = s.masked_fill(~visible, -math.inf)
        m_new = torch.maximum(m, s.amax(dim=-1))
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(s - m_safe[..., None])
        rescale = torch.exp(m - m_safe)
        denom = denom * rescale + p.sum(-1)
        acc = acc * rescale[..., None] + torch.matmul(p, vc)
        m = m_new
    seen = denom > 0
    safe = torch.where(seen, denom, torch.ones_like(denom))
    out = torch.where(seen[..., None], acc / safe[..., None], torch.zeros_like(acc))
    lse = torch.where(seen, m + torch.log(safe), torch.full_like(denom, -math.inf))
    if sinks is not None:
        total = torch.logaddexp(lse, sinks.float()[:, None].expand_as(lse))
        out = out * torch.exp(lse - total)[..., None]
        lse = total
    return out.transpose(0, 1), lse


class ChunkedTorchBackend(Backend):
    """Chunked online-softmax attention in PyTorch, on CPU or CUDA (contiguous KV only)."""

    name = "example-chunked"
    family = "example-chunked"
    devices = ("cpu", "cuda")
    description = "example third-party backend: key-chunked online softmax in plain PyTorch"
    refused = {
        "paged": "reads contiguous keys only (no block table)",
        "hnd": "reads contiguous keys only (no block table)",
        "append": "does not write into a KV cache",
        "alibi": "has no ALiBi bias",
        "local_chunk": "has no chunked local attention",
        "splits": "has no split-KV",
    }
    #: opt-in features it handles: the backward through autograd (no deterministic switch: not declared)
    accepts = frozenset({"backward"})

    def version(self) -> str:
        return package_version("attnfast-example-backend")

    def is_available(self) -> Support:
        return Support(True)

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        # Host-side metadata is read once here, so the returned callable does no device sync.
        run = self._run(case, inputs, inputs.q, inputs.k, inputs.v, inputs.sinks)
        return lambda: run()[0]

    def prepare_backward(self, case: AttentionCase, inputs: CaseInputs) -> AutogradBackward:
        """The same kernel through autograd: gradients of q, k, v (and the sinks) by torch."""

        leaves = grad_leaves(inputs, learn_sinks=case.sinks)
        run = self._run(case, inputs, leaves.q, leaves.k, leaves.v, leaves.sinks)

        def forward(_: GradLeaves) -> tuple[torch.Tensor, torch.Tensor]:
            res, out = run()  # the kernel on the leaves, with the autograd graph
            return out, res.lse

        return AutogradBackward(forward, leaves, inputs.dout)

    def _run(self, case, inputs, q, k, v, sinks) -> Callable[[], tuple[KernelOutput, torch.Tensor]]:
        cu_q = inputs.cu_seqlens_q.tolist()
        cu_k = inputs.cu_seqlens_k.tolist()
        scale = case.scale if case.scale is not None else 1.0 / math.sqrt(case.head_dim)
        left, right = case.window

        def run() -> tuple[KernelOutput, torch.Tensor]:
            outs = []
            lse = torch.full((case.num_heads, q.shape[0]), -math.inf, device=q.device)
            for b in range(case.batch):
                qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
                o, s = chunked_attention(
                    q[qs],
                    k[ks],
                    v[ks],
                    scale=scale,
                    causal=case.causal,
                    left=left,
                    right=right,
                    softcap=case.softcap,
                    sinks=sinks,
                )
                outs.append(o.to(q.dtype))
                lse[:, qs] = s.detach()
            out = torch.cat(outs) if outs else q.new_zeros(0, case.num_heads, case.dv)
            return KernelOutput(out.detach(), lse), out

        return run
