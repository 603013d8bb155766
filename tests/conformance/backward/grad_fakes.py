"""Fake backward backends: one exact through autograd, one written out as a flash kernel's backward, and that
written-out backward with one planted gradient bug each.

``AutogradBackend`` differentiates a naive fp32 attention (full score matrix per sequence) with ``torch.autograd``:
an oracle independent of :mod:`attnref.backward`.  ``FlashStyleBackend`` computes the same gradients by the
formulas a flash kernel uses (P recomputed from the saved LSE, ``D = rowsum(dO * O)``, ``dS = P * (dP - D)``, the
soft-cap derivative, dK and dV summed over a GQA group); each subclass flips one of them.  Gradients come back in
the case dtype, the forward's ``out`` in the case dtype and its LSE in fp32, as a kernel returns them.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from attnfast.base import GradOutput
from attnref import AttnOptions, row_bounds
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from conformance.verdict.reference import case_options
from tests.conformance.fakes import ExactBackend

__all__ = [
    "AutogradBackend",
    "CausalDsUnmaskedBackend",
    "FlashStyleBackend",
    "GqaDkFirstHeadBackend",
    "NanGradBackend",
    "NondeterministicBackend",
    "PLANTED_GRAD_BUGS",
    "SoftcapDerivativeMissingBackend",
    "WrongRowLseBackend",
]


class _Seq:
    """One sequence's scores in fp32: ``s`` (h, sq, sk) masked to -inf, ``t`` (the tanh of the soft-cap or None),
    ``visible`` (sq, sk), ``causal_hidden`` (sq, sk): keys right of the causal diagonal."""

    def __init__(self, q, k, v, options: AttnOptions, slopes, scale: float) -> None:
        sq, h, _ = q.shape
        sk = k.shape[0]
        group = h // k.shape[1]
        self.kh = k.repeat_interleave(group, dim=1).permute(1, 0, 2)  # (h, sk, d)
        self.vh = v.repeat_interleave(group, dim=1).permute(1, 0, 2)
        self.qh = q.permute(1, 0, 2)
        s = torch.matmul(self.qh, self.kh.transpose(-1, -2)) * scale
        self.t = None
        if options.softcap is not None:
            self.t = torch.tanh(s / options.softcap)
            s = self.t * options.softcap
        rows, cols = torch.arange(sq), torch.arange(sk)
        if slopes is not None:
            s = s - slopes.reshape(h, 1, 1) * (rows[:, None] + (sk - sq) - cols[None, :]).abs().float()
        lo, hi = row_bounds(rows, sq, sk, options)
        self.visible = (cols[None, :] >= lo[:, None]) & (cols[None, :] < hi[:, None])
        self.causal_hidden = cols[None, :] > rows[:, None] + (sk - sq)
        self.unmasked = s
        self.s = s.masked_fill(~self.visible, -math.inf)


def _forward(s: torch.Tensor, vh: torch.Tensor, sinks) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (h, sq, dv), lse (h, sq)) of masked scores ``s``; fully masked rows: out 0, lse -inf (or the sink)."""
    parts = s if sinks is None else torch.cat([s, sinks.reshape(-1, 1, 1).expand(-1, s.shape[1], 1)], dim=-1)
    lse = torch.logsumexp(parts, dim=-1)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(s - safe[..., None])
    return torch.matmul(p, vh), lse


class FlashStyleBackend(ExactBackend):
    """The backward written out as a flash kernel computes it (fp32, full matrices per sequence).  Must pass."""

    name = "fake-bwd-flash"
    description = "test fake: a flash-style backward in fp32"
    accepts: ClassVar[frozenset[str]] = frozenset({"backward", "bwd_deterministic"})

    def prepare_backward(self, case: AttentionCase, inputs: CaseInputs):
        def run() -> GradOutput:
            return self.grads(case, inputs)

        run.backward_only = None  # type: ignore[attr-defined]
        return run

    # hooks the planted bugs override
    def p_for_backward(self, seq: _Seq, lse: torch.Tensor) -> torch.Tensor:
        safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
        return torch.exp(seq.s - safe[..., None])

    def softcap_derivative(self, seq: _Seq) -> torch.Tensor:
        return 1.0 - seq.t * seq.t

    def sum_group(self, g: torch.Tensor, hk: int) -> torch.Tensor:
        """(h, sk, x) per query head -> (sk, hk, x) summed over each group."""
        h, sk, x = g.shape
        return g.reshape(hk, h // hk, sk, x).sum(1).permute(1, 0, 2)

    def finish_grads(self, dq, dk, dv, dsinks):
        return dq, dk, dv, dsinks

    def grads(self, case: AttentionCase, inputs: CaseInputs) -> GradOutput:
        options = case_options(case)
        q, k, v, do = (x.float() for x in (inputs.q, inputs.k, inputs.v, inputs.dout))
        h, hk, d, dvd = case.num_heads, case.num_kv_heads, case.head_dim, case.dv
        scale = case.scale if case.scale is not None else 1.0 / math.sqrt(d)
        sinks = None if inputs.sinks is None else inputs.sinks.float()
        out = torch.zeros(case.total_q, h, dvd)
        lse_all = torch.full((h, case.total_q), -math.inf)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dsinks = None if sinks is None else torch.zeros(h)
        cu_q, cu_k = inputs.cu_seqlens_q.tolist(), inputs.cu_seqlens_k.tolist()
        for b, (sq, sk) in enumerate(case.requests):
            q0, k0 = cu_q[b], cu_k[b]
            if sq == 0:
                continue
            if sk == 0:
                if sinks is not None:
                    lse_all[:, q0 : q0 + sq] = sinks[:, None]
                continue
            slopes = None if inputs.alibi_slopes is None else inputs.alibi_slopes.float()
            seq = _Seq(q[q0 : q0 + sq], k[k0 : k0 + sk], v[k0 : k0 + sk], options, slopes, scale)
            o, lse = _forward(seq.s, seq.vh, sinks)
            out[q0 : q0 + sq] = o.permute(1, 0, 2)
            lse_all[:, q0 : q0 + sq] = lse
            # backward, from the saved LSE
            doh = do[q0 : q0 + sq].permute(1, 0, 2)  # (h, sq, dv)
            o_rounded = o.to(case.torch_dtype).float()  # D from the output the kernel returned
            delta = (doh * o_rounded).sum(-1, keepdim=True)  # (h, sq, 1)
            p = self.p_for_backward(seq, lse)
            dp = torch.matmul(doh, seq.vh.transpose(-1, -2))
            ds = p * (dp - delta)
            if seq.t is not None:
                ds = ds * self.softcap_derivative(seq)
            dq[q0 : q0 + sq] = (torch.matmul(ds, seq.kh) * scale).permute(1, 0, 2)
            dk[k0 : k0 + sk] += self.sum_group(torch.matmul(ds.transpose(-1, -2), seq.qh) * scale, hk)
            dv[k0 : k0 + sk] += self.sum_group(torch.matmul(p.transpose(-1, -2), doh), hk)
            if dsinks is not None:
                dsinks -= (torch.exp(sinks[:, None] - lse) * delta[..., 0]).sum(-1)
        dt = case.torch_dtype
        dq, dk, dv, dsinks = self.finish_grads(dq, dk, dv, dsinks)
        return GradOutput(out.to(dt), lse_all, dq.to(dt), dk.to(dt), dv.to(dt), dsinks)


class AutogradBackend(FlashStyleBackend):
    """Autograd through the naive fp32 forward: an oracle independent of attnref.backward.  Must pass."""

    name = "fake-bwd-autograd"
    description = "test fake: torch.autograd through a naive fp32 attention"

    def grads(self, case: AttentionCase, inputs: CaseInputs) -> GradOutput:
        options = case_options(case)
        q, k, v = (x.detach().float().clone().requires_grad_() for x in (inputs.q, inputs.k, inputs.v))
        sinks = None if inputs.sinks is None else inputs.sinks.detach().float().clone().requires_grad_()
        scale = case.scale if case.scale is not None else 1.0 / math.sqrt(case.head_dim)
        slopes = None if inputs.alibi_slopes is None else inputs.alibi_slopes.float()
        outs, lses = [], []
        cu_q, cu_k = inputs.cu_seqlens_q.tolist(), inputs.cu_seqlens_k.tolist()
        for b, (sq, sk) in enumerate(case.requests):
            q0, k0 = cu_q[b], cu_k[b]
            if sk == 0:
                outs.append(torch.zeros(sq, case.num_heads, case.dv))
                fill = torch.full((case.num_heads, sq), -math.inf)
                lses.append(fill if sinks is None else sinks.detach()[:, None].expand(-1, sq))
                continue
            seq = _Seq(q[q0 : q0 + sq], k[k0 : k0 + sk], v[k0 : k0 + sk], options, slopes, scale)
            o, lse = _forward(seq.s, seq.vh, sinks)
            outs.append(o.permute(1, 0, 2))
            lses.append(lse.detach())
        out = torch.cat(outs)
        leaves = [q, k, v] + ([sinks] if sinks is not None else [])
        g = torch.autograd.grad(out, leaves, inputs.dout.float(), allow_unused=True)
        g = [torch.zeros_like(x) if gi is None else gi for gi, x in zip(g, leaves)]
        dt = case.torch_dtype
        dsinks = g[3] if sinks is not None else None
        return GradOutput(out.detach().to(dt), torch.cat(lses, dim=1), g[0].to(dt), g[1].to(dt), g[2].to(dt), dsinks)


class GqaDkFirstHeadBackend(FlashStyleBackend):
    """dK (and dV) of a GQA group taken from its first query head only, not summed over the group."""

    name = "fake-bwd-gqa-first-head"

    def sum_group(self, g: torch.Tensor, hk: int) -> torch.Tensor:
        h, sk, x = g.shape
        return g.reshape(hk, h // hk, sk, x)[:, 0].permute(1, 0, 2)


class SoftcapDerivativeMissingBackend(FlashStyleBackend):
    """The soft-cap's derivative ``1 - tanh^2`` left out of dS."""

    name = "fake-bwd-softcap-derivative"

    def softcap_derivative(self, seq: _Seq) -> torch.Tensor:
        return torch.ones_like(seq.t)


class CausalDsUnmaskedBackend(FlashStyleBackend):
    """P recomputed for dS without the causal mask (keys right of the diagonal get a gradient)."""

    name = "fake-bwd-causal-ds"

    def p_for_backward(self, seq: _Seq, lse: torch.Tensor) -> torch.Tensor:
        safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
        s = seq.unmasked.masked_fill(~(seq.visible | seq.causal_hidden), -math.inf)
        return torch.exp(s - safe[..., None])


class WrongRowLseBackend(FlashStyleBackend):
    """P recomputed from the LSE of the previous query row (the saved LSE read one row off)."""

    name = "fake-bwd-lse-row"

    def p_for_backward(self, seq: _Seq, lse: torch.Tensor) -> torch.Tensor:
        return super().p_for_backward(seq, torch.roll(lse, 1, dims=-1))


class NondeterministicBackend(FlashStyleBackend):
    """dQ's last bit changes from call to call (atomics in another order), within any tolerance."""

    name = "fake-bwd-nondeterministic"

    def __init__(self) -> None:
        self.calls = 0

    def grads(self, case: AttentionCase, inputs: CaseInputs) -> GradOutput:
        res = super().grads(case, inputs)
        self.calls += 1
        dq = res.dq.clone()
        dq.view(-1).view(torch.uint8)[0] ^= self.calls % 2  # the last mantissa bit of dq[0, 0, 0], every other call
        return GradOutput(res.out, res.lse, dq, res.dk, res.dv, res.dsinks)


class NanGradBackend(FlashStyleBackend):
    """One NaN in dV where the reference is finite."""

    name = "fake-bwd-nan"

    def finish_grads(self, dq, dk, dv, dsinks):
        dv = dv.clone()
        dv[0, 0, 0] = math.nan
        return dq, dk, dv, dsinks


#: Each planted gradient bug -> the case features that expose it (the sub-check it must fail names the tensor).
PLANTED_GRAD_BUGS: dict[type[FlashStyleBackend], str] = {
    GqaDkFirstHeadBackend: "gqa",
    SoftcapDerivativeMissingBackend: "softcap",
    CausalDsUnmaskedBackend: "causal",
    WrongRowLseBackend: "",
    NondeterministicBackend: "bwd_deterministic",
    NanGradBackend: "",
}
