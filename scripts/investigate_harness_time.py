"""Where a GPU check's time goes, outside the runner (issue 30 items 3 and 4): the case context (inputs, reference,
baseline) and each backend's prepare, first call, later calls and comparison, per case of a suite sample; for
``sdpa-cuda`` also the same calls with each fused SDPA backend alone (does cuDNN's per-shape graph build dominate?)
and a ``torch.profiler`` table of a few cases.

    PYTHONPATH=. python scripts/investigate_harness_time.py --suite default --every 20 --backend sdpa-cuda \
        --backend fa2 --out harness-time.json

One JSON object: ``rows`` (one per case x backend, seconds), ``totals`` (sums per phase and backend, scaled by
``--every`` to the whole suite), ``sdpa_variants`` and ``profile`` (text tables).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch


def _t(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--suite", default="default")
    p.add_argument("--every", type=int, default=20)
    p.add_argument("--backend", action="append", default=[])
    p.add_argument("--profile-cases", type=int, default=6)
    p.add_argument("--out", default="harness-time.json")
    args = p.parse_args()

    from attnfast.registry import get_backend
    from conformance.cases.inputs import make_inputs
    from conformance.suites.registry import get_suite
    from conformance.verdict.baseline import baseline
    from conformance.verdict.check import check_backend, composition_of, prepare_context
    from conformance.verdict.reference import reference

    cases = get_suite(args.suite)[:: args.every]
    backends = {b: get_backend(b) for b in args.backend}
    rows = []
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for case in cases:
        if composition_of(case) is not None:
            # compositions (engines, graphs, invariance, backward): the context as the runner builds it
            ctx, t_ctx = _t(lambda: prepare_context(case, 0, "cuda"))
            row = {"case": case.id, "kind": "composition", "context_s": t_ctx}
        else:
            inputs, t_in = _t(lambda: make_inputs(case, 0, "cuda"))
            _, t_ref = _t(lambda: reference(case, inputs))
            _, t_base = _t(lambda: baseline(case, inputs))
            ctx, t_ctx = _t(lambda: prepare_context(case, 0, "cuda"))
            row = {
                "case": case.id,
                "kind": "single",
                "inputs_s": t_in,
                "reference_s": t_ref,
                "baseline_s": t_base,
                "context_s": t_ctx,
            }
        for k, v in row.items():
            if k.endswith("_s"):
                totals["context"][k] += v * args.every
        for name, backend in backends.items():
            sup = backend.supports(case, "cuda")
            if not sup:
                continue
            brow = {"case": case.id, "backend": name}
            try:
                if composition_of(case) is None:
                    call, brow["prepare_s"] = _t(lambda: backend.prepare(case, ctx.inputs))
                    _, brow["call1_s"] = _t(call)
                    _, brow["call2_s"] = _t(call)
                    _, brow["call3_s"] = _t(call)
                r, brow["check_s"] = _t(lambda: check_backend(ctx, backend))
                brow["status"] = r.status.value
                brow["kernel_s"] = r.kernel_s
                brow["harness_s"] = r.harness_s
            except Exception as exc:  # noqa: BLE001 - recorded
                brow["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            rows.append(brow)
            for k, v in brow.items():
                if k.endswith("_s"):
                    totals[name][k] += v * args.every
        rows.append(row)

    variants = []
    if "sdpa-cuda" in backends:
        from attnfast.sdpa import SdpaCudaBackend

        for only in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"):
            b = SdpaCudaBackend((only,))
            n = 0
            acc = defaultdict(float)
            for case in cases:
                if composition_of(case) is not None or not b.supports(case, "cuda"):
                    continue
                inputs = make_inputs(case, 0, "cuda")
                try:
                    call, tp = _t(lambda: b.prepare(case, inputs))
                    _, t1 = _t(call)
                    _, t2 = _t(call)
                except Exception:  # noqa: BLE001
                    continue
                n += 1
                acc["prepare_s"] += tp
                acc["call1_s"] += t1
                acc["call2_s"] += t2
            variants.append({"only": only, "cases": n, **acc})

    prof_text = ""
    if "sdpa-cuda" in backends:
        b = backends["sdpa-cuda"]
        picked = [c for c in cases if composition_of(c) is None and b.supports(c, "cuda")][: args.profile_cases]
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for case in picked:
                inputs = make_inputs(case, 0, "cuda")
                call = b.prepare(case, inputs)
                call()
                call()
                torch.cuda.synchronize()
        prof_text = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)

    ref_prof = ""
    picked = [c for c in cases if composition_of(c) is None][: args.profile_cases * 3]
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for case in picked:
            inputs = make_inputs(case, 0, "cuda")
            reference(case, inputs)
            baseline(case, inputs)
            torch.cuda.synchronize()
    ref_prof = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    n_events = sum(e.count for e in prof.key_averages())

    out = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "suite": args.suite,
        "every": args.every,
        "cases_sampled": len(cases),
        "totals_scaled": {k: dict(v) for k, v in totals.items()},
        "sdpa_variants": variants,
        "rows": rows,
        "profile_sdpa": prof_text,
        "profile_reference": ref_prof,
        "reference_profile_cases": len(picked),
        "reference_profile_events": n_events,
    }
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)
    print(json.dumps({k: out[k] for k in ("device", "cases_sampled", "totals_scaled", "sdpa_variants")}, indent=1))
    print(prof_text)
    print(ref_prof)


if __name__ == "__main__":
    main()
