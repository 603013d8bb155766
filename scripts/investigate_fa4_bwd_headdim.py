"""Investigate fa4's backward on sm_90 by head dim (default suite's backward cases on the H100: dQ wrong at d40, d80,
d112 while dK and dV are right and fa2 / torch-flash pass the same cases).

    python scripts/investigate_fa4_bwd_headdim.py [--out F.json] [--head-dims 40,64,...] [--masks none,causal]

FA4 (``flash_attn.cute.flash_attn_varlen_func``) is called directly, not through the adapter, with autograd, on
one varlen batch (GQA 8/2, bf16, requests (q, kv) = (37, 37), (128, 300), (5, 77)) for head dims 32 to 256 in
steps of 8 (FA4 takes multiples of 8), with and without a causal mask.  dQ, dK, dV of ``sum(out * dout)`` are
compared with autograd through a float64 softmax written here (not attnref): the keys of request ``b`` seen by its
row ``i`` are ``j <= i + sk - sq`` when causal (bottom-right aligned), every key otherwise.  The same batch through
flash-attn 2's ``flash_attn_varlen_func`` is the second opinion where FA2 is installed.  Each result is the largest
absolute error of the tensor over its largest absolute reference value (a relative error: bf16 kernels land near
1e-2 at worst).
"""

from __future__ import annotations

import argparse
import json
import time

REQUESTS = ((37, 37), (128, 300), (5, 77))
H, HK = 8, 2
HEAD_DIMS = tuple(range(32, 257, 8))
MASKS = ("none", "causal")


def oracle_grads(q, k, v, dout, causal, scale):
    """fp64 autograd (dq, dk, dv) over the whole varlen batch; GQA by repeating kv heads."""
    import torch

    qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    outs, q0, k0 = [], 0, 0
    rep = H // HK
    for sq, sk in REQUESTS:
        qs, ks, vs = qd[q0 : q0 + sq], kd[k0 : k0 + sk], vd[k0 : k0 + sk]
        kr, vr = ks.repeat_interleave(rep, 1), vs.repeat_interleave(rep, 1)
        s = torch.einsum("ihd,jhd->hij", qs, kr) * scale
        if causal:
            i = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
            j = torch.arange(sk, device=q.device)[None, :]
            s = s.masked_fill(~(j <= i), float("-inf"))
        p = torch.softmax(s, -1).nan_to_num(0.0)
        outs.append(torch.einsum("hij,jhd->ihd", p, vr))
        q0, k0 = q0 + sq, k0 + sk
    out = torch.cat(outs)
    return torch.autograd.grad(out, (qd, kd, vd), dout.double())


def kernel_grads(fn, q, k, v, dout, cu_q, cu_k, causal):
    import torch

    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    res = fn(*leaves, cu_q, cu_k, causal)
    out = res[0] if isinstance(res, tuple) else res
    return torch.autograd.grad(out, leaves, dout)


def fa4(q, k, v, cu_q, cu_k, causal):
    from flash_attn.cute import flash_attn_varlen_func

    mq, mk = max(r[0] for r in REQUESTS), max(r[1] for r in REQUESTS)
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=mq, max_seqlen_k=mk, causal=causal
    )


def fa2(q, k, v, cu_q, cu_k, causal):
    from flash_attn import flash_attn_varlen_func

    mq, mk = max(r[0] for r in REQUESTS), max(r[1] for r in REQUESTS)
    return flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=causal)


def rel(got, ref) -> float:
    return float((got.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="investigate-fa4-bwd-headdim.json")
    ap.add_argument("--head-dims", default=",".join(map(str, HEAD_DIMS)), help="comma-separated (default 32..256 by 8)")
    ap.add_argument("--masks", default=",".join(MASKS), help="comma-separated of none, causal")
    args = ap.parse_args()
    head_dims = [int(x) for x in args.head_dims.split(",")]
    masks = args.masks.split(",")
    dev = "cuda"
    gen = torch.Generator(device="cpu").manual_seed(0)
    tq, tk = sum(r[0] for r in REQUESTS), sum(r[1] for r in REQUESTS)
    cu_q = torch.tensor([0, *torch.tensor([r[0] for r in REQUESTS]).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0, *torch.tensor([r[1] for r in REQUESTS]).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    rows = []
    for d in head_dims:
        q = torch.randn(tq, H, d, generator=gen).to(dev, torch.bfloat16)
        k = torch.randn(tk, HK, d, generator=gen).to(dev, torch.bfloat16)
        v = torch.randn(tk, HK, d, generator=gen).to(dev, torch.bfloat16)
        dout = torch.randn(tq, H, d, generator=gen).to(dev, torch.bfloat16)
        for mask in masks:
            causal = mask == "causal"
            ref = oracle_grads(q, k, v, dout, causal, d**-0.5)
            row = {"head_dim": d, "mask": mask}
            for name, fn in (("fa4", fa4), ("fa2", fa2)):
                try:
                    got = kernel_grads(fn, q, k, v, dout, cu_q, cu_k, causal)
                    row[name] = {t: rel(g, r) for t, g, r in zip(("dq", "dk", "dv"), got, ref)}
                except Exception as exc:  # a refusal or a compile error is a result too
                    row[name] = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"}
            rows.append(row)
            print(json.dumps(row), flush=True)
    from importlib import metadata

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "flash-attn-4": version("flash-attn-4"),
        "flash-attn": version("flash-attn"),
        "requests": REQUESTS,
        "heads": [H, HK],
        "measure": "max|g - g_fp64| / max|g_fp64| per tensor",
    }
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
