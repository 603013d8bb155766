"""The cause of sdpa-cuda's ALiBi backward failures (issue 31 item 5), on CPU, from a GPU run of
``scripts/investigate_bwd_triage.py --only sdpa-cuda-wide`` (its JSON output, gzipped or not).

    python scripts/investigate_sdpa_alibi_bias.py RUN.json[.gz] [--out F.json]

For each sdpa-cuda row of the run, on the same inputs (``make_inputs`` draws the same numbers on any device):

* ``bias_only``: max |g - fp64| of the exact float64 gradients with one change, the ALiBi bias rounded as the
  adapter hands it to SDPA's fused kernels (``attnfast.sdpa.bias_for_kernel``: each row shifted by its top, then
  the query dtype; attnref's ``alibi_dtype``), against the kernel's own max |g - fp64| (the run's): a kernel that
  matches it computes exactly what it was given;
* ``verdict_now``: the H100 record's verdict (the baseline with exact ALiBi) and ``verdict_alibi``: the same
  kernel numbers (the record's max and mean error against the fp32 reference, its cosine) judged against the
  baseline that rounds ALiBi as the adapter does (``conformance.backward.gradients``, ``alibi_dtype``): the worst
  max-rule ratio, the worst mean-rule ratio and the failed checks, per gradient.

Prints one line per row and a summary; writes every number to ``--out``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import torch  # noqa: E402

import attnref  # noqa: E402
from conformance.backward.gradients import gradients  # noqa: E402
from conformance.backward.verdict import resolve_grad, rounding_atol  # noqa: E402
from conformance.cases.inputs import make_inputs  # noqa: E402
from conformance.verdict.compare import cosine_similarity  # noqa: E402
from conformance.verdict.reference import case_options  # noqa: E402
from investigate_bwd_triage import GRID, grid_case  # type: ignore[import-not-found]  # noqa: E402

GRADS = ("dq", "dk", "dv")


def fp64_grads(case, inputs, alibi_dtype):
    """float64 gradients of the case, ALiBi exact (None) or rounded as the adapter's bias (``alibi_dtype``)."""
    return attnref.attention_varlen_backward(
        inputs.q, inputs.k, inputs.v, inputs.dout, inputs.cu_seqlens_q, inputs.cu_seqlens_k,
        options=case_options(case), alibi_slopes=inputs.alibi_slopes, sinks=inputs.sinks,
        numerics=attnref.Numerics(dtype=torch.float64), alibi_dtype=alibi_dtype,
    )  # fmt: skip


def rejudge(case, inputs, rec: dict[str, Any]) -> dict[str, Any]:
    """The record's kernel numbers judged against the ALiBi-rounding baseline (the verdict's rules, rtol 0)."""
    tol = resolve_grad(case, "sdpa-cuda")
    grads = gradients(case, inputs, alibi_dtype=case.torch_dtype)
    out: dict[str, Any] = {}
    for n in GRADS:
        t = rec["backward"]["tensors"][n]
        ref, base = getattr(grads.ref, n).double(), getattr(grads.base, n).double()
        berr = (base - ref).abs()
        b_max, b_mean = float(berr.max()), float(berr.mean())
        atol = max(tol.atol, rounding_atol(ref.float(), case.torch_dtype))
        allowed, mean_allowed = tol.factor * b_max + atol, tol.mean_factor * b_mean + tol.mean_atol
        base_cos = cosine_similarity(base, ref)
        min_cos = min(tol.min_cosine, 1 - tol.factor * (1 - base_cos))
        failed = [k for k, bad in (("max_error", t["max_abs"] > allowed), ("mean_error", t["mean_abs"] > mean_allowed),
                                   ("cosine", t["cosine_judged"] and t["cosine"] < min_cos)) if bad]  # fmt: skip
        out[n] = {"baseline_max_abs": b_max, "allowed": allowed, "ratio": t["max_abs"] / allowed, "failed": failed,
                  "baseline_mean_abs": b_mean, "mean_ratio": t["mean_abs"] / mean_allowed}  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="investigate_bwd_triage.py's JSON (sdpa-cuda rows), .gz or not")
    ap.add_argument("--out", default="investigate-sdpa-alibi-bias.json")
    args = ap.parse_args()
    opener = gzip.open if args.run.endswith(".gz") else open
    with opener(args.run, "rt", encoding="utf-8") as f:
        run = json.load(f)
    by_id = {grid_case(f).id: grid_case(f) for name in ("sdpa-cuda", "sdpa-cuda-wide") for f in GRID[name]}
    torch.set_num_threads(max(1, torch.get_num_threads()))
    t0 = time.time()
    rows = []
    for rec in run["rows"]:
        if rec.get("backend") != "sdpa-cuda" or rec["status"] not in ("pass", "fail") or "dq" not in rec:
            continue
        case = by_id[rec["case_id"]]
        inputs = make_inputs(case, rec["seed"], "cpu")
        exact = fp64_grads(case, inputs, None)
        rounded = fp64_grads(case, inputs, case.torch_dtype) if case.alibi else exact
        row: dict[str, Any] = {"case_id": case.id, "seed": rec["seed"], "status_now": rec["status"],
                               "worst_ratio_now": rec["backward"]["worst_ratio"]}  # fmt: skip
        for i, n in enumerate(GRADS):
            bias_only = float((rounded[i] - exact[i]).abs().max())
            row[n] = {"kernel_max": rec[n]["kernel"]["max"], "bias_only_max": bias_only,
                      "baseline_now_max": rec[n]["baseline"]["max"]}  # fmt: skip
        row["verdict_alibi"] = rejudge(case, inputs, rec) if case.alibi else None
        row["status_alibi"] = (
            rec["status"] if not case.alibi else "fail" if any(v["failed"] for v in row["verdict_alibi"].values())
            else "pass"
        )  # fmt: skip
        rows.append(row)
        va = row["verdict_alibi"] or {}
        print(f"{rec['status']:4} -> {row['status_alibi']:4} s{rec['seed']} {case.id[:48]:48} "
              + " ".join(f"{n} kern {row[n]['kernel_max']:.1e} bias {row[n]['bias_only_max']:.1e}"
                         + (f" r {va[n]['ratio']:.2f}/{va[n]['mean_ratio']:.2f}" if va else "") for n in GRADS),
              flush=True)  # fmt: skip
    summary = {
        "rows": len(rows),
        "fail_now": sum(r["status_now"] == "fail" for r in rows),
        "fail_alibi_baseline": sum(r["status_alibi"] == "fail" for r in rows),
        "worst_ratio_alibi_baseline": max(
            (max(v["ratio"], v["mean_ratio"]) for r in rows if r["verdict_alibi"] for v in r["verdict_alibi"].values()),
            default=None,
        ),
    }
    print(json.dumps(summary))
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"run": args.run, "seconds": round(time.time() - t0, 1), "summary": summary, "rows": rows}, f,
                  indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
