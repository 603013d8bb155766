"""Triage of the fa3-vllm window failures of the peer-fa3 grid (issue 31): the 23 failures of
``reports/h100-2026-11-27-peers/peer-fa3-s0of32.jsonl.gz`` that no ledger entry explained, beside the former
fa3-vllm[2] (windows ``(w, 0)`` on templates 96/192/256) and fa3-vllm[1] (sinks: keyless query tiles).

    python scripts/investigate_fa3_peer_windows.py [--device cuda] [--only fa3-vllm|sdpa-cpu] [--out F.jsonl]
        [--shard I/N] [--case GLOB] [--limit N] [--small] [--list]
    python scripts/investigate_fa3_peer_windows.py --classify RECORDS.jsonl.gz [--tsv F.tsv]
    python scripts/investigate_fa3_peer_windows.py --judge F.jsonl[.gz]

**The model** is :func:`attnfast.fa3_vllm_window.fa3_vllm_window_schedule` (here :func:`schedule`): what vLLM's FA3
fork (vLLM 0.24.0's pin, 803020a8) does with a sliding window on sm_90, block by block, from its source (its module
docstring says how): once the window moves a query tile's key pointer, the intra-warpgroup-overlap mainloop bounds its
masked key tiles with the unshifted key count, so keys right of a row's window enter its softmax.  The ledger field
``fa3_window_unmasked_rows`` is the same function; fa3-vllm[2] matches on it since this script's GPU run
(``reports/h100-2026-11-27-windows/README.md``).

What the model says over the committed records (``--classify``), and how it compares with the GPU measurement
behind the former fa3-vllm[2] (``scripts/investigate_fa3_window_d256.py``), is in
``reports/h100-2026-11-27-peers/triage.md``.

**The GPU run** checks the model against the kernel, case by case (the 23 and their neighbours, each differing in one
field; :func:`grid`): the harness's verdict (``check_backend``), then outside the harness, in float64 from the
inputs the kernel was given (fp8: the stored values times their descales, recomputed here), the explicit formula:
scores ``scale * q.k``, soft-cap ``cap * tanh(s / cap)``, the window bottom-right aligned (row i of a request of
``(sq, sk)`` sees key j iff ``i + sk - sq - left <= j <= i + sk - sq + right``, right 0 under causal), sinks in the
softmax denominator (LSE ``log(sum exp(s) + exp(sink))``).  Per (row, head): the kernel's LSE and output against
that, the harness's reference against it, and the kernel against the same formula over the keys the *model* says
the kernel sees.  Reported per case: the rows where the kernel is off (LSE beyond :data:`LSE_TOL` and 3 times the
same-precision baseline's farthest row; and beyond :data:`LSE_TOL` alone), the rows the model marks, both, either
alone; the largest distance of the kernel from the model's keys; for each wrong row the
best contiguous extension of its window that the kernel's LSE fits, on the right and on the left (independent of the
model); the keyless rows' LSE (-inf or the sink: fa3-vllm[1]); the reference's largest distance from float64.

The hypothesis holds where, for every case, the kernel's wrong rows are exactly the model's, the kernel is within
rounding of the model's keys on every row, the right-side fit is exact and the left one is not, and every neighbour
the model calls right is right; the harness's reference must agree with float64 to rounding everywhere.  ``--judge``
states each of these as countable criteria (:data:`CRITERIA`) and prints, over a run's JSON lines, how many cases each
holds for, by precision class (16-bit, soft-cap, fp8: the kernel's own rounding of the LSE differs by class), with
every failing case and its figures.

``--only sdpa-cpu --device cpu --small`` is the CPU smoke run: the same analysis on shrunk cases with SDPA (no wrong
row expected; soft-cap cases are unsupported there, their reference still checked).  ``--list`` prints the grid
with the model's verdicts (no kernel).  ``--classify`` reads records and writes the per-record table of
``reports/h100-2026-11-27-peers/triage.md`` (fields, error figures, the ledger entry, the model's verdict).
"""

from __future__ import annotations

import argparse
import fnmatch
import gzip
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from attnfast.fa3_vllm_window import (
    WindowSchedule,
    fa3_vllm_request_splits,
    fa3_vllm_window_schedule,
    window_bounds,
)
from conformance.cases.case import AttentionCase

RECORDS = Path(__file__).resolve().parent.parent / "reports" / "h100-2026-11-27-peers" / "peer-fa3-s0of32.jsonl.gz"

#: the 23 failures no ledger entry explained (attnconf ledger audit, 2026-11-27), by case id
UNEXPLAINED = (
    "gqa_h16_kv2_d256_bf16_peerfa3out_contig_win862-3037_split1-edba44",
    "mha_h16_kv16_d192_dv128_fp16_peerfa3out_contig_win2197-1141_cap15_split1-9d9d85",
    "mha_h16_kv16_d128_bf16_peerfa3out_contig_causal_win1511-0_split1_fp8e4m3_dshead-84cf2c",
    "mha_h16_kv16_d128_fp16_peerfa3out_contig_causal_win929-0_cap15_split1-9834ea",
    "mha_h16_kv16_d128_fp16_peerfa3out_contig_causal_win738-0_cap15_sink_split1-3aa6ae",
    "mha_h16_kv16_d128_bf16_peerfa3out_contig_causal_win1615-0_sink_split1_fp8e4m3_dshead-8396a4",
    "gqa_h16_kv2_d256_bf16_peerfa3out_contig_win556-398_sink_split1-8ed3d6",
    "gqa_h16_kv2_d256_bf16_peerfa3out_contig_win840-116_sink_split1-ba3207",
    "mha_h16_kv16_d64_bf16_peerfa3out_contig_causal_win3533-0_sink_split1_fp8e4m3_dshead-8c2b44",
    "mha_h6_kv6_d96_bf16_peerfa3var_contig_win840-156_cap15-eb1ddb",
    "mha_h16_kv16_d64_bf16_peerfa3out_contig_causal_win689-0_split1_fp8e4m3_dshead-a6ab32",
    "gqa_h6_kv2_d64_bf16_peerfa3var_contig_win473-753_cap15_fp8e4m3_dshead-092ca6",
    "mqa_h6_kv1_d256_fp16_peerfa3var_contig_win142-614_split3-62aa96",
    "mha_h16_kv16_d64_bf16_peerfa3out_contig_causal_win396-0_sink_split1_fp8e4m3_dshead-6e7bbd",
    "mha_h6_kv6_d256_fp16_peerfa3var_contig_win516-286-da75ed",
    "gqa_h6_kv2_d256_bf16_peerfa3var_contig_win71-498_cap15_split1-73db10",
    "gqa_h6_kv2_d192_dv128_bf16_peerfa3var_contig_win86-377_cap15_split3_fp8e4m3_dshead-a07877",
    "gqa_h6_kv2_d128_bf16_peerfa3var_contig_win224-410_cap15_split1-1a2f95",
    "mha_h16_kv16_d128_bf16_peerfa3out_contig_causal_win353-0_sink_split1_fp8e4m3_dshead-425847",
    "gqa_h6_kv2_d256_bf16_peerfa3var_contig_win18-142_cap15_split1-0e00f1",
    "mqa_h6_kv1_d192_bf16_peerfa3var_contig_win46-132_cap15_split1_fp8e4m3_dshead-879b2e",
    "mqa_h6_kv1_d128_bf16_peerfa3kv_ps128nhd_win296-73_split1_sched-4c7e3a",
    "mqa_h6_kv1_d256_bf16_peerfa3var_contig_win113-68_cap15_split3-0e3ea9",
)
#: the pass fa3-vllm[1] claimed (d64: 192-row query tiles, so its 128 keyless rows share a tile with rows that see
#: keys); its d128 twin has a keyless 128-row tile
CLAIMED_PASS = "mha_h16_kv16_d64_fp16_peerfa3out_contig_causal_win198-0_cap15_sink_split1-aad1ba"

#: small cases the model marks (one request, 2 query heads over 1 kv head, one split), one per path it predicts wrong:
#: d128 and d192 causal, d64 in fp8 (d64 bf16/fp16 windows take the path without the bug), d96 with a right side
MINIMAL = (
    AttentionCase(((300, 300),), 2, 1, 128, causal=True, window=(214, 0), num_splits=1, batch_name="minimal"),
    AttentionCase(((300, 300),), 2, 1, 192, causal=True, window=(160, 0), num_splits=1, batch_name="minimal"),
    AttentionCase(
        ((400, 400),),
        2,
        1,
        64,
        causal=True,
        window=(370, 0),
        num_splits=1,
        quant="fp8_e4m3",
        descale="head",
        batch_name="minimal",
    ),  # fmt: skip
    AttentionCase(((520, 520),), 2, 1, 96, window=(256, 37), num_splits=1, batch_name="minimal"),
)

#: a (row, head) is wrong where the kernel's LSE is this far from the float64 LSE and 3 times as far as the
#: same-precision baseline's farthest row (the fork's LSE is within 1e-4 of the reference on the peer run's passes)
LSE_TOL = 1e-3
#: rows of the side fit per case (the wrong rows are sampled evenly beyond it)
FIT_ROWS = 512
#: a side fit is exact within the rounding of the kernel's fp32 LSE (|LSE| < 20: 2.4e-6), with margin
FIT_EXACT = 2e-5


# ============================================================================================== the model
#: the model lives in attnfast (the ledger field fa3_window_unmasked_rows reads it too); the names this script used
schedule = fa3_vllm_window_schedule
fork_splits = fa3_vllm_request_splits
true_bounds = window_bounds
Schedule = WindowSchedule


# ============================================================================================== records
def read_records(path: Path) -> list[dict]:
    with (gzip.open if str(path).endswith(".gz") else open)(path, "rt", encoding="utf-8") as fh:
        return [d for d in map(json.loads, fh) if d.get("type") == "result"]


def _rows_over(reason: str) -> str:
    m = re.search(r"(\d+) of (\d+) rows over", reason or "")
    return f"{m.group(1)}/{m.group(2)}" if m else ""


def classify_record(d: dict, ledger: Any) -> dict[str, Any]:
    """One record's fields, error figures, explaining (or claiming) ledger entry and the model's verdict."""
    from conformance.records import CheckResult
    from conformance.ledger.fields import case_view

    case = AttentionCase.from_json(d["case"])
    view = case_view(case)
    st = d.get("stats") or {}
    variant = (d.get("extra") or {}).get("variant") or {}
    result = CheckResult.from_json(d)
    entries = ledger.for_backend(d["backend"])
    if result.status.is_problem:
        entry = ledger.explain(result)
    else:
        entry = next((e for e in entries if e.matches(result) and e.claims_passes), None)
    sch = schedule(case)
    q, k = case.q_lens, case.kv_lens
    row = {
        "case_id": d["case_id"],
        "status": d["status"],
        "entry": "" if entry is None else f"fa3-vllm[{entries.index(entry)}]",
        "family": case.batch_name,
        "d": case.head_dim,
        "dv": case.dv,
        "template": view.value("fa3_hdim_template"),
        "heads": f"{case.num_heads}/{case.num_kv_heads}",
        "dtype": case.dtype if case.quant == "none" else f"{case.quant}({case.descale_mode})",
        "causal": case.causal,
        "window": "" if case.window == (None, None) else f"{case.window[0]},{case.window[1]}",
        "softcap": case.softcap or "",
        "sinks": case.sinks,
        "splits": f"{case.num_splits or 0}->{variant.get('fa3_num_splits', '')}",
        "layout": case.kv_layout if not case.paged else f"{case.kv_layout}{case.block_size}",
        "sched": case.scheduler_metadata,
        "batch": case.batch,
        "q_len": f"{min(q)}-{max(q)}" if min(q) != max(q) else str(q[0]),
        "kv_len": f"{min(k)}-{max(k)}" if min(k) != max(k) else str(k[0]),
        "sq_gt_sk": any(a > b for a, b in case.requests),
        "keys_left_of_window": view.value("keys_left_of_window"),
        "rows_without_keys": view.value("rows_without_keys"),
        "keyless_m_block": view.value("fa3_keyless_m_block"),
        "error_ratio": st.get("error_ratio"),
        "mismatch_frac": st.get("mismatch_frac"),
        "lse_max_abs": st.get("lse_max_abs"),
        "lse_rows_over": _rows_over(d.get("reason", "")),
        "failed_checks": "+".join(st.get("failed_checks") or []),
        "worst": st.get("worst"),
    }
    if sch is None:
        row.update(model="no window call")
    else:
        t = sch.totals()
        row.update(
            model="wrong" if t["wrong_rows"] else "right",
            model_tile=f"{sch.block_m}x{sch.block_n}{'o' if sch.overlap else ''}",
            model_rows=t["wrong_rows"],
            model_side="right" if t["rows_extra_right"] else ("left" if t["rows_extra_left"] else ""),
            model_max_extra=t["max_extra_keys"],
        )
    return row


def classify(paths: list[Path], tsv: Path | None) -> list[dict]:
    from conformance.ledger.entries import load_ledger

    ledger = load_ledger()
    rows = []
    for path in paths:
        for d in read_records(path):
            if d.get("backend") == "fa3-vllm" and d["status"] in ("pass", "fail"):
                try:
                    rows.append(classify_record(d, ledger))
                except (ValueError, TypeError, KeyError) as exc:  # a record the case model no longer reads
                    print(f"skipped {d.get('case_id')}: {exc}", file=sys.stderr)
    summary: dict[tuple, int] = {}
    for r in rows:
        key = (r["status"], r["entry"] or "-", r.get("model", ""), r["failed_checks"] or "-")
        summary[key] = summary.get(key, 0) + 1
    for key in sorted(summary):
        print(f"{summary[key]:6d}  status={key[0]:4s} entry={key[1]:12s} model={key[2]:15s} checks={key[3]}")
    if tsv is not None:
        cols = list(dict.fromkeys(c for r in rows for c in r))
        lines = ["\t".join(cols)] + [
            "\t".join("" if r.get(c) is None else str(r.get(c, "")) for c in cols) for r in rows
        ]
        text = "\n".join(lines) + "\n"
        if tsv.suffix == ".gz":
            tsv.write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))
        else:
            tsv.write_text(text, encoding="utf-8")
    return rows


# ============================================================================================== the grid
def _base_cases(records: Path) -> dict[str, AttentionCase]:
    want = (*UNEXPLAINED, CLAIMED_PASS)
    found: dict[str, AttentionCase] = {}
    for d in read_records(records):
        if d.get("backend") == "fa3-vllm" and d["case_id"] in want:
            found[d["case_id"]] = AttentionCase.from_json(d["case"])
    missing = [c for c in want if c not in found]
    if missing:
        raise SystemExit(f"{records}: no fa3-vllm record of {', '.join(missing)}")
    return {c: found[c] for c in want}


def _model_right_window(case: AttentionCase) -> AttentionCase | None:
    """The case with the nearest left window side (within a key tile) the model calls right, or None."""
    left, right = case.window
    sch = schedule(case)
    if left is None or sch is None:
        return None
    for step in range(1, sch.block_n + 1):
        for w in (left - step, left + step):
            if w >= 0:
                other = case.replace(window=(w, right))
                s = schedule(other)
                if s is not None and s.totals()["wrong_rows"] == 0:
                    return other
    return None


def neighbours(case: AttentionCase) -> list[tuple[str, AttentionCase]]:
    """The case with one field changed: fp8 -> bf16, no soft-cap, no sinks, the right window side 0, the nearest
    left side the model calls right, the other pinned split count."""
    out: list[tuple[str, AttentionCase]] = []
    if case.quant != "none":
        out.append(("bf16", case.replace(quant="none", descale=None)))
    if case.softcap:
        out.append(("no_softcap", case.replace(softcap=None)))
    if case.sinks:
        out.append(("no_sinks", case.replace(sinks=False)))
    if not case.causal and case.window[1]:
        out.append(("right_side_0", case.replace(window=(case.window[0], 0))))
    right = _model_right_window(case)
    if right is not None:
        out.append((f"left_{right.window[0]}", right))
    if case.num_splits in (1, 3):
        out.append((f"splits_{4 - case.num_splits}", case.replace(num_splits=4 - case.num_splits)))
    return out


def shrink(case: AttentionCase) -> AttentionCase:
    """A CPU-sized twin: the first two requests at 1/16 of their lengths, one kv head (the group kept), the window
    sides at 1/16."""
    if case.batch_name == "minimal":
        return case
    reqs = tuple((max(1, q // 16), k // 16) for q, k in case.requests[:2])
    group = case.num_heads // case.num_kv_heads
    left, right = case.window
    window = (None if left is None else left // 16, None if right is None else right // 16)
    return case.replace(requests=reqs, num_heads=group, num_kv_heads=1, window=window)


def grid(records: Path, small: bool = False, shard: tuple[int, int] = (0, 1)) -> list[tuple[str, str, AttentionCase]]:
    """``(label, base case id, case)``: each of the 23, the claimed pass and the :data:`MINIMAL` cases, each followed
    by its neighbours (deduplicated); ``shard`` ``(i, n)`` keeps every n-th base case from the i-th, with its
    neighbours."""
    bases = {**_base_cases(records), **{c.id: c for c in MINIMAL}}
    out: list[tuple[str, str, AttentionCase]] = []
    seen: set[str] = set()
    for base_id, base in list(bases.items())[shard[0] :: shard[1]]:
        base = shrink(base) if small else base
        items = [("base", base)] + (
            [("d128", base.replace(head_dim=128))] if base_id == CLAIMED_PASS else neighbours(base)
        )
        for label, case in items:
            if case.id not in seen:
                seen.add(case.id)
                out.append((label, base_id, case))
    return out


# ============================================================================================== float64
def _dequantized(case: AttentionCase, inputs: Any) -> tuple[Any, Any, Any, float]:
    """q, k, v in float64 as the kernel was given them: fp8 the stored values times their descales (per request and
    kv head, recomputed here), else the inputs; and the largest distance from the harness's dequantized inputs."""
    import torch

    quant = inputs.quant
    q, k, v = (t.double() for t in (inputs.q, inputs.k, inputs.v))
    if quant is None:
        return q, k, v, 0.0
    g = case.num_heads // case.num_kv_heads

    def deq(stored, descale, lens, heads_per_scale):
        x = stored.double()
        if descale.numel() == 1:
            return x * float(descale.reshape(-1)[0])
        rows = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens)).to(x.device)
        per = descale.double().to(x.device)[rows]  # (tokens, hk)
        return x * per.repeat_interleave(heads_per_scale, 1)[..., None]

    dq = deq(quant.q, quant.q_descale, case.q_lens, g) if quant.q is not None else q
    dk = deq(quant.k, quant.k_descale, case.kv_lens, 1)
    dv = deq(quant.v, quant.v_descale, case.kv_lens, 1) if quant.v is not None else v
    gap = max(float((a - b).abs().max()) if a.numel() else 0.0 for a, b in ((dq, q), (dk, k), (dv, v)))
    return dq, dk, dv, gap


def explicit(case: AttentionCase, inputs: Any, sch: Schedule | None, device: str) -> dict[str, Any]:
    """Float64 out ``(total_q, h, dv)`` and LSE ``(h, total_q)`` by the explicit formula over the window, and (with a
    model that adds keys) over the keys the model says the kernel sees."""
    import torch

    q, k, v, gap = _dequantized(case, inputs)
    q, k, v = q.to(device), k.to(device), v.to(device)
    h, hk = case.num_heads, case.num_kv_heads
    g = h // hk
    scale = case.scale if case.scale is not None else case.head_dim**-0.5
    sinks = None if inputs.sinks is None else inputs.sinks.double().to(device)
    extra = sch is not None and sch.totals()["wrong_rows"] > 0
    res = {"gap_dequant": gap}
    for name in ("spec",) + (("model",) if extra else ()):
        res[name] = (torch.zeros(case.total_q, h, case.dv, dtype=torch.float64, device=device),
                     torch.full((h, case.total_q), -math.inf, dtype=torch.float64, device=device))  # fmt: skip
    q0 = k0 = 0
    for b, (sq, sk) in enumerate(case.requests):
        lo, hi = (torch.as_tensor(x, device=device) for x in true_bounds(case, b))
        cols = torch.arange(sk, device=device)
        unmasked = sch.requests[b].unmasked if extra else []
        for r0 in range(0, sq, 512):
            r1 = min(sq, r0 + 512)
            win = (cols[None] >= lo[r0:r1, None]) & (cols[None] < hi[r0:r1, None])  # (rows, sk)
            win = win[:, None, :].expand(r1 - r0, g, sk)
            masks = {"spec": win}
            if extra:
                more = torch.zeros_like(win)
                rows = torch.arange(r0, r1, device=device)
                for u0, u1, c0, c1 in unmasked:
                    if sch.packed:
                        units = rows[:, None] * g + torch.arange(g, device=device)[None]  # (rows, g)
                        hit = (units >= u0) & (units < u1)
                    else:
                        hit = ((rows >= u0) & (rows < u1))[:, None].expand(r1 - r0, g)
                    if hit.any():
                        more[:, :, c0:c1] |= hit[:, :, None]
                masks["model"] = win | more
            for kh in range(hk):
                qs = q[q0 + r0 : q0 + r1, kh * g : (kh + 1) * g]  # (rows, g, d)
                s = torch.einsum("rgd,jd->rgj", qs, k[k0 : k0 + sk, kh]) * scale
                if case.softcap:
                    s = case.softcap * torch.tanh(s / case.softcap)
                for name, mask in masks.items():
                    sm = s.masked_fill(~mask, -math.inf)
                    if sinks is not None:
                        sink = sinks[kh * g : (kh + 1) * g][None, :, None].expand(r1 - r0, g, 1)
                        sm = torch.cat([sm, sink], dim=-1)
                    lse = torch.logsumexp(sm, dim=-1)  # (rows, g)
                    p = torch.exp(sm - lse[..., None]).nan_to_num(0.0)[..., :sk]
                    out = torch.einsum("rgj,jd->rgd", p, v[k0 : k0 + sk, kh])
                    res[name][0][q0 + r0 : q0 + r1, kh * g : (kh + 1) * g] = out
                    res[name][1][kh * g : (kh + 1) * g, q0 + r0 : q0 + r1] = lse.T
        q0, k0 = q0 + sq, k0 + sk
    return res


def _lse_gap(a: Any, b: Any) -> Any:
    """|a - b| with equal infinities 0 (a keyless row's -inf on both sides agrees)."""
    import torch

    same = (a == b) | (torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b)))
    return torch.where(same, torch.zeros_like(a), (a - b).abs())


def side_fit(case: AttentionCase, inputs: Any, lse_k: Any, bad: list[tuple[int, int, int]], device: str) -> dict:
    """For wrong (request, row, head)s: the best contiguous extension of the row's window, by t keys on the right and
    on the left, that the kernel's LSE fits (float64, independent of the model)."""
    import torch

    q, k, _, _ = _dequantized(case, inputs)
    q, k = q.to(device), k.to(device)
    g = case.num_heads // case.num_kv_heads
    scale = case.scale if case.scale is not None else case.head_dim**-0.5
    sinks = None if inputs.sinks is None else inputs.sinks.double().to(device)
    cu_q = np.cumsum([0] + list(case.q_lens))
    cu_k = np.cumsum([0] + list(case.kv_lens))
    fits = {"right": [], "left": []}
    for b, i, hh in bad:
        lo, hi = (int(x[i]) for x in true_bounds(case, b))
        sk = case.kv_lens[b]
        s = (k[cu_k[b] : cu_k[b] + sk, hh // g] @ q[cu_q[b] + i, hh]) * scale
        if case.softcap:
            s = case.softcap * torch.tanh(s / case.softcap)
        base = [s[lo:hi]] + ([sinks[hh : hh + 1]] if sinks is not None else [])
        empty = torch.tensor(-math.inf, dtype=torch.float64, device=device)
        base_lse = torch.logsumexp(torch.cat(base), 0) if sum(x.numel() for x in base) else empty
        got = lse_k[hh, cu_q[b] + i].double()
        for side, ext in (("right", s[hi:]), ("left", s[:lo].flip(0))):
            if ext.numel() == 0:
                fits[side].append((0, float(abs(got - base_lse))))
                continue
            cum = torch.logaddexp(base_lse.to(device), torch.logcumsumexp(ext, 0))
            cand = torch.cat([base_lse.reshape(1).to(device), cum])
            err = (cand - got.to(device)).abs()
            t = int(err.argmin())
            fits[side].append((t, float(err[t])))
    out: dict[str, Any] = {}
    for side, vals in fits.items():
        if vals:
            ts = [t for t, _ in vals]
            res = [r for _, r in vals]
            out[side] = {"rows": len(vals), "exact": sum(r < FIT_EXACT for r in res), "max_residual": max(res),
                         "keys_min": min(ts), "keys_median": int(np.median(ts)), "keys_max": max(ts)}  # fmt: skip
    if fits["right"]:
        out["right_closer"] = sum(r[1] < l_[1] for r, l_ in zip(fits["right"], fits["left"]))
    return out


# ============================================================================================== one case
def study(label: str, base_id: str, case: AttentionCase, backend: Any, device: str) -> dict[str, Any]:
    """One case: the harness's verdict, the float64 computations, the kernel's rows against them and the model's
    (``backend``: a registry name or an :class:`attnfast.base.Backend`)."""
    import torch

    from attnfast.registry import get_backend
    from conformance.verdict.check import _fresh_inputs, check_backend, prepare_context

    t0 = time.time()
    backend = get_backend(backend) if isinstance(backend, str) else backend
    sch = schedule(case)
    row: dict[str, Any] = {"label": label, "base": base_id, "case_id": case.id, "case": case.to_json(),
                           "backend": backend.name, "model": None if sch is None else sch.describe()}  # fmt: skip
    ctx = prepare_context(case, 0, device)
    record = check_backend(ctx, backend)
    st = record.stats
    row["harness"] = {"status": record.status.value, "reason": record.reason[:300],
                      "error_ratio": None if st is None else st.error_ratio,
                      "lse_max_abs": None if st is None else st.lse_max_abs,
                      "variant": record.extra.get("variant")}  # fmt: skip
    ref64 = explicit(case, ctx.inputs, sch, device)
    spec_out, spec_lse = ref64["spec"]
    row["dequant_gap"] = ref64["gap_dequant"]
    ref_out, ref_lse = ctx.ref.out.double().to(device), ctx.ref.lse.double().to(device)
    row["reference_vs_fp64"] = {"lse_max": float(_lse_gap(ref_lse, spec_lse).max()),
                                "out_max": float((ref_out - spec_out).abs().max())}  # fmt: skip
    if record.status.value not in ("pass", "fail"):
        row["seconds"] = round(time.time() - t0, 2)
        return row
    kern = backend.prepare(case, _fresh_inputs(ctx.inputs))()
    if kern.lse is None:
        row["note"] = "the backend returns no LSE: nothing to compare row by row"
        row["seconds"] = round(time.time() - t0, 2)
        return row
    k_out, k_lse = kern.out.double().to(device), kern.lse.double().to(device)
    gap = _lse_gap(k_lse, spec_lse)  # (h, total_q)
    out_gap = (k_out - spec_out).abs().amax(-1).T  # (h, total_q)
    # wrong: beyond LSE_TOL and beyond 3 x the same-precision baseline's largest distance (the verdict's rule, without
    # its atol: a kernel that rounds q and k to bf16, as SDPA on dequantized fp8 does, is about as far off)
    base_gap = float(_lse_gap(ctx.base[1].double().to(device), spec_lse).max())
    threshold = max(LSE_TOL, 3 * base_gap)
    bad = gap > threshold
    g = case.num_heads // case.num_kv_heads
    model_mask = torch.zeros_like(bad)
    if sch is not None:
        q0 = 0
        for b, w in enumerate(sch.wrong()):
            sq = case.q_lens[b]
            # (sq, g) per kv head -> (h, sq): head kh * g + j
            model_mask[:, q0 : q0 + sq] = torch.as_tensor(w.T, device=device).repeat(case.num_kv_heads, 1)
            q0 += sq
    both = bad & model_mask
    row["kernel_vs_fp64"] = {
        "lse_max": float(gap.max()),
        "out_max": float(out_gap.max()),
        "threshold": threshold,
        "wrong_rows": int(bad.sum()),
        "rows_beyond_1e-3": int((gap > LSE_TOL).sum()),
        "kernel_only_beyond_1e-3": int(((gap > LSE_TOL) & ~model_mask).sum()),
        "model_rows": int(model_mask.sum()),
        "both": int(both.sum()),
        "kernel_only": int((bad & ~model_mask).sum()),
        "model_only": int((model_mask & ~bad).sum()),
        "out_max_on_model_rows": float(out_gap[model_mask].max()) if model_mask.any() else 0.0,
        "out_max_elsewhere": float(out_gap[~model_mask].max()) if (~model_mask).any() else 0.0,
        "lse_max_elsewhere": float(gap[~model_mask].max()) if (~model_mask).any() else 0.0,
    }
    if "model" in ref64:
        # threshold-free: on the model's rows where its keys move the LSE (by 1e-4 or more), is the kernel closer to
        # the model's keys than to the window's?
        m_out, m_lse = ref64["model"]
        m_gap = _lse_gap(k_lse, m_lse)
        moved = model_mask & (_lse_gap(m_lse, spec_lse) >= 1e-4)
        row["kernel_vs_model_fp64"] = {"lse_max": float(m_gap.max()), "out_max": float((k_out - m_out).abs().max()),
                                       "model_rows_moved": int(moved.sum()),
                                       "closer_to_model": int((moved & (m_gap < gap)).sum())}  # fmt: skip
    # where: the wrong rows by request, the first and last, the first one's query tile
    where, picks = [], []
    cu = np.cumsum([0] + list(case.q_lens))
    rows_per_tile = 128 if sch is None else max(1, sch.block_m // (g if sch.packed else 1))
    for b, (sq, sk) in enumerate(case.requests):
        sub = bad[:, cu[b] : cu[b] + sq]
        rows = torch.nonzero(sub.any(0)).flatten().cpu().numpy()
        if len(rows):
            where.append({"request": b, "q_len": sq, "kv_len": sk, "rows": len(rows), "first": int(rows[0]),
                          "last": int(rows[-1]), "first_tile": int(rows[0]) // rows_per_tile})  # fmt: skip
            picks += [(b, int(i), int(hh)) for hh, i in torch.nonzero(sub).cpu().numpy()]
    row["where"] = where[:12]
    if picks:
        step = max(1, len(picks) // FIT_ROWS)
        row["side_fit"] = side_fit(case, ctx.inputs, k_lse, picks[::step][:FIT_ROWS], device)
    if case.sinks:  # keyless rows: LSE -inf or the sink (fa3-vllm[1])
        empty = torch.zeros(case.total_q, dtype=torch.bool, device=device)
        for b in range(case.batch):
            lo, hi = true_bounds(case, b)
            empty[cu[b] : cu[b] + len(lo)] = torch.as_tensor(lo >= hi, device=device)
        keyless = empty[None].expand_as(bad)
        row["keyless_rows"] = {"rows": int(keyless.sum()), "kernel_-inf": int((keyless & torch.isneginf(k_lse)).sum()),
                               "kernel_sink": int((keyless & (gap <= threshold)).sum())}  # fmt: skip
    row["seconds"] = round(time.time() - t0, 2)
    return row


def _short(row: dict) -> str:
    kv = row.get("kernel_vs_fp64") or {}
    km = row.get("kernel_vs_model_fp64") or {}
    m = row.get("model") or {}
    fit = row.get("side_fit") or {}
    sides = " ".join(f"{s}:{v['exact']}/{v['rows']}" for s, v in fit.items() if isinstance(v, dict))
    return (f"{row['label']:>14s} {row['harness']['status']:11s} model={m.get('wrong_rows', '-')!s:>6s} "
            f"kernel={kv.get('wrong_rows', '-')!s:>6s} both={kv.get('both', '-')!s:>6s} "
            f"k-m={km.get('lse_max', float('nan')):.1e} ref={row['reference_vs_fp64']['lse_max']:.1e} "
            f"fit[{sides}] {row['seconds']}s {row['case_id'][:70]}")  # fmt: skip


# ============================================================================================== judge
def _fp8(row: dict) -> bool:
    return row["case"].get("quant", "none") != "none"


#: the precision classes of the judgement: the kernel's own rounding of the LSE differs by class
CLASSES = ("16-bit", "soft-cap", "fp8")


def _class(row: dict) -> str:
    """``fp8`` (any quantized case), ``soft-cap`` (16-bit with a soft-cap) or ``16-bit``."""
    return "fp8" if _fp8(row) else ("soft-cap" if row["case"].get("softcap") else "16-bit")


def _adds(row: dict) -> bool:
    return (row.get("model") or {}).get("wrong_rows", 0) > 0


def _fit(row: dict, side: str) -> dict:
    return (row.get("side_fit") or {}).get(side) or {}


#: the hypothesis's criteria (the module docstring, "The hypothesis holds where ..."), each as ``(key, what,
#: applies to the row, holds for it, its figures)``, over the JSON lines of the GPU run
CRITERIA: list[tuple[str, str, Any, Any, Any]] = [
    ("1a", "no wrong row outside the model's (`kernel_only == 0`)", lambda r: True,
     lambda r: r["kernel_vs_fp64"]["kernel_only"] == 0,
     lambda r: f"kernel_only {r['kernel_vs_fp64']['kernel_only']}"),
    ("1b", "every model row wrong (`model_only == 0`)", lambda r: True,
     lambda r: r["kernel_vs_fp64"]["model_only"] == 0,
     lambda r: f"model_only {r['kernel_vs_fp64']['model_only']} of {r['kernel_vs_fp64']['model_rows']}"),
    ("1c", "no row outside the model's beyond 1e-3 in LSE", lambda r: True,
     lambda r: r["kernel_vs_fp64"]["kernel_only_beyond_1e-3"] == 0,
     lambda r: f"{r['kernel_vs_fp64']['kernel_only_beyond_1e-3']} rows, LSE up to "
               f"{r['kernel_vs_fp64']['lse_max_elsewhere']:.1e}"),
    ("2a", "kernel within 1e-4 (LSE) of float64 over the model's keys, every row", _adds,
     lambda r: r["kernel_vs_model_fp64"]["lse_max"] <= 1e-4,
     lambda r: f"{r['kernel_vs_model_fp64']['lse_max']:.2e}"),
    ("2b", "... and no farther from them than from float64 on the rows the model leaves alone", _adds,
     lambda r: r["kernel_vs_model_fp64"]["lse_max"] <= r["kernel_vs_fp64"]["lse_max_elsewhere"],
     lambda r: f"{r['kernel_vs_model_fp64']['lse_max']:.2e} vs {r['kernel_vs_fp64']['lse_max_elsewhere']:.2e}"),
    ("2c", "closer to the model's keys than to the window on every row they move by 1e-4", _adds,
     lambda r: r["kernel_vs_model_fp64"]["closer_to_model"] == r["kernel_vs_model_fp64"]["model_rows_moved"],
     lambda r: f"{r['kernel_vs_model_fp64']['closer_to_model']} of {r['kernel_vs_model_fp64']['model_rows_moved']}"),
    ("3a", "every fitted wrong row an exact (2e-5) extension on the right", lambda r: bool(_fit(r, "right")),
     lambda r: _fit(r, "right")["exact"] == _fit(r, "right")["rows"],
     lambda r: f"{_fit(r, 'right')['exact']}/{_fit(r, 'right')['rows']}, residual up to "
               f"{_fit(r, 'right')['max_residual']:.1e}"),
    ("3b", "none an exact extension on the left", lambda r: bool(_fit(r, "left")),
     lambda r: _fit(r, "left")["exact"] == 0,
     lambda r: f"{_fit(r, 'left')['exact']}/{_fit(r, 'left')['rows']}"),
    ("3c", "the right fit closer than the left on every fitted row", lambda r: bool(_fit(r, "right")),
     lambda r: r["side_fit"]["right_closer"] == _fit(r, "right")["rows"],
     lambda r: f"{r['side_fit']['right_closer']}/{_fit(r, 'right')['rows']}"),
    ("3d", "the right fit's longest extension is the model's most added keys",
     lambda r: bool(_fit(r, "right")) and _adds(r),
     lambda r: _fit(r, "right")["keys_max"] == r["model"]["max_extra_keys"],
     lambda r: f"{_fit(r, 'right')['keys_max']} vs {r['model']['max_extra_keys']}"),
    ("4a", "model right: the harness passes, no wrong row", lambda r: not _adds(r),
     lambda r: r["harness"]["status"] == "pass" and r["kernel_vs_fp64"]["wrong_rows"] == 0,
     lambda r: f"{r['harness']['status']}, {r['kernel_vs_fp64']['wrong_rows']} wrong rows"),
    ("4b", "model wrong: the harness fails", _adds, lambda r: r["harness"]["status"] == "fail",
     lambda r: r["harness"]["status"]),
    ("5a", "reference within 1e-5 of float64 (LSE and output)", lambda r: True,
     lambda r: max(r["reference_vs_fp64"]["lse_max"], r["reference_vs_fp64"]["out_max"]) <= 1e-5,
     lambda r: f"LSE {r['reference_vs_fp64']['lse_max']:.1e}, output {r['reference_vs_fp64']['out_max']:.1e}"),
    ("5b", "fp8: dequantized inputs within 2e-6 of stored x descale", _fp8, lambda r: r["dequant_gap"] <= 2e-6,
     lambda r: f"{r['dequant_gap']:.1e}"),
]  # fmt: skip


def read_rows(path: Path) -> list[dict]:
    """The JSON lines of a GPU run (gzip or not).  ``ValueError`` naming the file when it is unreadable, holds no
    line or a line that is not a case's row (a case that raised is a row with ``error``: it fails every criterion)."""
    try:
        with (gzip.open if str(path).endswith(".gz") else open)(path, "rt", encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
    except (OSError, ValueError, EOFError) as exc:
        raise ValueError(f"{path}: not readable as JSON lines ({exc})") from None
    if not rows or not all(isinstance(r, dict) and "case_id" in r for r in rows):
        raise ValueError(f"{path}: no rows of this script's GPU run")
    return rows


def judge(rows: list[dict]) -> tuple[list[str], bool]:
    """The criteria over every row as Markdown: a table of counts (cases it applies to, holds, fails; the fails by
    precision class) and each failing case with its figures; and whether every criterion holds for every row.  A row
    the kernel was not compared on (the case raised, or the harness did not judge it) fails every criterion."""
    lines = ["| criterion | cases | holds | fails | fails: " + " / ".join(CLASSES) + " |", "|---|---|---|---|---|"]
    failing: list[str] = []
    unmeasured = [r for r in rows if "error" in r or "kernel_vs_fp64" not in r]
    measured = [r for r in rows if r not in unmeasured]
    every = not unmeasured
    for key, what, applies, holds, figures in CRITERIA:
        cases = [r for r in measured if applies(r)]
        bad = [r for r in cases if not holds(r)]
        every = every and not bad
        by_class = " / ".join(str(sum(_class(r) == c for r in bad)) for c in CLASSES)
        lines.append(
            f"| {key}: {what} | {len(cases) + len(unmeasured)} | {len(cases) - len(bad)} "
            f"| {len(bad) + len(unmeasured)} | {by_class} |"
        )
        for c in CLASSES:
            of = [r for r in bad if _class(r) == c]
            if of:
                failing.append(f"* **{key}**, {c} ({len(of)}): " + "; ".join(
                    f"`{r['label']}` {r['case_id'][-6:]} ({figures(r)})" for r in of))  # fmt: skip
    for r in unmeasured:
        why = r.get("error") or f"harness {(r.get('harness') or {}).get('status')}: {r.get('note', 'no comparison')}"
        failing.append(f"* **not measured** `{r.get('label')}` {r['case_id']}: {why[:200]}")
    return lines + [""] + failing, every


# ============================================================================================== main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--only", choices=("fa3-vllm", "sdpa-cpu", "sdpa-cuda"), help="backend (default fa3-vllm)")
    ap.add_argument("--records", type=Path, default=RECORDS, help="where the 23 cases are read from")
    ap.add_argument("--out", type=Path, default=Path("investigate-fa3-peer-windows.jsonl"))
    ap.add_argument("--shard", default="0/1", help="I/N: every N-th base case from the I-th, with its neighbours")
    ap.add_argument("--case", action="append", default=[], help="only grid cases whose id or base id match the glob")
    ap.add_argument("--limit", type=int, default=0, help="at most this many cases (0: all)")
    ap.add_argument("--small", action="store_true", help="CPU-sized twins of the cases (the smoke run)")
    ap.add_argument("--list", action="store_true", help="print the grid and the model's verdicts, run nothing")
    ap.add_argument("--classify", type=Path, nargs="+", help="records to classify (no grid, no kernel)")
    ap.add_argument("--tsv", type=Path, help="with --classify: write the per-record table here (gzip: *.gz)")
    ap.add_argument("--judge", type=Path, help="print the criteria's verdicts over a GPU run's JSON lines")
    args = ap.parse_args(argv)
    if args.judge:
        try:
            rows = read_rows(args.judge)
        except ValueError as exc:
            ap.error(f"--judge: {exc}")
        lines, every = judge(rows)
        print("\n".join(lines))
        print(f"{len(rows)} cases: the criteria {'hold on every case' if every else 'do not all hold'}")
        return 0
    if args.classify:
        if args.tsv is not None and args.tsv.exists():
            ap.error(f"--tsv: {args.tsv} exists (this script writes a new file only)")
        classify(args.classify, args.tsv)
        return 0
    try:
        index, count = (int(x) for x in args.shard.split("/"))
        assert 0 <= index < count
    except (ValueError, AssertionError):
        ap.error(f"--shard: expected I/N with 0 <= I < N, got {args.shard!r}")
    cases = grid(args.records, small=args.small, shard=(index, count))
    if args.case:
        cases = [c for c in cases if any(fnmatch.fnmatchcase(c[2].id, p) or fnmatch.fnmatchcase(c[1], p)
                                         for p in args.case)]  # fmt: skip
    if args.limit:
        cases = cases[: args.limit]
    if args.list:
        for label, base, case in cases:
            sch = schedule(case)
            verdict = "no window" if sch is None else json.dumps(sch.describe())
            print(f"{label:>14s} {case.id}  {verdict}")
        print(f"{len(cases)} cases")
        return 0
    backend = args.only or ("fa3-vllm" if args.device.startswith("cuda") else "sdpa-cpu")
    done = set()
    if args.out.exists():  # resume: a case recorded without an error is not run again
        for line in args.out.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a stop: its case runs again
            if "error" not in row and row.get("backend") == backend:
                done.add(row["case_id"])
    todo = [c for c in cases if c[2].id not in done]
    if len(todo) < len(cases):
        print(f"{len(cases) - len(todo)} cases already in {args.out}", flush=True)
    t0 = time.time()
    with args.out.open("a", encoding="utf-8") as fh:  # one line per case as it ends: a stopped run keeps its rows
        for label, base, case in todo:
            try:
                row = study(label, base, case, backend, args.device)
            except Exception as exc:  # keep going: each case is its own measurement
                row = {"label": label, "base": base, "case_id": case.id, "error": f"{type(exc).__name__}: {exc}"}
                print(f"{label:>14s} ERROR {row['error'][:200]} {case.id}", flush=True)
            else:
                print(_short(row), flush=True)
            fh.write(json.dumps(row, default=str) + "\n")
            fh.flush()
    print(f"{len(todo)} cases in {time.time() - t0:.0f} s -> {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
