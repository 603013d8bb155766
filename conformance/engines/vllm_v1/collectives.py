"""Seed ``001``'s DCP collectives: the LSE-corrected all-gather / reduce-scatter and the groups that run them.

* :func:`correct_attn_out` and :func:`cp_lse_ag_out_rs` (vLLM's ``vllm/v1/attention/ops/common.py``): all-gather the
  ranks' LSEs ``(world, tokens, heads)``, rescale the rank's partial by ``exp(lse_rank - logsumexp(lses))`` (NaN and
  ``+inf`` LSEs read as ``-inf``, an all ``-inf`` row gets factor 0), reduce-scatter the sum so each rank keeps its
  own heads, and slice the global LSE to them;
* the groups, with vLLM's ``GroupCoordinator`` surface (``all_gather(t, dim)``, ``reduce_scatter(t, dim)``):
  :class:`ThreadGroup` runs the ranks as threads of one process (the replay the verdict judges), :class:`DistGroup`
  wraps a ``torch.distributed`` group (gloo on CPU, NCCL on GPUs), one process per rank.

Both DCP forwards use them: the seed's two calls per rank (:mod:`conformance.engines.vllm_v1.dcp`) and the kernel's
own cp arguments (:mod:`conformance.engines.vllm_v1.dcp_kernel`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["DistGroup", "ThreadGroup", "correct_attn_out", "cp_lse_ag_out_rs"]


# ---------------------------------------------------------------------------------------------- the merge
def correct_attn_out(out: torch.Tensor, lses: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's ``correct_attn_out``: ``out (B, H, D)`` of ``rank`` rescaled by its share of the global softmax,
    ``lses (N, B, H)`` every rank's LSE; returns the rescaled output (in ``out``'s dtype) and the global LSE."""
    lf = lses.float()
    clean = torch.where(torch.isnan(lf) | (lf == torch.inf), -torch.inf, lf)
    top = clean.amax(dim=0)
    top = torch.where(top == -torch.inf, torch.zeros_like(top), top)
    lse = torch.log(torch.exp(clean - top).sum(dim=0)) + top
    mine = lf[rank] - lse
    mine = torch.where(torch.isnan(mine) | (mine == torch.inf), -torch.inf, mine)
    return (out.float() * torch.exp(mine)[..., None]).to(out.dtype), lse


def cp_lse_ag_out_rs(out: torch.Tensor, lse: torch.Tensor, group: Any, return_lse: bool = False):
    """vLLM's ``cp_lse_ag_out_rs``: ``out (B, H, D)`` and ``lse (B, H)`` of one rank (all heads) to the corrected
    output of the rank's ``H / world`` heads (and their global LSE)."""
    if group.world_size == 1:
        return (out, lse) if return_lse else out
    lses = group.all_gather(lse.contiguous(), dim=0).view((group.world_size, *lse.shape))
    out, glse = correct_attn_out(out, lses, group.rank_in_group)
    out = group.reduce_scatter(out, dim=1)
    if not return_lse:
        return out
    heads = glse.shape[1] // group.world_size
    return out, glse[:, heads * group.rank_in_group : heads * (group.rank_in_group + 1)]


# ---------------------------------------------------------------------------------------------- groups
class ThreadGroup:
    """The ranks of one process as threads; collectives meet at a barrier (sums in rank order, in the dtype)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.barrier = threading.Barrier(world_size, timeout=300)
        self.slots: list[Any] = [None] * world_size

    def rank(self, rank: int) -> _ThreadRank:
        return _ThreadRank(self, rank)

    def run(self, fn: Callable[[int, Any], Any]) -> list[Any]:
        """``fn(rank, group)`` on one thread per rank; the first exception of a rank is raised."""
        results: list[Any] = [None] * self.world_size
        errors: list[BaseException] = []

        def target(r: int) -> None:
            try:
                results[r] = fn(r, self.rank(r))
            except BaseException as exc:  # noqa: BLE001 - re-raised below, after the other ranks stop
                errors.append(exc)
                self.barrier.abort()

        threads = [threading.Thread(target=target, args=(r,)) for r in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
        if errors:
            raise (real or errors)[0]
        return results


class _ThreadRank:
    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group, self.rank_in_group, self.world_size = group, rank, group.world_size

    def _exchange(self, t: torch.Tensor) -> list[torch.Tensor]:
        self.group.slots[self.rank_in_group] = t
        self.group.barrier.wait()
        parts = list(self.group.slots)
        self.group.barrier.wait()
        return parts

    def all_gather(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return torch.cat(self._exchange(t), dim=dim)

    def reduce_scatter(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        parts = self._exchange(t)
        total = parts[0]
        for p in parts[1:]:
            total = total + p
        return total.chunk(self.world_size, dim=dim)[self.rank_in_group].contiguous()


class DistGroup:
    """A ``torch.distributed`` group (gloo or NCCL) with the same two collectives."""

    def __init__(self, group: Any, rank: int, world_size: int) -> None:
        self.group, self.rank_in_group, self.world_size = group, rank, world_size

    def all_gather(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        import torch.distributed as dist

        t = t.contiguous()
        out = torch.empty((self.world_size * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
        ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
        ag(out, t, group=self.group)
        return torch.cat(out.chunk(self.world_size, dim=0), dim=dim)

    def reduce_scatter(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        import torch.distributed as dist

        x = t.movedim(dim, 0).contiguous()
        out = torch.empty((x.shape[0] // self.world_size, *x.shape[1:]), dtype=x.dtype, device=x.device)
        rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # renamed in torch 2.13
        rs(out, x, group=self.group)
        return out.movedim(0, dim).contiguous()
