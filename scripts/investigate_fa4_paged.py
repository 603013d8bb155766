"""Investigate fa4's paged-KV failures on sm_90 (default suite on the H100: d80/d96/d160 paged cases).

    python scripts/investigate_fa4_paged.py [--out F.json] [--jobs N]

FA4 (``flash_attn.cute.flash_attn_varlen_func``) is called directly, not through the adapter, on one
batch (GQA 8/2, bf16, requests (q, kv) = (128, 300), (1, 77), (4, 1024)) for every head dim, three
masks (none, causal, symmetric window (32, 32)) and three ways of holding K/V:

* ``contig``: packed K/V with ``cu_seqlens_k`` (no page table);
* ``tma``: a paged cache whose page size is FA4's own sm_90 ``tile_n`` for that head dim and mask
  (``_tile_size_fwd_sm90``), which FA4 reads with TMA;
* ``nontma``: pages of 16, 64 and 256 (any page size other than ``tile_n``): FA4's non-TMA loader.

Every output and LSE is compared with a float64 softmax written here (not attnref): the keys of request
``b`` seen by its row ``i`` are ``j <= i + sk - sq`` when causal and ``|j - (i + sk - sq)| <= 32`` with
the window, bottom-right aligned.  Each (head dim, mask, holding) runs in a fresh process, so a CUDA
error (an illegal memory access poisons the context) is recorded and does not touch the others.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor

REQUESTS = ((128, 300), (1, 77), (4, 1024))
H, HK = 8, 2
HEAD_DIMS = (64, 80, 96, 112, 128, 160, 192, 256)
MASKS = ("none", "causal", "window32")
KINDS = ("contig", "tma", "nontma")
NONTMA_PAGES = (16, 64, 256)


def oracle(q, k, v, sq, sk, mask, scale):
    """fp64 (out (sq, h, d), lse (h, sq)) of one request, GQA by repeating kv heads."""
    import torch

    rep = q.shape[1] // k.shape[1]
    qd, kd, vd = q.double(), k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1)
    s = torch.einsum("ihd,jhd->hij", qd, kd) * scale
    i = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=q.device)[None, :]
    vis = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if mask == "causal":
        vis = j <= i
    elif mask == "window32":
        vis = (j >= i - 32) & (j <= i + 32)
    s = s.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return torch.einsum("hij,jhd->ihd", p, vd), lse


def page(k, v, sks, page_size):
    """Paged caches (num_pages, page_size, hk, d) in shuffled page order, block table, seqused_k."""
    import torch

    g = torch.Generator().manual_seed(1)
    need = [-(-n // page_size) for n in sks]
    total = sum(need) + 3
    order = torch.randperm(total, generator=g).tolist()
    kc = torch.full((total, page_size, *k.shape[1:]), 1e3, dtype=k.dtype, device=k.device)  # finite stale
    vc = torch.full((total, page_size, *v.shape[1:]), 1e3, dtype=v.dtype, device=v.device)
    table = torch.zeros(len(sks), max(need), dtype=torch.int32, device=k.device)
    start, used = 0, 0
    for b, n in enumerate(sks):
        for p in range(need[b]):
            blk = order[used]
            used += 1
            table[b, p] = blk
            lo, hi = start + p * page_size, min(start + (p + 1) * page_size, start + n)
            kc[blk, : hi - lo] = k[lo:hi]
            vc[blk, : hi - lo] = v[lo:hi]
        start += n
    return kc, vc, table, torch.tensor(sks, dtype=torch.int32, device=k.device)


def run_one(d: int, mask: str, kind: str) -> list[dict]:
    import torch
    from flash_attn.cute import flash_attn_varlen_func
    from flash_attn.cute.interface import _tile_size_fwd_sm90

    causal = mask == "causal"
    window = (32, 32) if mask == "window32" else (None, None)
    tile_n = _tile_size_fwd_sm90(d, d, causal, mask == "window32").n_block_size
    torch.manual_seed(0)
    sqs, sks = [r[0] for r in REQUESTS], [r[1] for r in REQUESTS]
    q = torch.randn(sum(sqs), H, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(sks), HK, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(sum(sks), HK, d, device="cuda", dtype=torch.bfloat16)
    cu_q = torch.tensor([0, *torch.tensor(sqs).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *torch.tensor(sks).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    scale = d**-0.5
    refs, qo, ko = [], 0, 0
    for sq, sk in REQUESTS:
        refs.append(oracle(q[qo : qo + sq], k[ko : ko + sk], v[ko : ko + sk], sq, sk, mask, scale))
        qo, ko = qo + sq, ko + sk
    pages = {"contig": [None], "tma": [tile_n], "nontma": [p for p in NONTMA_PAGES if p != tile_n]}[kind]
    rows = []
    for page_size in pages:
        rec = {"d": d, "mask": mask, "kind": kind, "page_size": page_size, "tile_n": tile_n}
        common = dict(q=q, cu_seqlens_q=cu_q, max_seqlen_q=max(sqs), softmax_scale=scale, causal=causal,
                      window_size=window, return_lse=True)  # fmt: skip
        try:
            if page_size is None:
                out, lse = flash_attn_varlen_func(k=k, v=v, cu_seqlens_k=cu_k, max_seqlen_k=max(sks), **common)[:2]
            else:
                kc, vc, table, used = page(k, v, sks, page_size)
                out, lse = flash_attn_varlen_func(k=kc, v=vc, page_table=table, seqused_k=used, **common)[:2]
            torch.cuda.synchronize()
            err_out, err_lse, qo = 0.0, 0.0, 0
            for (sq, _), (ro, rl) in zip(REQUESTS, refs):
                err_out = max(err_out, float((out[qo : qo + sq].double() - ro).abs().max()))
                got_lse = lse[:, qo : qo + sq].double()
                fin = torch.isfinite(rl)
                err_lse = max(err_lse, float((got_lse[fin] - rl[fin]).abs().max()) if fin.any() else 0.0)
                qo += sq
            rec.update(status="ok", max_abs_err_out=err_out, max_abs_err_lse=err_lse)
        except Exception as exc:  # noqa: BLE001 - the measurement is the exception
            rec.update(status="error", error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            rows.append(rec)
            if "CUDA" in rec["error"] or "Accelerator" in rec["error"]:
                break  # the context is poisoned; later pages of this process would all fail
            continue
        rows.append(rec)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="investigate-fa4-paged.json")
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--wrong-above", type=float, default=0.05, help="bf16 output error called wrong")
    args = ap.parse_args()
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    t0 = time.perf_counter()
    tasks = [(d, m, k) for d in HEAD_DIMS for m in MASKS for k in KINDS]
    ctx = multiprocessing.get_context("spawn")
    results: list[dict] = []
    with ProcessPoolExecutor(args.jobs, mp_context=ctx, max_tasks_per_child=1) as pool:
        futs = {pool.submit(run_one, *t): t for t in tasks}
        for fut, t in futs.items():
            try:
                rows = fut.result(timeout=600)
            except Exception as exc:  # noqa: BLE001 - a process that died is a result too
                rows = [{"d": t[0], "mask": t[1], "kind": t[2], "status": "died", "error": repr(exc)[:200]}]
            for r in rows:
                if r["status"] == "ok":
                    r["verdict"] = "wrong" if r["max_abs_err_out"] > args.wrong_above else "right"
                else:
                    r["verdict"] = r["status"]
                print(json.dumps(r), flush=True)
            results.extend(rows)
    summary: dict[str, list] = {}
    for r in results:
        summary.setdefault(r["verdict"], []).append(f"d{r['d']} {r['mask']} {r['kind']} page {r.get('page_size')} "
                                                    f"(tile_n {r.get('tile_n')})")  # fmt: skip
    doc = {
        "what": __doc__.strip().splitlines()[0],
        "batch": {"requests": REQUESTS, "heads": H, "kv_heads": HK, "dtype": "bf16"},
        "wrong_above": args.wrong_above,
        "seconds": round(time.perf_counter() - t0, 1),
        "summary": summary,
        "results": results,
    }
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=1)
    for verdict, items in summary.items():
        print(verdict, len(items), *items[:40], sep="\n  ")


if __name__ == "__main__":
    main()
