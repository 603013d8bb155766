"""Investigate fa2's LSE on a causal ALiBi case with long keys (flash-attention's kvcache grid on the H100,
``reports/h100-2026-11-26-speed-4/peerfa2-problems.jsonl.gz``:
``mha_h6_kv6_d32_fp16_peerfa2kv_contig_causal_alibi-ff7477`` fails ``lse`` by 1.0e-3 at (token 7, head 4) on 1 of 192
rows).  CPU only, no kernel.

    PYTHONPATH=. python scripts/investigate_fa2_alibi_lse.py [--out F.json] [--sweep-seeds N]

On FA2's causal path the kernel adds ``+slope * j`` to the scores, so the LSE it returns is the symmetric form's plus
``C = slope * (i + sk - sq)`` (about 1e4 for head 4, slope 1/2, over 19,169 keys), and the adapter subtracts ``C``.
Three computations on the case's own inputs (seed 0), each against an fp64 LSE of the symmetric form written here:

* ``output_rounding``: the hypothesis that only the kernel's fp32 output loses information,
  ``fl32(true + C) - C``;
* ``emulated``: FA2 2.8.3's own fp32 arithmetic on the biased scores (``tests/attnfast/fa2_numerics.py``: the slope
  divided by the scale, the biased scores, the running max and its scaled copy, the split-KV combine, with the split
  count the kernel's heuristic picks for this call on 132 SMs), fused (FMA) and unfused;
* the harness's bound at each row, as the check computes it (``tolerance.resolve`` and the baseline), without and
  with the adapter's per-row allowance :func:`attnfast._fa_common.alibi_causal_lse_slack`.

Then a sweep over other seeds, key counts, head counts (non power-of-two slopes with 12 heads), the slope division
off by up to 2 ulps (the fast-math division's bound), split counts and fused/unfused rounding: the largest
``|err| / (2^-24 * C)`` the model reaches, against the allowance's count.  One JSON object; see ``main``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
from pathlib import Path

import torch

CASE_ID = "mha_h6_kv6_d32_fp16_peerfa2kv_contig_causal_alibi-ff7477"
RECORDS = Path("reports/h100-2026-11-26-speed-4/peerfa2-problems.jsonl.gz")
ROW = (7, 4)  # (token, head) of the failure
H100_SMS = 132
U = 2.0**-24  # fp32 unit roundoff: half an ulp, relative


def true_lse(q: torch.Tensor, k: torch.Tensor, slopes: torch.Tensor, scale: float) -> torch.Tensor:
    """``(h, sq)`` fp64 LSE of one request in the symmetric form, bottom-right causal (independent of attnref)."""
    sq, h, _ = q.shape
    sk, hk = k.shape[0], k.shape[1]
    qd = q.double().permute(1, 0, 2)
    kd = k.double().repeat_interleave(h // hk, dim=1).permute(1, 0, 2)
    dist = (torch.arange(sq, dtype=torch.float64)[:, None] + (sk - sq)) - torch.arange(sk, dtype=torch.float64)
    s = (qd @ kd.transpose(1, 2)) * scale - slopes.double()[:, None, None] * dist.abs()
    return torch.logsumexp(torch.where(dist >= 0, s, -math.inf), dim=-1)


def shift(slopes: torch.Tensor, sq: int, sk: int) -> torch.Tensor:
    """``(h, sq)`` fp64: ``C = slope * (i + sk - sq)`` exactly (fp32 slopes, integer positions)."""
    return slopes.double()[:, None] * (torch.arange(sq, dtype=torch.float64) + (sk - sq))[None]


def adapted(kernel_lse: torch.Tensor, slopes: torch.Tensor, sq: int, sk: int) -> torch.Tensor:
    """What the adapter returns from a kernel LSE: ``lse - shift`` with the shift and the difference in fp32."""
    from tests.attnfast.fa2_numerics import f32

    return f32(kernel_lse - f32(shift(slopes, sq, sk)))


def request_tensors(inputs, b: int):
    cq, ck = inputs.cu_seqlens_q.tolist(), inputs.cu_seqlens_k.tolist()
    return inputs.q[cq[b] : cq[b + 1]], inputs.k[ck[b] : ck[b + 1]]


def measured() -> dict:
    """The failing record's numbers (the committed problems file)."""
    with gzip.open(RECORDS, "rt") as fh:
        for line in fh:
            rec = json.loads(line)
            if rec.get("case_id") == CASE_ID and rec.get("backend") == "fa2":
                stats = rec["stats"]
                return {
                    "file": str(RECORDS),
                    "case": rec["case"],
                    "reason": rec["reason"],
                    "lse_max_abs": stats["lse_max_abs"],
                    "lse_allowed": stats["lse_allowed"],
                    "variant": rec["extra"].get("variant"),
                    "notes": rec["extra"].get("notes"),
                }
    raise SystemExit(f"{CASE_ID} is not in {RECORDS}")


def the_case() -> dict:
    from attnfast._fa_common import alibi_causal_lse_shift, alibi_causal_lse_slack, ALIBI_LSE_ROUNDINGS
    from conformance.cases.case import AttentionCase
    from conformance.verdict.check import prepare_context
    from conformance.verdict.tolerance import resolve
    from tests.attnfast.fa2_numerics import f32, fa2_causal_alibi_lse, num_splits_heuristic

    rec = measured()
    spec = rec["case"]
    case = AttentionCase.from_json(spec)
    assert case.id == CASE_ID, case.id
    ctx = prepare_context(case, 0, "cpu")
    inputs, ref = ctx.inputs, ctx.ref.lse.double()
    slopes, scale = inputs.alibi_slopes, 1.0 / math.sqrt(case.head_dim)
    tol = resolve(case, "fa2")
    live = torch.isfinite(ref)
    b_max = float((ctx.base[1].double() - ref).abs()[live].max())
    bound = tol.lse_factor * b_max + tol.lse_atol + tol.lse_rtol * ref.abs()
    slack = alibi_causal_lse_slack(alibi_causal_lse_shift(case, slopes)).double()
    width = max(case.kv_lens)  # the contiguous kvcache call's cache width: FA2's seqlen_k, which sizes the splits
    splits = num_splits_heuristic(case.batch * case.num_heads, 2 * H100_SMS, -(-width // 256))

    truths, models = [], {"output_rounding": [], "emulated_fused": [], "emulated_unfused": []}
    raw_fused = []
    for b, (sq, sk) in enumerate(case.requests):
        q, k = request_tensors(inputs, b)
        t = true_lse(q, k, slopes, scale)
        c = shift(slopes, sq, sk)
        truths.append(t)
        models["output_rounding"].append(f32(t + c) - c)
        kf = fa2_causal_alibi_lse(q, k, slopes, scale, width, splits, fused=True)
        raw_fused.append(kf)
        models["emulated_fused"].append(adapted(kf, slopes, sq, sk))
        ku = fa2_causal_alibi_lse(q, k, slopes, scale, width, splits, fused=False)
        models["emulated_unfused"].append(adapted(ku, slopes, sq, sk))
    true = torch.cat(truths, dim=1)
    c_all = torch.cat([shift(slopes, sq, sk) for sq, sk in case.requests], dim=1)
    out: dict = {
        "case": spec,
        "case_id": case.id,
        "measured": rec,
        "slopes": slopes.tolist(),
        "scale": scale,
        "num_splits": splits,
        "reference_vs_fp64": float((ref - true).abs().max()),
        "baseline_lse_max_abs": b_max,
        "tolerance": {k: v for k, v in tol.fields().items() if k.startswith("lse")},
        "allowance": {
            "formula": f"{ALIBI_LSE_ROUNDINGS} x 2^-24 x slope*(i + sk - sq), per row",
            "roundings": ALIBI_LSE_ROUNDINGS,
        },
    }
    t, h = ROW
    kern_measured = float(ref[h, t]) - rec["lse_max_abs"]  # the record's kernel value, exact (see the JSON note)
    row = {
        "token": t,
        "head": h,
        "slope": float(slopes[h]),
        "C": float(c_all[h, t]),
        "fp32_ulp_at_C": 2.0 ** (math.floor(math.log2(float(c_all[h, t]))) - 23),
        "true_fp64": float(true[h, t]),
        "reference_fp32": float(ref[h, t]),
        "kernel_measured": kern_measured,
        "kernel_measured_times_1024": kern_measured * 1024,
        "emulated_kernel_raw_fused": float(raw_fused[0][h, t]),
        "bound_now": float(bound[h, t]),
        "slack": float(slack[h, t]),
        "bound_with_slack": float(bound[h, t] + slack[h, t]),
    }
    for name, parts in models.items():
        v = torch.cat(parts, dim=1)
        row[name] = {"lse": float(v[h, t]), "err_vs_reference": float(v[h, t] - ref[h, t])}
    out["row"] = row
    per = []
    for name, parts in models.items():
        v = torch.cat(parts, dim=1)
        err = (v - ref).abs()
        err_true = (v - true).abs()
        for b, (sq, sk) in enumerate(case.requests):
            cols = slice(sum(r[0] for r in case.requests[:b]), sum(r[0] for r in case.requests[: b + 1]))
            for hh in range(case.num_heads):
                e, et, cc = err[hh, cols], err_true[hh, cols], c_all[hh, cols]
                per.append(
                    {
                        "model": name,
                        "request": b,
                        "keys": sk,
                        "head": hh,
                        "slope": float(slopes[hh]),
                        "max_C": float(cc.max()),
                        "max_err_vs_reference": float(e.max()),
                        "max_err_vs_fp64_in_u_C": float((et / (U * cc)).max()),
                        "rows_over_bound_now": int((e > bound[hh, cols]).sum()),
                        "rows_over_bound_with_slack": int((e > bound[hh, cols] + slack[hh, cols]).sum()),
                    }
                )
    out["per_request_head"] = per
    out["summary"] = {
        name: {
            "max_err_vs_reference": max(p["max_err_vs_reference"] for p in per if p["model"] == name),
            "rows_over_bound_now": sum(p["rows_over_bound_now"] for p in per if p["model"] == name),
            "rows_over_bound_with_slack": sum(p["rows_over_bound_with_slack"] for p in per if p["model"] == name),
            "max_err_in_u_C": max(p["max_err_vs_fp64_in_u_C"] for p in per if p["model"] == name),
        }
        for name in models
    }
    return out


def sweep(seeds: int) -> dict:
    """The model's largest ``|err| / (u * C)`` over inputs and variants the case does not cover."""
    from conformance.cases.case import AttentionCase
    from conformance.cases.inputs import make_inputs
    from tests.attnfast.fa2_numerics import fa2_causal_alibi_lse, num_splits_heuristic

    rows = []
    shapes = [(6, [(16, 19169), (16, 10068)]), (12, [(16, 4096), (16, 30000)]), (12, [(1, 65536)])]
    for heads, requests in shapes:
        case = AttentionCase(
            requests=tuple(tuple(r) for r in requests),
            num_heads=heads,
            num_kv_heads=heads,
            head_dim=32,
            dtype="fp16",
            causal=True,
            alibi=True,
            batch_name="sweep",
        )
        width = max(case.kv_lens)
        heuristic = num_splits_heuristic(case.batch * heads * 1, 2 * H100_SMS, -(-width // 256))
        for seed in range(seeds):
            inputs = make_inputs(case, seed, "cpu")
            slopes, scale = inputs.alibi_slopes, 1.0 / math.sqrt(case.head_dim)
            for b, (sq, sk) in enumerate(case.requests):
                q, k = request_tensors(inputs, b)
                t = true_lse(q, k, slopes, scale)
                c = shift(slopes, sq, sk)
                for fused in (True, False):
                    for ulps in (-2, 0, 2):
                        for splits in sorted({1, heuristic}):
                            if (ulps or splits == 1) and not fused:
                                continue  # the unfused variant once, at the heuristic split count
                            kern = fa2_causal_alibi_lse(
                                q, k, slopes, scale, width, splits, fused=fused, slope_ulps=ulps
                            )
                            ratio = ((adapted(kern, slopes, sq, sk) - t).abs() / (U * c)).amax(dim=-1)
                            rows.append(
                                {
                                    "heads": heads,
                                    "keys": sk,
                                    "queries": sq,
                                    "seed": seed,
                                    "fused": fused,
                                    "slope_ulps": ulps,
                                    "num_splits": splits,
                                    "max_err_in_u_C": float(ratio.max()),
                                    "worst_head": int(ratio.argmax()),
                                }
                            )
    worst = max(rows, key=lambda r: r["max_err_in_u_C"])
    by_variant: dict[str, float] = {}
    for r in rows:
        key = (
            f"fused={r['fused']} slope_ulps={r['slope_ulps']:+d} splits={'1' if r['num_splits'] == 1 else 'heuristic'}"
        )
        by_variant[key] = max(by_variant.get(key, 0.0), r["max_err_in_u_C"])
    return {"runs": len(rows), "worst": worst, "max_by_variant": by_variant, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="investigate-fa2-alibi-lse-cpu.json")
    ap.add_argument("--sweep-seeds", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(1)
    result = the_case()
    result["sweep"] = sweep(args.sweep_seeds)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("row", "summary")}, indent=1))
    print(json.dumps({k: v for k, v in result["sweep"].items() if k != "rows"}, indent=1))


if __name__ == "__main__":
    main()
