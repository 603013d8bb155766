"""The frame of the simulated 16-bit flash backwards that planted bugs are put on (:mod:`alibi_sim`,
:mod:`softcap_sim`).

:class:`PlantedSim` holds what the simulations share: a case's inputs in float64 and its zeroed outputs
(:class:`SimBatch`), one sequence's flash-style backward from the probabilities recomputed with the saved LSE
(``D = rowsum(dO * O)`` from the output rounded to the case dtype, ``dS = P (dP - D)`` times an optional factor, P and
dS rounded to the case dtype before the matmuls that read them, dK and dV summed over a GQA group), and the result
rounded to the case dtype.  A simulation computes each sequence's forward and its P; the hooks below are what the
planted bugs shared by the simulations override: the backward's softmax scale (:attr:`PlantedSim.scale_factor`)
and one key's dK left zero (:meth:`PlantedSim.zeroed_key`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import torch

from attnfast.base import GradOutput
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from tests.conformance.backward.grad_fakes import FlashStyleBackend

__all__ = ["F64", "PlantedSim", "SimBatch"]

F64 = torch.float64


@dataclasses.dataclass
class SimBatch:
    """A case's q, k, v, dout in float64 (varlen layouts), its sizes, and the outputs the sequences fill."""

    dt: torch.dtype
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor
    h: int
    hk: int
    scale: float
    out: torch.Tensor
    lse: torch.Tensor
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    cu_q: list[int]
    cu_k: list[int]

    @property
    def group(self) -> int:
        return self.h // self.hk

    def rnd(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` rounded to the case dtype, back in float64."""
        return x.to(self.dt).to(F64)


class PlantedSim(FlashStyleBackend):
    """The shared frame of a simulated 16-bit flash backward (module docstring); subclasses write ``grads``."""

    accepts: ClassVar[frozenset[str]] = frozenset({"backward"})
    #: the backward's softmax scale over the forward's (1: none of the scale bugs)
    scale_factor: ClassVar[float] = 1.0

    # hooks the planted bugs override
    def bwd_scale(self, scale: float) -> float:
        return scale * self.scale_factor

    def zeroed_key(self, dk: torch.Tensor) -> int | None:
        """The key whose dK (every KV head) is left zero; None: none."""
        return None

    def finish_dk(self, dk: torch.Tensor) -> torch.Tensor:
        key = self.zeroed_key(dk)
        if key is None:
            return dk
        dk = dk.clone()
        dk[key] = 0.0
        return dk

    def start(self, case: AttentionCase, inputs: CaseInputs) -> SimBatch:
        """The case's inputs in float64, its zeroed outputs (LSE -inf) and its sequences' offsets."""
        assert inputs.dout is not None
        q, k, v, do = (x.to(F64) for x in (inputs.q, inputs.k, inputs.v, inputs.dout))
        h = case.num_heads
        return SimBatch(
            dt=case.torch_dtype,
            q=q,
            k=k,
            v=v,
            do=do,
            h=h,
            hk=case.num_kv_heads,
            scale=case.scale if case.scale is not None else 1.0 / math.sqrt(case.head_dim),
            out=torch.zeros(case.total_q, h, case.dv, dtype=F64),
            lse=torch.full((h, case.total_q), -math.inf, dtype=F64),
            dq=torch.zeros_like(q),
            dk=torch.zeros_like(k),
            dv=torch.zeros_like(v),
            cu_q=inputs.cu_seqlens_q.tolist(),
            cu_k=inputs.cu_seqlens_k.tolist(),
        )

    def sequence_backward(
        self,
        batch: SimBatch,
        b: int,
        sk: int,
        heads: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        o: torch.Tensor,
        lse: torch.Tensor,
        p: torch.Tensor,
        bscale: float,
        ds_factor: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Sequence ``b``'s output and LSE recorded, its gradients written (dK, dV of its first ``sk`` keys).

        ``heads``: its (qh, kh, vh) per query head, (h, tokens, .); ``o`` (h, sq, dv) and ``lse`` (h, sq) its forward;
        ``p`` (h, sq, keys) the backward's probabilities.  Returns ``D`` (h, sq, 1).
        """
        qh, kh, vh = heads
        q0, k0, sq = batch.cu_q[b], batch.cu_k[b], qh.shape[1]
        batch.out[q0 : q0 + sq] = o.permute(1, 0, 2)
        batch.lse[:, q0 : q0 + sq] = lse
        doh = batch.do[q0 : q0 + sq].permute(1, 0, 2)
        delta = (doh * batch.rnd(o)).sum(-1, keepdim=True)
        ds = p * (torch.matmul(doh, vh.transpose(-1, -2)) - delta)
        ds = batch.rnd(ds if ds_factor is None else ds * ds_factor)
        p = batch.rnd(p)
        batch.dq[q0 : q0 + sq] = (torch.matmul(ds, kh) * bscale).permute(1, 0, 2)
        batch.dk[k0 : k0 + sk] += self.sum_group(torch.matmul(ds.transpose(-1, -2), qh) * bscale, batch.hk)[:sk]
        batch.dv[k0 : k0 + sk] += self.sum_group(torch.matmul(p.transpose(-1, -2), doh), batch.hk)[:sk]
        return delta

    def finish(self, batch: SimBatch, dsinks: torch.Tensor | None = None) -> GradOutput:
        """The outputs rounded to the case dtype (LSE and dsinks to fp32), dK through :meth:`finish_dk`."""
        dt = batch.dt
        dk = self.finish_dk(batch.dk)
        ds32 = None if dsinks is None else dsinks.float()
        return GradOutput(batch.out.to(dt), batch.lse.float(), batch.dq.to(dt), dk.to(dt), batch.dv.to(dt), ds32)
