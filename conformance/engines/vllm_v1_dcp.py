"""Seed ``001``'s decode context parallelism (``FlashAttentionImpl._forward_with_dcp``), in one process or many.

Under DCP every rank of the group holds every ``block_size * world``-token *virtual block* of a sequence's
table, but only its share of the tokens: token ``t`` lives on rank ``(t // interleave) % world`` (vLLM's
``compute_slot_mapping``: offset ``o = t % (block_size * world)`` in the virtual block, owner ``o // interleave %
world``, local offset ``o // (world * interleave) * interleave + o % interleave``; other ranks get slot -1), so a
rank holds ``get_dcp_local_seq_lens`` tokens of each context.  The kv heads are replicated across the group (DCP
needs ``tp_size > num_kv_heads``, so a rank has one kv head) while the query heads are the ranks' tensor-parallel
shards.  Per rank (:func:`dcp_rank_forward`):

1. ``query_across_dcp = all_gather(query, dim=1)``: every rank's query heads;
2. the context: ``flash_attn_varlen_func`` of all gathered heads over the rank's local context (the cache through
   the shared block table, ``cu_seqlens_k`` from ``dcp_context_kv_lens``), no mask, with LSE;
3. ``cp_lse_ag_out_rs`` (vLLM's ``vllm/v1/attention/ops/common.py``): all-gather the LSEs ``(world, tokens,
   heads)``, rescale the rank's partial by ``exp(lse_rank - logsumexp(lses))`` (``correct_attn_out``: NaN and
   ``+inf`` LSEs read as ``-inf``, an all ``-inf`` row gets factor 0), reduce-scatter the sum so each rank keeps
   its own heads, and slice the global LSE to them;
4. the new tokens: ``flash_attn_varlen_func`` of the rank's heads over the step's own keys (``cu_seqlens_k =
   cu_seqlens_q``), causal, with LSE;
5. ``merge_attn_states`` of 3 and 4 into the rank's heads of the output.

The layer output is the ranks' head shards side by side.  The collectives go through a group with vLLM's
``GroupCoordinator`` surface (``all_gather(t, dim)``, ``reduce_scatter(t, dim)``): :class:`ThreadGroup` runs the
ranks as threads of one process (the replay the verdict judges, :func:`dcp_forward`), :class:`DistGroup` over
``torch.distributed`` (gloo on CPU, NCCL on GPUs), one process per rank: :func:`run_dcp` /
:func:`run_dcp_worlds` spawn them, each rank builds its own share of the cache, and rank 0 judges the gathered
output against the reference and against the single-process replay.

Scenarios marked ``kernel_cp`` replay the variant that gives the kernel its own context-parallel arguments
(``cp_world_size`` / ``cp_rank`` / ``cp_tot_seqused_k``): one causal call per rank over its share of every key,
no second merge (:mod:`conformance.engines.vllm_v1_dcp_kernel`); :func:`dcp_calls` and :func:`dcp_rank_forward`
dispatch to it.  Script (``--kernel-cp``: only those scenarios)::

    python -m conformance.engines.vllm_v1_dcp --world 2 --backend fa3-vllm --device cuda
    python -m conformance.engines.vllm_v1_dcp --world 3 --backend sdpa-cpu --device cpu
    python -m conformance.engines.vllm_v1_dcp --world 2 --world 3 --backend sdpa-cpu --device cpu --kernel-cp
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

from .base import Kernel
from .calls import PagedKV, call_case, contiguous_call, paged_call
from .merge import merge_attn_states
from .vllm_v1_metadata import get_dcp_local_seq_lens
from .vllm_v1_scenarios import SCENARIOS

if TYPE_CHECKING:
    from .vllm_v1_fa import VllmV1FlashAttention
    from .vllm_v1_runner import Step

__all__ = [
    "DistGroup",
    "ThreadGroup",
    "correct_attn_out",
    "cp_lse_ag_out_rs",
    "dcp_calls",
    "dcp_forward",
    "dcp_rank_forward",
    "dcp_slot",
    "run_dcp",
    "run_dcp_worlds",
]


# ---------------------------------------------------------------------------------------------- placement
def dcp_slot(engine: VllmV1FlashAttention, step: Step, b: int, pos: int, rank: int) -> int:
    """vLLM's DCP slot of token ``pos`` of (reordered) request ``b`` on ``rank``; -1 where another rank holds it."""
    bs, world, inter = step.block_size, step.dcp, step.interleave
    span = bs * world
    offset = pos % span
    if engine._dcp_owner(offset, world, inter) != rank:
        return -1
    local = offset // (world * inter) * inter + offset % inter
    return step.table[b][pos // span] * bs + local


def _local_context(step: Step, rank: int) -> list[int]:
    ctx = torch.tensor([k - q for q, k in zip(step.q_lens, step.kv_lens)], dtype=torch.int32)
    return get_dcp_local_seq_lens(ctx, step.dcp, rank, step.interleave).tolist()


def dcp_calls(case: AttentionCase, step: Step) -> list[tuple[str, AttentionCase]]:
    """Each rank's two calls: the gathered heads over its context share, its own heads over the new tokens (a
    ``kernel_cp`` scenario: each rank's one call, :func:`~conformance.engines.vllm_v1_dcp_kernel.kernel_cp_calls`)."""
    if SCENARIOS[case.scenario].kernel_cp:
        from .vllm_v1_dcp_kernel import kernel_cp_calls

        return kernel_cp_calls(case, step)
    out = []
    heads = case.num_heads // step.dcp
    for rank in range(step.dcp):
        ctx = [(q, c) for q, c in zip(step.q_lens, _local_context(step, rank))]
        out.append((f"rank {rank}: context (all-gathered q, local KV, unmasked)", call_case(case, ctx, causal=False)))
        new = [(q, q) for q in step.q_lens]
        query = call_case(case, new, num_heads=heads, kv_layout="contiguous", block_size=None)
        out.append((f"rank {rank}: new tokens (causal)", query))
    return out


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


# ---------------------------------------------------------------------------------------------- the forward
def dcp_rank_forward(
    engine: VllmV1FlashAttention,
    case: AttentionCase,
    inputs: CaseInputs,
    step: Step,
    rank: int,
    group: Any,
    kernel: Kernel,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One rank's ``_forward_with_dcp``: output ``(tokens, h / world, d)`` and LSE of its heads (reordered tokens);
    a ``kernel_cp`` scenario runs :func:`~conformance.engines.vllm_v1_dcp_kernel.kernel_cp_rank_forward`."""
    if engine.scenario(case).kernel_cp:
        from .vllm_v1_dcp_kernel import kernel_cp_rank_forward

        return kernel_cp_rank_forward(engine, case, inputs, step, rank, group, kernel)
    dev = inputs.q.device
    heads = case.num_heads // step.dcp
    calls = dict(dcp_calls(case, step))
    cache = engine.make_cache(case, inputs, step, rank)
    meta = engine.builder(step, rank).build(0, engine.common_metadata(case, step, rank, dev))
    rows = engine.new_token_rows(inputs, step)
    engine.write_cache(case, inputs, cache, rows, meta.slot_mapping.tolist())
    tok = torch.tensor(step.token_index, dtype=torch.long, device=dev)
    query = inputs.q[tok][:, rank * heads : (rank + 1) * heads].contiguous()
    query_across_dcp = group.all_gather(query, dim=1)
    label = f"rank {rank}: context (all-gathered q, local KV, unmasked)"
    k_view, v_view = engine._kernel_view(cache)
    paged = PagedKV(k_view, v_view, meta.block_table, [], cache.block_size, case.kv_layout)
    context = kernel(paged_call(label, calls[label], query_across_dcp, paged, meta.block_table))
    if context.lse is None:
        raise ValueError(f"{label}: DCP needs the LSE; this backend returned none")
    out_cor, lse_cor = cp_lse_ag_out_rs(context.out, context.lse.transpose(0, 1), group, return_lse=True)
    lse_cor = lse_cor.transpose(0, 1).contiguous()
    label = f"rank {rank}: new tokens (causal)"
    new = kernel(contiguous_call(label, calls[label], query, inputs.k[rows], inputs.v[rows]))
    if new.lse is None:
        raise ValueError(f"{label}: DCP needs the LSE; this backend returned none")
    return merge_attn_states(out_cor, lse_cor, new.out, new.lse)


def dcp_forward(
    engine: VllmV1FlashAttention, case: AttentionCase, inputs: CaseInputs, step: Step, kernel: Kernel
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank as a thread of this process; the head shards side by side (reordered tokens).

    The ranks' kernel calls run one at a time (a lock, never held across a collective): a JIT kernel compiled
    from several threads at once is not safe (FA4 on the H100: SIGABRT in ``dcp3_mixed`` when three ranks met
    its first call together), and the ranks' calls are independent, so the order changes no result."""
    lock = threading.Lock()

    def one_at_a_time(call: Any) -> Any:
        with lock:
            return kernel(call)

    results = ThreadGroup(step.dcp).run(lambda r, g: dcp_rank_forward(engine, case, inputs, step, r, g, one_at_a_time))
    return torch.cat([o for o, _ in results], dim=1), torch.cat([lse for _, lse in results], dim=0)


# ---------------------------------------------------------------------------------------------- processes
def _worker(
    rank: int,
    nprocs: int,
    cases_json: str,
    worlds: list[int],
    backend_name: str,
    device: str,
    seed: int,
    tmp: str,
    init: str,
) -> None:
    import torch.distributed as dist

    from attnfast.registry import get_backend
    from conformance.engines.base import backend_kernel
    from conformance.engines.vllm_v1_fa import VllmV1FlashAttention
    from conformance.verdict.check import compare
    from conformance.verdict.tolerance import resolve

    cuda = device.startswith("cuda")
    dev = f"cuda:{rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)  # small tensors, ranks sharing the cores: thread wake-ups would dominate
    dist.init_process_group("nccl" if cuda else "gloo", init_method=init, rank=rank, world_size=nprocs)
    groups = {w: dist.new_group(list(range(w))) for w in worlds}
    engine = VllmV1FlashAttention()
    kernel = backend_kernel(get_backend(backend_name), dev)
    results = []
    for data in json.loads(cases_json):
        case = AttentionCase.from_json(data)
        from conformance.cases.inputs import make_inputs

        inputs = engine.layer_inputs(case, make_inputs(case, seed, dev))
        for w in sorted(worlds, reverse=True):  # the largest group first: every rank's first-call costs in parallel
            if rank >= w:
                continue
            step = engine.step(case, world=w)
            group = DistGroup(groups[w], rank, w)
            out, lse = dcp_rank_forward(engine, case, inputs, step, rank, group, kernel)
            full = engine._restore(step, group.all_gather(out, dim=1), group.all_gather(lse, dim=0))
            if rank:
                continue
            single = engine._restore(step, *dcp_forward(engine, case, inputs, step, kernel))
            ref, base = engine.reference(case, inputs), engine.baseline(case, inputs)
            tol = resolve(case, backend_name)
            stats, stats_single = compare(ref, base, full, tol), compare(ref, base, single, tol)
            results.append(
                dict(
                    case_id=case.id,
                    scenario=case.scenario,
                    world=w,
                    backend=backend_name,
                    device=device,
                    status="pass" if not stats.failed_checks else "fail",
                    failed_checks=list(stats.failed_checks),
                    error_ratio=stats.error_ratio,
                    single_status="pass" if not stats_single.failed_checks else "fail",
                    single_error_ratio=stats_single.error_ratio,
                    max_abs_vs_single=float((full.out.float() - single.out.float()).abs().max()),
                    lse_max_abs_vs_single=float((full.lse - single.lse).abs().nan_to_num(0.0).max()),
                )
            )
    if rank == 0:
        with open(os.path.join(tmp, "results.json"), "w") as fh:
            json.dump(results, fh)
    dist.destroy_process_group()


def run_dcp_worlds(
    cases: Sequence[AttentionCase], worlds: Sequence[int], backend_name: str, device: str = "cpu", seed: int = 0
) -> list[dict[str, Any]]:
    """Run the DCP replay of ``cases`` across real processes for each world size in ``worlds`` (one spawn of
    ``max(worlds)`` processes, a subgroup per world size; gloo on CPU, NCCL with one GPU per rank on CUDA).

    Returns one dict per (case, world): the verdict of the gathered output against the reference
    (``status``, ``error_ratio``, ``failed_checks``), the single-process replay's, and their difference."""
    import torch.multiprocessing as mp

    nprocs = max(worlds)
    if device.startswith("cuda") and torch.cuda.device_count() < nprocs:
        raise ValueError(f"world {nprocs} needs {nprocs} GPUs, found {torch.cuda.device_count()}")
    payload = json.dumps([c.to_json() for c in cases])
    with tempfile.TemporaryDirectory(prefix="dcp-") as tmp:
        with socket.socket() as sock:  # a free port for the TCP store (rank 0 binds it right after)
            sock.bind(("127.0.0.1", 0))
            init = f"tcp://127.0.0.1:{sock.getsockname()[1]}"
        args = (nprocs, payload, list(worlds), backend_name, device, seed, tmp, init)
        mp.spawn(_worker, args=args, nprocs=nprocs)
        with open(os.path.join(tmp, "results.json")) as fh:
            return json.load(fh)


def run_dcp(case: AttentionCase, world_size: int, backend_name: str, device: str = "cpu", seed: int = 0) -> dict:
    """One case across ``world_size`` processes (see :func:`run_dcp_worlds`)."""
    return run_dcp_worlds([case], [world_size], backend_name, device, seed)[0]


def main(argv: Sequence[str] | None = None) -> int:
    from conformance.engines.vllm_v1_fa import VllmV1FlashAttention

    parser = argparse.ArgumentParser(
        prog="python -m conformance.engines.vllm_v1_dcp", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--world", type=int, action="append", help="DCP world size (repeatable; default 2)")
    parser.add_argument("--backend", default="sdpa-cpu")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--scenario", action="append", help="a dcp scenario (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--kernel-cp",
        action="store_true",
        help="only the scenarios that pass cp_world_size / cp_rank / cp_tot_seqused_k to the kernel",
    )
    args = parser.parse_args(argv)
    names = args.scenario or [n for n, sc in SCENARIOS.items() if sc.dcp > 1 and (sc.kernel_cp or not args.kernel_cp)]
    if args.kernel_cp and not all(SCENARIOS[n].kernel_cp for n in names if n in SCENARIOS):
        parser.error(f"--kernel-cp with scenarios that are not kernel_cp: {names}")
    cases = [c for c in VllmV1FlashAttention().cases() if c.scenario in names]
    results = run_dcp_worlds(cases, args.world or [2], args.backend, args.device, args.seed)
    for r in results:
        print(
            f"{r['status'].upper():4} {r['scenario']} world={r['world']} {r['backend']} {r['device']}: "
            f"error ratio {r['error_ratio']:.3f} "
            f"(single-process replay {r['single_status']} {r['single_error_ratio']:.3f}; "
            f"max |dist - single| {r['max_abs_vs_single']:.2e}) {' '.join(r['failed_checks'])}"
        )
    return 0 if all(r["status"] == "pass" and r["single_status"] == "pass" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
