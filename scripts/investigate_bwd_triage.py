"""Triage of two backward classes a random GPU run failed (issue 31 item 5): FA2's fp16 backward with a soft-cap of
50 on ``peaked`` data (dK mean error 2-6x its bound) and sdpa-cuda's backward at head dim 224 with ALiBi on
``outliers`` data (dQ error ratio 1.43).

    python scripts/investigate_bwd_triage.py [--device cuda] [--out F.json] [--only fa2|sdpa-cuda|sdpa-cpu]

For each case of a small grid around the two classes the harness's verdict runs as usual (``check_backend``: the
record's status and gradient ratios), and the same case is then recomputed outside the harness: the kernel's
gradients (its adapter's ``prepare_backward``) are compared with an independent float64 autograd of the explicit
formula written here (soft-cap ``cap * tanh(s / cap)``, ALiBi ``-slope * |i + sk - sq - j|``, bottom-right causal),
beside three other computations against the same float64 gradients: the harness's reference (float32), its
same-precision baseline, and a PyTorch backward in the case dtype (the formula in fp16/bf16 under autograd:
flash-attention's ``attention_ref(upcast=False)``, the ``dq_pt`` of its tests).  Printed and written per case and
gradient: max and mean |x - fp64| of each, and flash-attention's own test rule on the kernel
(``max|g - ref| <= rtol * max|pt - ref| + atol``, rtol 3 with a soft-cap else 2, atol ``2 * rounding noise``
(+ 3e-4 with a soft-cap): ``tests/test_flash_attn.py`` / ``hopper/test_flash_attn.py``).

A kernel within the fp64 distance of the PyTorch same-precision backward is as right as its dtype allows (a
verdict to fix); one well beyond it, where the harness's float32 reference agrees with float64, is a kernel defect.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

GRID = {
    "fa2": [
        dict(dtype="fp16", softcap=50.0, data="peaked", head_dim=d, causal=c, backward=True)
        for d in (64, 128)
        for c in (False, True)
    ]
    + [dict(dtype="bf16", softcap=50.0, data="peaked", head_dim=128, causal=True, backward=True)]
    + [dict(dtype="fp16", softcap=None, data="peaked", head_dim=128, causal=True, backward=True)],
    "sdpa-cuda": [
        dict(dtype=dt, alibi=True, data="outliers", head_dim=224, causal=c, backward=True)
        for dt in ("bf16", "fp16")
        for c in (False, True)
    ]
    + [dict(dtype="bf16", alibi=False, data="outliers", head_dim=224, causal=True, backward=True)],
}
GRID["sdpa-cpu"] = GRID["sdpa-cuda"]  # a CPU smoke run of this script
REQUESTS = ((128, 128), (77, 200), (5, 64))
HEADS = dict(num_heads=4, num_kv_heads=2)


def explicit_grads(case, inputs, dtype):
    """(dq, dk, dv) of ``sum(out * dout)`` by autograd through the formula, every op in ``dtype``."""
    import torch

    from conformance.cases.inputs import alibi_slopes

    q, k, v, dout = (
        t.detach().to(dtype).requires_grad_(t is not inputs.dout) for t in (inputs.q, inputs.k, inputs.v, inputs.dout)
    )
    scale = case.scale if case.scale is not None else case.head_dim**-0.5
    rep = case.num_heads // case.num_kv_heads
    slopes = alibi_slopes(case.num_heads).to(q.device, dtype) if case.alibi else None
    loss, q0, k0 = 0, 0, 0
    for sq, sk in case.requests:
        qs, ks, vs, ds = q[q0 : q0 + sq], k[k0 : k0 + sk], v[k0 : k0 + sk], dout[q0 : q0 + sq]
        kr, vr = ks.repeat_interleave(rep, 1), vs.repeat_interleave(rep, 1)
        s = torch.einsum("ihd,jhd->hij", qs, kr) * scale
        if case.softcap:
            s = case.softcap * torch.tanh(s / case.softcap)
        i = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
        j = torch.arange(sk, device=q.device)[None, :]
        if slopes is not None:
            s = s - slopes[:, None, None] * (i - j).abs().to(dtype)
        if case.causal:
            s = s.masked_fill(j > i, -math.inf)
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        o = torch.einsum("hij,jhd->ihd", p, vr)
        loss = loss + (o * ds).sum()
        q0, k0 = q0 + sq, k0 + sk
    loss.backward()
    return q.grad, k.grad, v.grad


#: where a low-precision soft-capped backward may round, for ``rounding_variants`` (each on top of the baseline's
#: P and dS rounded before their matmuls)
ROUNDINGS = ("baseline", "scores", "tanh", "dtanh", "dp", "p_before_ds")


def rounding_variants(case, inputs, r64):
    """dK's mean and max |x - fp64| of the explicit soft-capped backward in float32 with P and dS rounded to the case
    dtype (the harness's baseline model) plus one more rounding each: the scores before tanh, tanh, the derivative
    ``1 - tanh^2``, dP, P before it forms dS.  The one that matches the kernel's error says where it rounds."""
    import torch

    dt, f32 = case.torch_dtype, torch.float32
    rnd = lambda x, on: x.to(dt).to(f32) if on else x  # noqa: E731
    scale = case.scale if case.scale is not None else case.head_dim**-0.5
    rep = case.num_heads // case.num_kv_heads
    out = {}
    for where in ROUNDINGS:
        dk_parts, q0, k0 = [], 0, 0
        for sq, sk in case.requests:
            q = inputs.q[q0 : q0 + sq].to(f32)
            k = inputs.k[k0 : k0 + sk].to(f32).repeat_interleave(rep, 1)
            v = inputs.v[k0 : k0 + sk].to(f32).repeat_interleave(rep, 1)
            do = inputs.dout[q0 : q0 + sq].to(f32)
            s = rnd(torch.einsum("ihd,jhd->hij", q, k) * scale, where == "scores")
            t = rnd(torch.tanh(s / case.softcap), where == "tanh") if case.softcap else None
            sc = t * case.softcap if case.softcap else s
            i = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
            j = torch.arange(sk, device=q.device)[None, :]
            if case.causal:
                sc = sc.masked_fill(j > i, -math.inf)
            p = torch.softmax(sc, dim=-1).nan_to_num(0.0)
            o = torch.einsum("hij,jhd->ihd", p, v)
            delta = (do * o).sum(-1).transpose(0, 1)[:, :, None]  # (h, sq, 1)
            dp = rnd(torch.einsum("ihd,jhd->hij", do, v), where == "dp")
            ds = rnd(p, where == "p_before_ds") * (dp - delta)
            if case.softcap:
                ds = ds * rnd(1.0 - t * t, where == "dtanh")
            ds = rnd(ds, True)
            dk = torch.einsum("hij,ihd->jhd", ds, q) * scale  # (sk, h, d): sum the group below
            dk_parts.append(dk.reshape(sk, case.num_kv_heads, rep, -1).sum(2))
            q0, k0 = q0 + sq, k0 + sk
        dk = torch.cat(dk_parts).to(dt)
        out[where] = _errs(dk, r64[1])
    return out


def _errs(x, ref):
    d = (x.double() - ref).abs()
    return {"max": float(d.max()), "mean": float(d.mean())}


def triage(backend_name: str, device: str) -> list[dict]:
    import torch

    from attnfast.registry import get_backend
    from conformance.backward.gradients import gradients
    from conformance.cases.case import AttentionCase
    from conformance.verdict.check import check_backend, prepare_context

    backend = get_backend(backend_name)
    rows = []
    for fields in GRID[backend_name]:
        case = AttentionCase(REQUESTS, **HEADS, **fields)
        ctx = prepare_context(case, 0, device)
        record = check_backend(ctx, backend)
        row = {"backend": backend_name, "case_id": case.id, "status": record.status.value,
               "reason": record.reason[:300], "backward": record.extra.get("backward")}  # fmt: skip
        if record.status.value in ("pass", "fail"):
            inputs = ctx.inputs
            kern = backend.prepare_backward(case, inputs)()
            r64 = explicit_grads(case, inputs, torch.float64)
            low = explicit_grads(case, inputs, case.torch_dtype)
            harness = gradients(case, inputs)
            for n, idx in (("dq", 0), ("dk", 1), ("dv", 2)):
                ref = r64[idx]
                g = {"kernel": getattr(kern, n), "reference_fp32": getattr(harness.ref, n),
                     "baseline": getattr(harness.base, n), "torch_same_precision": low[idx]}  # fmt: skip
                errs = {k: _errs(x, ref) for k, x in g.items() if x is not None}
                noise = float(((ref.to(case.torch_dtype).double() + 0.3 - 0.3) - ref.to(case.torch_dtype).double())
                              .abs().max())  # fmt: skip
                rtol, atol = (3.0, 2 * noise + 3e-4) if case.softcap else (2.0, 2 * noise)
                bound = rtol * errs["torch_same_precision"]["max"] + atol
                errs["flash_attn_rule"] = {"bound": bound, "kernel_within": errs["kernel"]["max"] <= bound}
                row[n] = errs
            if case.softcap:
                row["dk_rounding_variants"] = rounding_variants(case, inputs, r64)
        rows.append(row)
        print(json.dumps(row, default=str)[:900], flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="investigate-bwd-triage.json")
    ap.add_argument("--only", choices=sorted(GRID), action="append")
    ap.add_argument("--grid-softcap", action="store_true", help="only the soft-capped cases (with their variants)")
    args = ap.parse_args()
    names = args.only or (["fa2", "sdpa-cuda"] if args.device.startswith("cuda") else ["sdpa-cpu"])
    t0 = time.time()
    out = {"device": args.device, "requests": REQUESTS, "heads": HEADS, "rows": []}
    for name in names:
        if args.grid_softcap:
            GRID[name] = [f for f in GRID[name] if f.get("softcap")]
        out["rows"] += triage(name, args.device)
    out["seconds"] = round(time.time() - t0, 1)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
