"""Triage of two backward classes a random GPU run failed (issue 31 item 5): FA2's fp16 backward with a soft-cap of
50 on ``peaked`` data (dK mean error 2-6x its bound) and sdpa-cuda's backward at head dim 224 with ALiBi on
``outliers`` data (dQ error ratio 1.43).

    python scripts/investigate_bwd_triage.py [--device cuda] [--out F.json] [--seeds 0,1,...]
        [--only fa2|sdpa-cuda|sdpa-cuda-wide|sdpa-cpu] [--grid-softcap]

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

Soft-capped cases also get ``status_old_baseline`` (the verdict with the baseline before the soft-capped fp16 one:
``softcap_arg_dtype`` patched to None) beside ``status`` (today's), and ``dk_rounding_variants`` includes
``fp16_arg`` (today's baseline model: the tanh's argument formed in fp16) and, on CUDA, ``tanh_approx`` (the tanh
evaluated by ``tanh.approx.f32``, FA2's ``cutlass::fast_tanh``, through torch's jiterator or Triton: the kernel's
own tanh in the harness's model); the output's ``tanh_approx_error`` is that instruction's error against float64
tanh over a grid of arguments.  ``sdpa-cuda-wide`` draws the sdpa-cuda class (d224, ALiBi, ``outliers``) over
more head layouts and lengths; ``--seeds`` repeats every case with other input seeds.  An SDPA row's ``variant`` is
the SDPA backend torch's dispatcher picks for the case's calls (``attnfast.sdpa.sdpa_choices``: the forward's plan,
whose op's backward the training call runs).  ``scripts/investigate_sdpa_alibi_bias.py`` reads the output on CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

GRID: dict[str, list[dict[str, Any]]] = {
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
#: the sdpa-cuda class over other head layouts (MQA, MHA, wider GQA) and lengths (decode-like, long keys, one long)
GRID["sdpa-cuda-wide"] = [
    dict(dtype=dt, alibi=True, data="outliers", head_dim=224, causal=c, backward=True, requests=r, **heads)
    for dt in ("bf16", "fp16")
    for c in (False, True)
    for heads in (
        dict(num_heads=8, num_kv_heads=1),
        dict(num_heads=4, num_kv_heads=4),
        dict(num_heads=16, num_kv_heads=2),
    )
    for r in (((1, 300), (300, 300)), ((257, 1031),), ((64, 2048), (3, 17)))
]
REQUESTS = ((128, 128), (77, 200), (5, 64))
HEADS = dict(num_heads=4, num_kv_heads=2)


def grid_case(fields: dict):
    """The case of one grid entry (``requests`` and the heads default to :data:`REQUESTS` and :data:`HEADS`)."""
    from conformance.cases.case import AttentionCase

    f = dict(fields)
    requests = f.pop("requests", REQUESTS)
    heads = {k: f.pop(k, v) for k, v in HEADS.items()}
    return AttentionCase(requests, **heads, **f)


_TANH_APPROX: list = []


def tanh_approx(x):
    """``tanh.approx.f32`` of a float32 CUDA tensor (FA2's ``cutlass::fast_tanh`` on sm_75+), through torch's
    jiterator (NVRTC) or else Triton; raises RuntimeError when neither builds."""
    import torch

    if not _TANH_APPROX:
        errors = []
        try:
            code = (
                "template <typename T> T tanh_approx(T x) { float y; "
                'asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"((float)x)); return y; }'
            )
            fn = torch.cuda.jiterator._create_jit_fn(code)
            fn(torch.zeros(1, device="cuda"))
            _TANH_APPROX.append(fn)
        except Exception as jit_error:  # noqa: BLE001 - report why, try Triton
            errors.append(f"jiterator: {type(jit_error).__name__}: {str(jit_error)[:200]}")
        if not _TANH_APPROX:
            try:
                import triton  # type: ignore[import-not-found,unused-ignore]
                import triton.language as tl  # type: ignore[import-not-found,unused-ignore]

                @triton.jit
                def _k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
                    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
                    m = offs < n
                    xv = tl.load(x_ptr + offs, mask=m)
                    yv = tl.inline_asm_elementwise(
                        "tanh.approx.f32 $0, $1;", "=f,f", [xv], dtype=tl.float32, is_pure=True, pack=1
                    )
                    tl.store(y_ptr + offs, yv, mask=m)

                def fn(t):
                    t = t.contiguous()
                    y = torch.empty_like(t)
                    _k[(triton.cdiv(t.numel(), 1024),)](t, y, t.numel(), BLOCK=1024)
                    return y

                fn(torch.zeros(1, device="cuda"))
                _TANH_APPROX.append(fn)
            except Exception as triton_error:  # noqa: BLE001
                errors.append(f"triton: {type(triton_error).__name__}: {str(triton_error)[:200]}")
        if not _TANH_APPROX:
            _TANH_APPROX.append("; ".join(errors))  # built once: the failure is kept, not retried per case
    if isinstance(_TANH_APPROX[0], str):
        raise RuntimeError(_TANH_APPROX[0])
    return _TANH_APPROX[0](x.float().contiguous())


def tanh_approx_error(device: str) -> dict:
    """|tanh.approx.f32(x) - tanh(x)| (float64 tanh of the same float32 x) over x in [-12, 12], by |x| band."""
    import torch

    if not device.startswith("cuda"):
        return {"skipped": "needs CUDA"}
    try:
        x = torch.linspace(-12.0, 12.0, 2_000_001, device=device, dtype=torch.float32)
        t = tanh_approx(x).double()
    except RuntimeError as e:
        return {"unavailable": str(e)}
    exact = torch.tanh(x.double())
    err = (t - exact).abs()
    out = {}
    for lo, hi in ((0, 0.25), (0.25, 1), (1, 2), (2, 4), (4, 8), (8, 12.1)):
        m = (x.abs() >= lo) & (x.abs() < hi)
        ae, rel = err[m], (err[m] / exact[m].abs().clamp_min(1e-30))
        sat = (ae / (1 - exact[m].abs()).clamp_min(1e-30)).mean()  # relative to the distance from saturation
        out[f"|x| {lo}-{hi}"] = {"abs_max": float(ae.max()), "abs_mean": float(ae.mean()), "rel_max": float(rel.max()),
                                 "one_minus_t_rel_mean": float(sat)}  # fmt: skip
    return out


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
ROUNDINGS = ("baseline", "scores", "tanh", "dtanh", "dp", "p_before_ds", "fp16_arg", "tanh_approx")


def rounding_variants(case, inputs, r64):
    """dK's mean and max |x - fp64| of the explicit soft-capped backward in float32 with P and dS rounded to the case
    dtype (the harness's baseline model) plus one more rounding each: the scores before tanh, tanh, the derivative
    ``1 - tanh^2``, dP, P before it forms dS; ``fp16_arg``: the scores and ``s / cap`` rounded to fp16 (today's
    baseline); ``tanh_approx`` (CUDA): the tanh by ``tanh.approx.f32`` of ``(q.k) * (scale / cap)`` as FA2 forms it.
    The one that matches the kernel's error says where it rounds."""
    import torch

    dt, f32 = case.torch_dtype, torch.float32
    rnd = lambda x, on: x.to(dt).to(f32) if on else x  # noqa: E731
    scale = case.scale if case.scale is not None else case.head_dim**-0.5
    rep = case.num_heads // case.num_kv_heads
    out = {}
    for where in ROUNDINGS:
        if where == "tanh_approx":
            if not inputs.q.is_cuda:
                continue
            try:
                tanh_approx(inputs.q.new_zeros(1, dtype=f32))
            except RuntimeError as e:
                out[where] = {"unavailable": str(e)}
                continue
        dk_parts, q0, k0 = [], 0, 0
        for sq, sk in case.requests:
            q = inputs.q[q0 : q0 + sq].to(f32)
            k = inputs.k[k0 : k0 + sk].to(f32).repeat_interleave(rep, 1)
            v = inputs.v[k0 : k0 + sk].to(f32).repeat_interleave(rep, 1)
            do = inputs.dout[q0 : q0 + sq].to(f32)
            qk = torch.einsum("ihd,jhd->hij", q, k)
            s = (qk * scale).half().float() if where == "fp16_arg" else rnd(qk * scale, where == "scores")
            t = None
            if case.softcap and where == "tanh_approx":
                t = tanh_approx(qk * torch.tensor(scale / case.softcap, dtype=f32))
            elif case.softcap and where == "fp16_arg":
                t = torch.tanh((s / case.softcap).half().float())
            elif case.softcap:
                t = rnd(torch.tanh(s / case.softcap), where == "tanh")
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


def _old_baseline_verdict(ctx, backend) -> dict:
    """The verdict with the baseline before the soft-capped fp16 one (the tanh argument in fp32)."""
    import conformance.backward.gradients as grad_mod
    from conformance.verdict.check import check_backend

    saved = grad_mod.softcap_arg_dtype
    grad_mod._CACHE.clear()
    grad_mod.softcap_arg_dtype = lambda case: None
    try:
        r = check_backend(ctx, backend)
    finally:
        grad_mod.softcap_arg_dtype = saved
        grad_mod._CACHE.clear()
    dk = ((r.extra.get("backward") or {}).get("tensors") or {}).get("dk") or {}
    return {"status": r.status.value, "reason": r.reason[:300], "dk_mean": dk.get("mean_abs"),
            "dk_baseline_mean": dk.get("baseline_mean_abs")}  # fmt: skip


def triage(backend_name: str, device: str, seeds: list[int]) -> list[dict]:
    import torch

    from attnfast.registry import get_backend
    from conformance.backward.gradients import gradients
    from conformance.verdict.check import check_backend, prepare_context

    backend = get_backend(backend_name.removesuffix("-wide"))
    rows = []
    for fields, seed in ((f, sd) for f in GRID[backend_name] for sd in seeds):
        case = grid_case(fields)
        ctx = prepare_context(case, seed, device)
        record = check_backend(ctx, backend)
        row = {"backend": backend.name, "case_id": case.id, "seed": seed, "status": record.status.value,
               "reason": record.reason[:300], "backward": record.extra.get("backward")}  # fmt: skip
        if backend.name.startswith("sdpa") and record.status.value in ("pass", "fail"):
            # which SDPA kernel ran: the forward's plan of the same calls (the backward runs that op's backward)
            row["variant"] = getattr(backend.prepare(case, ctx.inputs), "variant", None)
        if case.softcap is not None and record.status.value in ("pass", "fail"):
            row["status_old_baseline"] = _old_baseline_verdict(ctx, backend)
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
    ap.add_argument("--seeds", default="0", help="comma-separated input seeds, each case run with each")
    args = ap.parse_args()
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    names = args.only or (["fa2", "sdpa-cuda"] if args.device.startswith("cuda") else ["sdpa-cpu"])
    t0 = time.time()
    out: dict[str, Any] = {"device": args.device, "requests": REQUESTS, "heads": HEADS, "seeds": seeds,
           "tanh_approx_error": tanh_approx_error(args.device), "rows": []}  # fmt: skip
    for name in names:
        if args.grid_softcap:
            GRID[name] = [f for f in GRID[name] if f.get("softcap")]
        out["rows"] += triage(name, args.device, seeds)
    out["seconds"] = round(time.time() - t0, 1)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, default=str)
    for r in out["rows"]:  # the summary: today's verdict beside the old baseline's, the dK mean against its bound
        t = ((r.get("backward") or {}).get("tensors") or {}).get("dk") or {}
        old = r.get("status_old_baseline", {}).get("status", "")
        bound = 2 * t.get("baseline_mean_abs", math.nan) + (2**-14 if "fp16" in r["case_id"] else 2**-11)
        print(f"{r['status']:5} (old baseline: {old or '-':5}) seed {r['seed']} {r['case_id']}: dK mean "
              f"{t.get('mean_abs', math.nan):.2e} bound {bound:.2e}; worst ratio "
              f"{(r.get('backward') or {}).get('worst_ratio', math.nan):.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
