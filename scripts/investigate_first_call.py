"""What a fresh process pays before its first check is cheap (issue 30: every worker's first case costs 8-14 s,
29 s with 63 workers on four GPUs, and that case's first backend carries it).

Times, in this process, one step after the other (each synchronised): ``import torch``; the CUDA context; the first
fp32 and fp64 matmul (cuBLAS); importing FA2; FA2's first call, its second call of the same kernel and its first call
of another head dim; SDPA's first call of the cuDNN backend and of flash; the harness's own first check of a ``smoke``
case on fa2 (``conformance.running.worker``'s ``check`` op).  Run several copies at once (``--procs N``) to see how
the steps grow when N processes pay them together, as a run's workers do:

    PYTHONPATH=. python scripts/investigate_first_call.py --procs 1 --out first-1.json
    PYTHONPATH=. python scripts/investigate_first_call.py --procs 16 --gpus 0 --out first-16.json

One JSON object: ``procs`` (one per process: ``steps``, seconds in order, and the environment it saw) and
``medians`` (each step's median over the processes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _child() -> None:
    steps: dict[str, float] = {}
    t0 = time.perf_counter()

    def mark(name: str) -> None:
        nonlocal t0
        import torch

        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
        now = time.perf_counter()
        steps[name] = round(now - t0, 4)
        t0 = now

    import torch

    mark("import_torch")
    torch.zeros(1, device="cuda")
    mark("cuda_context")
    a = torch.randn(256, 256, device="cuda")
    a @ a
    mark("matmul_fp32_first")
    a @ a
    mark("matmul_fp32_second")
    a.double() @ a.double()
    mark("matmul_fp64_first")
    import flash_attn  # noqa: F401

    mark("import_flash_attn")
    from flash_attn import flash_attn_func

    q = torch.randn(1, 64, 4, 64, device="cuda", dtype=torch.bfloat16)
    flash_attn_func(q, q, q, causal=True)
    mark("fa2_first_call_d64")
    flash_attn_func(q, q, q, causal=True)
    mark("fa2_second_call_d64")
    q2 = torch.randn(1, 64, 4, 128, device="cuda", dtype=torch.bfloat16)
    flash_attn_func(q2, q2, q2, causal=True)
    mark("fa2_first_call_d128")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qs = q2.transpose(1, 2)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        torch.nn.functional.scaled_dot_product_attention(qs, qs, qs, is_causal=True)
    mark("sdpa_cudnn_first_call")
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        torch.nn.functional.scaled_dot_product_attention(qs, qs, qs, is_causal=True)
    mark("sdpa_cudnn_second_call")
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        torch.nn.functional.scaled_dot_product_attention(qs, qs, qs, is_causal=True)
    mark("sdpa_flash_first_call")
    from conformance.running.worker import _Worker
    from conformance.suites.registry import get_suite

    worker = _Worker()
    cases = get_suite("smoke")
    mark("import_harness")
    idx = int(os.environ.get("FIRST_CALL_CASE", "0")) % len(cases)
    for n, case in enumerate((cases[idx], cases[(idx + 1) % len(cases)])):
        reply = worker.check({"case": case.to_json(), "backend": "fa2", "device": "cuda", "seed": 0, "available": True})
        mark(f"harness_check_{n}_fa2")
        steps[f"harness_check_{n}_phases"] = {k: round(v, 4) for k, v in reply["phases"].items()}  # type: ignore[assignment]
    env = {k: os.environ.get(k) for k in ("CUDA_MODULE_LOADING", "CUDA_VISIBLE_DEVICES", "CUDA_CACHE_PATH")}
    print(json.dumps({"steps": steps, "env": env}))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--procs", type=int, default=1)
    p.add_argument("--gpus", default="0", help="comma-separated GPU indices the processes are spread over")
    p.add_argument("--out", default="first-call.json")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child()
        return
    gpus = args.gpus.split(",")
    t0 = time.perf_counter()
    children = []
    for i in range(args.procs):
        env = dict(
            os.environ, CUDA_VISIBLE_DEVICES=gpus[i % len(gpus)], FIRST_CALL_CASE=str(i * 7), OMP_NUM_THREADS="1"
        )
        children.append(
            subprocess.Popen([sys.executable, __file__, "--child"], env=env, stdout=subprocess.PIPE, text=True)
        )
    procs = []
    for c in children:
        out, _ = c.communicate()
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        procs.append(json.loads(lines[-1]) if lines else {"error": f"exit {c.returncode}"})
    wall = time.perf_counter() - t0
    names = [k for k, v in procs[0].get("steps", {}).items() if isinstance(v, float)]
    medians = {k: statistics.median(p["steps"][k] for p in procs if "steps" in p and k in p["steps"]) for k in names}
    result = {"procs_n": args.procs, "gpus": gpus, "wall_s": round(wall, 2), "medians": medians, "procs": procs}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({"procs": args.procs, "wall_s": round(wall, 2), "medians": medians}, indent=1))


if __name__ == "__main__":
    main()
