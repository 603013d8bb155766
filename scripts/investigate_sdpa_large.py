"""Does torch SDPA's memory-efficient CUDA kernel fault on key/value tensors of 2**31 elements or more?

The models suite on an H100 (reports/h100-2026-11-25/models-h100.jsonl.gz) gave sdpa-cuda 'CUDA error: an illegal
memory access was encountered' on DeepSeek V2/V3 MLA absorbed decode at TP1: 128 query heads, one latent kv head
that the adapter repeats to 128 heads, head dim 64 + 512 = 576 (q_v concatenated), value dim 512, 32,768 keys:
128 x 32768 x 576 = 2.42e9 elements in K (> 2**31 = 2.15e9), while every case below 2**31 passed (Kimi K2's 64
heads, TP8 shards, 20,000-key spec decode).

Each configuration runs in a fresh process (a CUDA fault poisons the process): one ``scaled_dot_product_attention``
call under ``sdpa_kernel(EFFICIENT_ATTENTION)`` with q (1, H, 1, D), K (1, H, S, D), V (1, H, S, DV) in bf16, K
and V contiguous as the adapter passes them, and S on both sides of 2**31 / (H * D).  The independent computation
is the same attention in fp32 over head chunks small enough to stay far below 2**31 elements (plain matmul and
softmax, no fused kernel); the kernel's output is compared with it.

    python scripts/investigate_sdpa_large.py --out sdpa-large.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CONFIGS = [
    # (heads, keys, head dim, value dim, layout): K/V contiguous (B, H, S, D) ("bhsd"), or views of (B, S, H, D)
    # storage ("bshd", transposed as the adapter and most engines pass them: the key stride is H * D elements)
    (128, 29000, 576, 512, "bhsd"),
    (64, 32768, 576, 512, "bhsd"),
    (128, 29200, 576, 512, "bhsd"),
    (128, 32768, 576, 512, "bhsd"),
    (128, 32768, 128, 128, "bhsd"),  # a plain head dim: 0.54e9 elements, for contrast
    (256, 65536, 128, 128, "bhsd"),  # 2**31 elements exactly at d128
    (128, 29000, 576, 512, "bshd"),
    (64, 32768, 576, 512, "bshd"),
    (128, 29200, 576, 512, "bshd"),
    (128, 32768, 576, 512, "bshd"),
    (256, 65536, 128, 128, "bshd"),
    (128, 131072, 128, 128, "bshd"),
]


def one(h: int, s: int, d: int, dv: int, layout: str) -> dict:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    torch.manual_seed(0)
    dev = "cuda"
    q = torch.randn(1, h, 1, d, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, 1, s, d, device=dev, dtype=torch.bfloat16).repeat_interleave(h, dim=1)
    v = torch.randn(1, 1, s, dv, device=dev, dtype=torch.bfloat16).repeat_interleave(h, dim=1)
    if layout == "bshd":  # the same values, stored (B, S, H, D), passed as a transposed view
        k = k.transpose(1, 2).contiguous().transpose(1, 2)
        v = v.transpose(1, 2).contiguous().transpose(1, 2)
    scale = d**-0.5
    ref = torch.empty(h, dv, dtype=torch.float32, device=dev)
    for h0 in range(0, h, 8):  # independent: fp32 matmul + softmax per 8 heads
        qs = q[0, h0 : h0 + 8, 0].float()  # (8, d)
        ks = k[0, h0 : h0 + 8].float()  # (8, s, d)
        p = torch.softmax(torch.einsum("hd,hsd->hs", qs, ks) * scale, dim=-1)
        ref[h0 : h0 + 8] = torch.einsum("hs,hsd->hd", p, v[0, h0 : h0 + 8].float())
    torch.cuda.synchronize()
    out = {
        "heads": h,
        "keys": s,
        "head_dim": d,
        "head_dim_v": dv,
        "layout": layout,
        "k_elements": h * s * d,
        "over_2_31": h * s * d >= 2**31,
    }
    try:
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            o = sdpa(q, k, v, scale=scale)
        torch.cuda.synchronize()
        err = (o[0, :, 0].float() - ref).abs().max().item()
        out |= {"status": "ok", "max_abs_err_vs_fp32": err, "ref_max": ref.abs().max().item()}
    except Exception as exc:  # noqa: BLE001 - the fault is the finding
        out |= {"status": "error", "error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="sdpa-large.json")
    ap.add_argument("--one", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        h, s, d, dv, layout = args.one
        print(json.dumps(one(int(h), int(s), int(d), int(dv), layout)))
        return 0
    import torch

    rows = []
    for cfg in CONFIGS:
        p = subprocess.run(
            [sys.executable, __file__, "--one", *map(str, cfg)], capture_output=True, text=True, timeout=300
        )
        line = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
        crashed = {"config": cfg, "status": "crash", "stderr": p.stderr[-500:]}
        row = json.loads(line) if line.startswith("{") else crashed
        row["returncode"] = p.returncode
        print(row, flush=True)
        rows.append(row)
    meta = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "script": "scripts/investigate_sdpa_large.py",
    }
    with open(args.out, "w") as fh:
        json.dump({"meta": meta, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
