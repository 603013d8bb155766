"""A simulated SDPA-CUDA 16-bit backward with ALiBi, and planted ALiBi bugs on top of it.

:class:`SdpaBiasKernelSim` is what a correct fused SDPA kernel computes from what the sdpa-cuda adapter gives it: the
ALiBi bias of :func:`attnfast._torch_common.score_bias`, each row shifted by its top and rounded to the case dtype by
:func:`attnfast.sdpa.bias_for_kernel` (SDPA's fused backends take a bias only in the query dtype), the forward and the
backward in float64 flash-style (P recomputed from the saved LSE, ``D = rowsum(dO * O)`` from the output rounded to the
case dtype, dK and dV summed over a GQA group), P and dS rounded to the case dtype before the matmuls that read them,
the output and the gradients rounded to it (the frame: :mod:`planted_sim`).  A sink is the adapter's extra zero key
whose bias is the sink logit; like sdpa-cuda the simulation learns no sinks (``dsinks`` None).  It declares
:meth:`~attnfast.base.Backend.alibi_bias_dtype` as sdpa-cuda does.  On the H100's failing cases of
``scripts/investigate_bwd_triage.py --only sdpa-cuda-wide`` the bias rounding alone reproduces the kernel's max dQ and
dK errors (``reports/h100-2026-11-27-bwd/README.md``).

Each subclass in :data:`ALIBI_BUGS` plants one mistake in the backward only (the forward is the correct one): the
slopes of the next head, ALiBi on one side only (keys right of the diagonal unpenalised), the slopes kept in bf16,
the dK of the key with the largest one zeroed, the softmax scale one fp16 ulp high.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from attnfast._torch_common import score_bias, visibility
from attnfast.base import GradOutput
from attnfast.sdpa import bias_for_kernel
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from tests.conformance.backward.planted_sim import F64, PlantedSim

__all__ = [
    "ALIBI_BUGS",
    "AlibiOneSidedBackend",
    "KeyDkZeroedBackend",
    "ScaleFp16UlpBackend",
    "SdpaBiasKernelSim",
    "SlopesBf16Backend",
    "SlopesNextHeadBackend",
]


class SdpaBiasKernelSim(PlantedSim):
    """A correct fused SDPA 16-bit backward given sdpa-cuda's rounded ALiBi bias (module docstring).  Must pass."""

    name = "fake-bwd-sdpa-bias-sim"
    description = "test fake: a fused SDPA 16-bit backward fed the adapter's rounded ALiBi bias (float64)"

    def alibi_bias_dtype(self, case: AttentionCase) -> torch.dtype | None:
        return None if case.torch_dtype == torch.float32 else case.torch_dtype

    # the hook the planted bugs override beside PlantedSim's
    def bwd_bias(self, case: AttentionCase, inputs: CaseInputs, sq: int, sk: int) -> torch.Tensor:
        """The fp32 bias (h or 1, sq, sk [+ 1]) the backward recomputes P with (before ``bias_for_kernel``)."""
        return score_bias(case, inputs, sq, sk)

    def grads(self, case: AttentionCase, inputs: CaseInputs) -> GradOutput:
        if not case.alibi or inputs.dout is None or case.softcap is not None:
            raise ValueError(f"{self.name} simulates ALiBi backward cases without a soft-cap only, got {case.id}")
        batch = self.start(case, inputs)
        dt, hk, group, scale = batch.dt, batch.hk, batch.group, batch.scale
        for b, (sq, sk) in enumerate(case.requests):
            q0, k0 = batch.cu_q[b], batch.cu_k[b]
            if sq == 0 or (sk == 0 and not case.sinks):
                continue
            ks, vs = batch.k[k0 : k0 + sk], batch.v[k0 : k0 + sk]
            if case.sinks:  # the adapter's sink key: zeros, its bias the sink logit
                ks, vs = (
                    torch.cat([ks, ks.new_zeros(1, hk, ks.shape[-1])]),
                    torch.cat([vs, vs.new_zeros(1, hk, vs.shape[-1])]),
                )
            qh = batch.q[q0 : q0 + sq].permute(1, 0, 2)  # (h, sq, d)
            kh = ks.repeat_interleave(group, 1).permute(1, 0, 2)
            vh = vs.repeat_interleave(group, 1).permute(1, 0, 2)

            def scores(bias: torch.Tensor, scale_: float) -> torch.Tensor:
                kernel_bias = bias_for_kernel(bias, dt).to(F64)  # what the kernel is given
                return torch.matmul(qh, kh.transpose(-1, -2)) * scale_ + kernel_bias

            s = scores(score_bias(case, inputs, sq, sk), scale)
            lse = torch.logsumexp(s, dim=-1)
            safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
            o = torch.matmul(torch.exp(s - safe[..., None]), vh)  # (h, sq, dv)
            bscale = self.bwd_scale(scale)
            p = torch.exp(scores(self.bwd_bias(case, inputs, sq, sk), bscale) - safe[..., None])
            self.sequence_backward(batch, b, sk, (qh, kh, vh), o, lse, p, bscale)
        return self.finish(batch)


class SlopesNextHeadBackend(SdpaBiasKernelSim):
    """The backward recomputes P with each head's neighbour's slope (head i takes head i + 1's, the last head 0's)."""

    name = "fake-bwd-alibi-slopes-next-head"

    def bwd_bias(self, case: AttentionCase, inputs: CaseInputs, sq: int, sk: int) -> torch.Tensor:
        assert inputs.alibi_slopes is not None
        return score_bias(case, dataclasses.replace(inputs, alibi_slopes=inputs.alibi_slopes.roll(-1)), sq, sk)


class SlopesBf16Backend(SdpaBiasKernelSim):
    """The backward's slopes rounded to bf16 (a kernel keeping them in half precision): relative 2^-9 on each."""

    name = "fake-bwd-alibi-slopes-bf16"

    def bwd_bias(self, case: AttentionCase, inputs: CaseInputs, sq: int, sk: int) -> torch.Tensor:
        assert inputs.alibi_slopes is not None
        slopes = inputs.alibi_slopes.to(torch.bfloat16).float()
        return score_bias(case, dataclasses.replace(inputs, alibi_slopes=slopes), sq, sk)


class AlibiOneSidedBackend(SdpaBiasKernelSim):
    """The backward penalises only keys left of the diagonal (``slope * max(i + sk - sq - j, 0)``: the causal form
    applied to a non-causal case)."""

    name = "fake-bwd-alibi-one-sided"

    def bwd_bias(self, case: AttentionCase, inputs: CaseInputs, sq: int, sk: int) -> torch.Tensor:
        assert inputs.alibi_slopes is not None and not case.sinks
        i = torch.arange(sq, dtype=torch.float32)[:, None] + float(sk - sq)
        j = torch.arange(sk, dtype=torch.float32)[None, :]
        penalty = inputs.alibi_slopes.float()[:, None, None] * (i - j).clamp_min(0)[None]
        mask = torch.zeros(1, sq, sk).masked_fill(~visibility(case, sq, sk), -math.inf)
        return mask - penalty


class KeyDkZeroedBackend(SdpaBiasKernelSim):
    """dK of one key left zero (every KV head): the key of the largest dK (with ALiBi a far key's dK is ~0 anyway)."""

    name = "fake-bwd-alibi-key-dk-zero"

    def zeroed_key(self, dk: torch.Tensor) -> int | None:
        return int(dk.abs().sum((1, 2)).argmax())


class ScaleFp16UlpBackend(SdpaBiasKernelSim):
    """The backward's softmax scale one fp16 ulp high (``x (1 + 2^-10)``), as a scale kept in half precision."""

    name = "fake-bwd-alibi-scale-fp16-ulp"
    scale_factor = 1.0 + 2.0**-10


#: The planted ALiBi bugs -> whether the verdict must catch them (bf16 slopes: a rounding of the bias's own size).
ALIBI_BUGS: dict[type[SdpaBiasKernelSim], bool] = {
    SlopesNextHeadBackend: True,
    AlibiOneSidedBackend: True,
    KeyDkZeroedBackend: True,
    ScaleFp16UlpBackend: True,
    SlopesBf16Backend: False,
}
