"""A simulated FA2-like 16-bit soft-capped backward, and planted soft-cap bugs on top of it.

:class:`SoftcapKernelSim` computes the forward and the backward of a case in float64, flash-style (P recomputed from the
saved LSE, ``D = rowsum(dO * O)`` from the output rounded to the case dtype, ``dS = P (dP - D) (1 - t^2)``, dK and dV
summed over a GQA group), and rounds as a 16-bit flash kernel does: P and dS to the case dtype before the matmuls that
read them, the output and the gradients to the case dtype (the frame: :mod:`planted_sim`).  Its soft-cap tanh ``t``
carries an error modelled on FA2's ``tanh.approx.f32`` (:data:`TANH_ABS_ERROR`: uniform in ``+-TANH_ABS_ERROR``, seeded,
the same ``t`` in the forward and the backward, as the kernel evaluates the same instruction in both).  The error size
is calibrated on FA2 2.8.3's fp16 soft-capped backward on an H100 (the four cases of
``scripts/investigate_bwd_triage.py``: kernel dK mean |dK - fp64| 4.58e-4, 4.00e-4, 4.60e-4, 4.17e-4 for d64, d64
causal, d128, d128 causal; this model on the same inputs 4.51e-4, 5.41e-4, 4.55e-4, 5.50e-4: within 2 % on the
non-causal cases, 30 % above on the causal ones).  ``noise = 0`` gives the model without the tanh error.  The size is a
calibration, not the instruction's: ``tanh.approx.f32`` itself errs by at most 7.8e-6 on the H100 (mean under 3.3e-6 in
every band of arguments: ``reports/h100-2026-11-27-bwd/README.md``), a quarter of :data:`TANH_ABS_ERROR`, and a baseline
with it stays at the plain baseline's dK error: where FA2's extra error arises is not known.

Each subclass in :data:`SOFTCAP_BUGS` plants one mistake in the backward only (the forward is the correct one), the
mistakes a soft-capped backward can make: the cap taken as 49 instead of 50, the tanh derivative left out on one
head, one key's dK zeroed, the softmax scale one fp32 or one fp16 ulp high.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from attnfast.base import GradOutput
from attnref import row_bounds
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from conformance.verdict.reference import case_options
from tests.conformance.backward.planted_sim import F64, PlantedSim

__all__ = [
    "CapOffBackend",
    "DtanhOneHeadBackend",
    "KeyDkZeroedBackend",
    "ScaleFp16UlpBackend",
    "ScaleFp32UlpBackend",
    "SOFTCAP_BUGS",
    "SoftcapKernelSim",
    "TANH_ABS_ERROR",
]

#: The absolute error of the simulated kernel's tanh (uniform in +-this): calibrated, see the module docstring.
TANH_ABS_ERROR = 2.0**-15


class SoftcapKernelSim(PlantedSim):
    """A correct FA2-like 16-bit soft-capped backward (see the module docstring).  Must pass."""

    name = "fake-bwd-softcap-sim"
    description = "test fake: an FA2-like 16-bit soft-capped backward (float64 with the kernel's roundings)"
    noise: ClassVar[float] = TANH_ABS_ERROR

    # the hooks the planted bugs override beside PlantedSim's
    def bwd_cap(self, cap: float) -> float:
        return cap

    def dtanh(self, t: torch.Tensor) -> torch.Tensor:
        return 1.0 - t * t

    def grads(self, case: AttentionCase, inputs: CaseInputs) -> GradOutput:
        if case.softcap is None or inputs.dout is None:
            raise ValueError(f"{self.name} simulates soft-capped backward cases only, got {case.id}")
        options = case_options(case)
        batch = self.start(case, inputs)
        h, group, scale = batch.h, batch.group, batch.scale
        cap = float(case.softcap)
        sinks = None if inputs.sinks is None else inputs.sinks.to(F64)
        dsinks = None if sinks is None else torch.zeros(h, dtype=F64)
        gen = torch.Generator().manual_seed(0)
        for b, (sq, sk) in enumerate(case.requests):
            q0, k0 = batch.cu_q[b], batch.cu_k[b]
            if sq == 0 or sk == 0:
                if sinks is not None and sq:
                    batch.lse[:, q0 : q0 + sq] = sinks[:, None]
                continue
            qh = batch.q[q0 : q0 + sq].permute(1, 0, 2)  # (h, sq, d)
            kh = batch.k[k0 : k0 + sk].repeat_interleave(group, 1).permute(1, 0, 2)
            vh = batch.v[k0 : k0 + sk].repeat_interleave(group, 1).permute(1, 0, 2)
            rows, cols = torch.arange(sq), torch.arange(sk)
            lo, hi = row_bounds(rows, sq, sk, options)
            hidden = ~((cols[None, :] >= lo[:, None]) & (cols[None, :] < hi[:, None]))
            bias = torch.zeros(h, sq, sk, dtype=F64)
            if inputs.alibi_slopes is not None:
                dist = (rows[:, None] + (sk - sq) - cols[None, :]).abs().to(F64)
                bias = -inputs.alibi_slopes.to(F64).reshape(h, 1, 1) * dist

            err = (torch.rand(h, sq, sk, generator=gen, dtype=F64) * 2 - 1) * self.noise  # the tanh's error

            def scores(cap_: float, scale_: float) -> tuple[torch.Tensor, torch.Tensor]:
                t = (torch.tanh(torch.matmul(qh, kh.transpose(-1, -2)) * scale_ / cap_) + err).clamp(-1.0, 1.0)
                return t, (t * cap_ + bias).masked_fill(hidden, -math.inf)

            # forward: the kernel's LSE and output (the tanh error included, as the kernel's forward has it)
            t, s = scores(cap, scale)
            parts = s if sinks is None else torch.cat([s, sinks.reshape(h, 1, 1).expand(h, sq, 1)], dim=-1)
            lse = torch.logsumexp(parts, dim=-1)
            safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
            o = torch.matmul(torch.exp(s - safe[..., None]), vh)  # (h, sq, dv)
            # backward from the saved LSE, the scores recomputed (with the same tanh error)
            bcap, bscale = self.bwd_cap(cap), self.bwd_scale(scale)
            t, s = scores(bcap, bscale)
            p = torch.exp(s - safe[..., None])
            delta = self.sequence_backward(batch, b, sk, (qh, kh, vh), o, lse, p, bscale, self.dtanh(t))
            if dsinks is not None and sinks is not None:  # d sink_h = -sum_i P_sink[h, i] D[h, i]
                dsinks -= (torch.exp(sinks[:, None] - lse) * delta[..., 0]).sum(-1)
        return self.finish(batch, dsinks)


class CapOffBackend(SoftcapKernelSim):
    """The backward applies the soft-cap with ``cap - 1`` (49 for 50): scores, P and the tanh derivative."""

    name = "fake-bwd-softcap-cap-off"

    def bwd_cap(self, cap: float) -> float:
        return cap - 1.0


class DtanhOneHeadBackend(SoftcapKernelSim):
    """The tanh derivative ``1 - t^2`` left out of dS on query head 0 only."""

    name = "fake-bwd-softcap-dtanh-head0"

    def dtanh(self, t: torch.Tensor) -> torch.Tensor:
        d = 1.0 - t * t
        d[0] = 1.0
        return d


class KeyDkZeroedBackend(SoftcapKernelSim):
    """dK of one key (the middle key of the batch, every KV head) left zero."""

    name = "fake-bwd-softcap-key-dk-zero"

    def zeroed_key(self, dk: torch.Tensor) -> int | None:
        return dk.shape[0] // 2


class ScaleFp32UlpBackend(SoftcapKernelSim):
    """The backward's softmax scale one fp32 ulp high (``x (1 + 2^-23)``): below any rounding, not a bug to catch."""

    name = "fake-bwd-softcap-scale-fp32-ulp"
    scale_factor = 1.0 + 2.0**-23


class ScaleFp16UlpBackend(SoftcapKernelSim):
    """The backward's softmax scale one fp16 ulp high (``x (1 + 2^-10)``), as a scale kept in half precision."""

    name = "fake-bwd-softcap-scale-fp16-ulp"
    scale_factor = 1.0 + 2.0**-10


#: The planted soft-cap bugs -> whether the verdict must catch them (an fp32 ulp of the scale is below rounding).
SOFTCAP_BUGS: dict[type[SoftcapKernelSim], bool] = {
    CapOffBackend: True,
    DtanhOneHeadBackend: True,
    KeyDkZeroedBackend: True,
    ScaleFp16UlpBackend: True,
    ScaleFp32UlpBackend: False,
}
