"""Seed ``001``'s DCP replay across real processes, one per rank (``torch.distributed``: gloo on CPU, NCCL with one
GPU per rank), and its script.

:func:`run_dcp_worlds` spawns ``max(worlds)`` processes with a subgroup per world size; each rank builds its own
share of the cache and runs :func:`~conformance.engines.vllm_v1.dcp.dcp_rank_forward` through a
:class:`~conformance.engines.vllm_v1.collectives.DistGroup`; rank 0 judges the gathered output against the
reference and against the single-process replay (:func:`~conformance.engines.vllm_v1.dcp.dcp_forward`).
Script (``--kernel-cp``: only the scenarios that give the kernel its cp arguments)::

    python -m conformance.engines.vllm_v1.dcp_dist --world 2 --backend fa3-vllm --device cuda
    python -m conformance.engines.vllm_v1.dcp_dist --world 3 --backend sdpa-cpu --device cpu
    python -m conformance.engines.vllm_v1.dcp_dist --world 2 --world 3 --backend sdpa-cpu --device cpu --kernel-cp
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import torch

from conformance.cases.case import AttentionCase

from ..base import backend_kernel
from .collectives import DistGroup
from .dcp import dcp_forward, dcp_rank_forward
from .fa import VllmV1FlashAttention
from .scenarios import SCENARIOS

__all__ = ["main", "run_dcp", "run_dcp_worlds"]


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
    from conformance.cases.inputs import make_inputs
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
            assert full.lse is not None and single.lse is not None  # restored from the steps' LSEs
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
    parser = argparse.ArgumentParser(
        prog="python -m conformance.engines.vllm_v1.dcp_dist", description=__doc__.split("\n")[0]
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
