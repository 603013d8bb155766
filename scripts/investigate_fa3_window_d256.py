"""Investigate fa3-vllm's failure on ``mha_h16_kv16_d256_bf16_pf4x8192_contig_causal_win4096-inf`` (perf suite).

    python scripts/investigate_fa3_window_d256.py [--out F.json]

The kernel is called directly (no adapter) on the case's own inputs, and every row's LSE is compared with
float64 LSEs computed here (not attnref) under several hypotheses: the window as specified
(keys ``[i - 4096, i]``), one key more or fewer on the left, and no window.  For the rows where the kernel
disagrees with the specified window, it reports which hypothesis the kernel matches, the rows' positions
(inside the request, modulo the kernel's tile sizes) and whether pinning ``num_splits=1`` or other head dims
change the picture.
"""

from __future__ import annotations

import argparse
import json

import torch

from conformance.cases.case import AttentionCase
from conformance.cases.inputs import make_inputs


def lse64(q: torch.Tensor, k: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, scale: float) -> torch.Tensor:
    """fp64 LSE of rows ``q (n, d)`` over keys ``k (s, d)``, row r seeing keys ``[lo[r], hi[r])``."""
    out = []
    cols = torch.arange(k.shape[0], device=k.device)
    for r0 in range(0, q.shape[0], 1024):
        s = (q[r0 : r0 + 1024].double() @ k.double().T) * scale
        vis = (cols[None] >= lo[r0 : r0 + 1024, None]) & (cols[None] < hi[r0 : r0 + 1024, None])
        out.append(torch.logsumexp(s.masked_fill(~vis, float("-inf")), dim=1))
    return torch.cat(out)


def study(d: int, seqs: int, seqlen: int, heads: int, left: int, num_splits: int) -> dict:
    from vllm.vllm_flash_attn import flash_attn_varlen_func

    case = AttentionCase(
        requests=((seqlen, seqlen),) * seqs,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=d,
        causal=True,
        window=(left, None),
        batch_name=f"pf{seqs}x{seqlen}",
    )
    inp = make_inputs(case, 0, "cuda")
    _, lse = flash_attn_varlen_func(
        inp.q, inp.k, inp.v, seqlen, inp.cu_seqlens_q, seqlen, cu_seqlens_k=inp.cu_seqlens_k, causal=True,
        window_size=[left, -1], return_softmax_lse=True, fa_version=3, num_splits=num_splits,
    )  # fmt: skip
    scale = d**-0.5
    i = torch.arange(seqlen, device="cuda")
    hyps = {
        "window": (torch.clamp(i - left, min=0), i + 1),
        "left-1": (torch.clamp(i - left + 1, min=0), i + 1),
        "left+1": (torch.clamp(i - left - 1, min=0), i + 1),
        "no_window": (torch.zeros_like(i), i + 1),
    }
    bad_rows, matches, positions = 0, {h: 0 for h in hyps}, []
    worst = 0.0
    residual = {name: 0.0 for name in hyps}  # max |kernel - hypothesis| over the bad rows
    exact_left_plus_1 = 0  # bad rows within 1e-4 of the one-extra-key hypothesis
    for b in range(seqs):
        for h in range(heads):
            rows = slice(b * seqlen, (b + 1) * seqlen)
            q, k = inp.q[rows, h], inp.k[rows, h]
            got = lse[h, rows].double()
            ref = {name: lse64(q, k, lo, hi, scale) for name, (lo, hi) in hyps.items()}
            err = (got - ref["window"]).abs()
            worst = max(worst, float(err.max()))
            bad = torch.nonzero(err > 5e-3).flatten()
            bad_rows += int(bad.numel())
            for name in hyps:
                if bad.numel():
                    residual[name] = max(residual[name], float((got[bad] - ref[name][bad]).abs().max()))
            exact_left_plus_1 += int(((got[bad] - ref["left+1"][bad]).abs() < 1e-4).sum())
            for r in bad.tolist():
                best = min(hyps, key=lambda name: abs(float(got[r] - ref[name][r])))
                matches[best] += 1
                if len(positions) < 40:
                    positions.append({"b": b, "h": h, "row": r, "err": float(err[r]), "best": best})
    rows_all = [p["row"] for p in positions]
    return {
        "d": d,
        "seqs": seqs,
        "seqlen": seqlen,
        "heads": heads,
        "left": left,
        "num_splits": num_splits,
        "rows": seqs * seqlen * heads,
        "bad_rows": bad_rows,
        "worst_lse_err": worst,
        "best_hypothesis_of_bad_rows": matches,
        "max_residual_over_bad_rows": residual,
        "bad_rows_within_1e-4_of_left+1": exact_left_plus_1,
        "first_bad": positions[:12],
        "bad_row_min_max": [min(rows_all), max(rows_all)] if rows_all else None,
    }


def extent_study(d: int, seqlen: int, heads: int, left: int) -> dict:
    """For rows whose LSE is off: the number of keys the kernel's LSE corresponds to (keys [i - t, i])."""
    from collections import Counter

    from vllm.vllm_flash_attn import flash_attn_varlen_func

    case = AttentionCase(
        requests=((seqlen, seqlen),), num_heads=heads, num_kv_heads=heads, head_dim=d, causal=True,
        window=(left, None), batch_name=f"pf1x{seqlen}",
    )  # fmt: skip
    inp = make_inputs(case, 0, "cuda")
    _, lse = flash_attn_varlen_func(
        inp.q, inp.k, inp.v, seqlen, inp.cu_seqlens_q, seqlen, cu_seqlens_k=inp.cu_seqlens_k, causal=True,
        window_size=[left, -1], return_softmax_lse=True, fa_version=3,
    )  # fmt: skip
    extents, residuals, rows_seen = Counter(), [], []
    for h in range(heads):
        s_all = (inp.q[:, h].double() @ inp.k[:, h].double().T) * d**-0.5
        for r in range(seqlen):
            rev = s_all[r, : r + 1].flip(0)
            c = torch.logcumsumexp(rev, 0)  # c[t]: LSE over keys [r - t, r]
            want = c[min(left, r)]
            got = lse[h, r].double()
            if abs(float(got - want)) <= 5e-3:
                continue
            t = int((c - got).abs().argmin())
            extents[t - left] += 1
            residuals.append(float((c[t] - got).abs()))
            if len(rows_seen) < 10:
                rows_seen.append((h, r, t - left))
    return {
        "d": d, "seqlen": seqlen, "left": left, "bad_rows": sum(extents.values()),
        "extra_keys_histogram": dict(sorted(extents.items())[:30]),
        "max_residual_at_best_extent": max(residuals) if residuals else 0.0,
        "first_rows (head, row, extra keys)": rows_seen,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="investigate_fa3_window_d256.json")
    ap.add_argument("--extent-only", action="store_true", help="only the per-row key-extent study")
    args = ap.parse_args()
    results = []
    for cfg in (
        ()
        if args.extent_only
        else (
            dict(d=256, seqs=4, seqlen=8192, heads=16, left=4096, num_splits=0),
            dict(d=256, seqs=1, seqlen=8192, heads=2, left=1000, num_splits=0),
            dict(d=256, seqs=1, seqlen=2048, heads=4, left=512, num_splits=0),
            dict(d=256, seqs=1, seqlen=2048, heads=4, left=128, num_splits=0),
            dict(d=256, seqs=1, seqlen=300, heads=4, left=127, num_splits=0),
            dict(d=192, seqs=1, seqlen=2048, heads=4, left=512, num_splits=0),
            dict(d=128, seqs=1, seqlen=2048, heads=4, left=512, num_splits=0),
            dict(d=96, seqs=1, seqlen=2048, heads=4, left=512, num_splits=0),
            dict(d=64, seqs=1, seqlen=2048, heads=4, left=512, num_splits=0),
            dict(d=128, seqs=4, seqlen=8192, heads=16, left=4096, num_splits=0),
        )
    ):
        try:
            res = study(**cfg)
        except Exception as exc:  # keep going: each configuration is its own measurement
            res = {**cfg, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(res), flush=True)
        results.append(res)
    for cfg in (dict(d=256, seqlen=2048, heads=4, left=512), dict(d=96, seqlen=2048, heads=4, left=512)):
        res = extent_study(**cfg)
        print(json.dumps(res), flush=True)
        results.append(res)
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
