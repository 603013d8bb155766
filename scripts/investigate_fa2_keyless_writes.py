"""Does FA2's paged varlen call with keyless query rows (ledgers/fa2.toml[1]) write outside its outputs?

In three default runs of one H100 (reports/h100-2026-11-26-verdict-reads) three fa3-vllm records failed once each
(an illegal instruction twice, NaN outputs once) and passed in the other two runs; each time the worker's previous
problem record was an fa2.toml[1] failure, once on the very same case 0.03 s before.  This script takes fa2.toml[1]
cases from the committed problems files and, per case: builds the case context (inputs, reference, baseline) as a
worker does, fingerprints every tensor of it (the output digest of conformance.verdict.check), runs FA2's check
``--repeats`` times, fingerprints again after each, then runs fa3-vllm's check on the same context; a control runs
fa3-vllm first on a fresh context.  A changed fingerprint is FA2 writing into memory it was not given.

    PYTHONPATH=. python scripts/investigate_fa2_keyless_writes.py --cases 6 --repeats 5 --out fa2-keyless.json
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import torch


def _tensors(ctx) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for k, v in vars(ctx.inputs).items():
        if isinstance(v, torch.Tensor):
            out[f"inputs.{k}"] = v
    if ctx.inputs.quant is not None:
        for k, v in vars(ctx.inputs.quant).items():
            if isinstance(v, torch.Tensor):
                out[f"quant.{k}"] = v
    out["ref.out"], out["ref.lse"] = ctx.ref.out, ctx.ref.lse
    out["base.out"], out["base.lse"] = ctx.base[0], ctx.base[1]
    return out


def _prints(ctx) -> dict[str, str]:
    from attnfast.base import KernelOutput
    from conformance.verdict.fingerprint import output_digest

    return {k: output_digest(KernelOutput(t, None)) for k, t in _tensors(ctx).items()}


def _status(fn) -> str:
    try:
        r = fn()
        torch.cuda.synchronize()
        return f"{r.status.value}: {r.reason[:160]}"
    except Exception as exc:  # noqa: BLE001 - recorded
        return f"raised {type(exc).__name__}: {str(exc)[:160]}"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", type=int, default=6)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="fa2-keyless.json")
    args = p.parse_args()

    from attnfast.registry import get_backend
    from conformance.cases.case import AttentionCase
    from conformance.verdict.check import check_backend, prepare_context

    seen: dict[str, dict] = {}
    for f in sorted(Path("reports/h100-2026-11-26-verdict-reads").glob("k4-*-problems.jsonl.gz")):
        for line in gzip.open(f, "rt"):
            r = json.loads(line)
            if r.get("backend") == "fa2" and r.get("status") == "fail" and "masked_rows" in r.get("reason", ""):
                seen.setdefault(r["case_id"], r["case"])
    # the three fa2 cases that preceded the sporadic fa3-vllm problems first
    first = (
        "gqa_h8_kv2_d40_bf16_cross_ps256nhd_win32-32-244527",
        "mha_h8_kv8_d32_bf16_cross_ps256nhd_wininf-16-447eff",
        "mqa_h8_kv1_d160_bf16_cross_ps256nhd_wininf-16-4347b3",
    )
    picked = sorted(seen.items(), key=lambda kv: (kv[0] not in first, kv[0]))[: args.cases]
    fa2, fa3 = get_backend("fa2"), get_backend("fa3-vllm")
    rows = []
    for case_id, case_json in picked:
        case = AttentionCase.from_json(case_json)
        row: dict = {"case_id": case_id, "case": case_json}
        ctx = prepare_context(case, seed=0, device="cuda")
        row["fa3_first"] = _status(lambda: check_backend(ctx, fa3)) if fa3.supports(case, "cuda") else "unsupported"
        ctx = prepare_context(case, seed=0, device="cuda")
        before = _prints(ctx)
        runs = []
        for _ in range(args.repeats):
            status = _status(lambda: check_backend(ctx, fa2))
            after = _prints(ctx)
            runs.append({"fa2": status, "changed": sorted(k for k in before if after[k] != before[k])})
        row["fa2_runs"] = runs
        row["fa3_after_fa2"] = _status(lambda: check_backend(ctx, fa3)) if fa3.supports(case, "cuda") else "unsupported"
        rows.append(row)
        print(case_id, row["fa3_first"][:40], [r["changed"] for r in runs], row["fa3_after_fa2"][:60], flush=True)
    out = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "fa2": fa2.version(),
        "fa3_vllm": fa3.version(),
        "rows": rows,
        "cases_with_writes": sum(any(r["changed"] for r in row["fa2_runs"]) for row in rows),
    }
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
