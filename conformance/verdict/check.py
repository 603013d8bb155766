"""The numerical verdict on one (case, backend): run the kernel once, compare, return a CheckResult.

:func:`prepare_context` builds what every backend of one case shares (inputs, the fp32 reference,
the same-dtype baseline) once; :func:`check_backend` then judges one backend against it with the
tolerance model of :mod:`conformance.verdict.tolerance`.  Each backend gets fresh clones of the input
tensors, because kernels write into them (a kvcache append writes new keys into the cache) and one
backend must not see another's writes.

Failure text has one fixed shape per sub-check, ``"<check>: <what> at <where> > allowed <bound>
(<how the bound is made>)"``, several joined by ``" | "``; the record's ``repro`` field holds the
one-line command that reruns exactly this (case, backend, device, seed).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from attnfast.base import Backend, KernelOutput
from attnref import AttnResult

from conformance.verdict.baseline import baseline
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs, make_inputs
from conformance.records import CheckResult, ErrorStats, Status, Timing
from conformance.verdict.reference import reference
from conformance.verdict.tolerance import Tolerance, resolve

__all__ = ["CaseContext", "check_backend", "compare", "prepare_context", "repro_command"]

#: Fixed order of the sub-checks in ``failed_checks`` and in the failure text.
CHECKS = ("nonfinite", "max_error", "mean_error", "cosine", "lse", "masked_rows")


@dataclass
class CaseContext:
    """Everything the backends of one case share.  ``ref_s``: seconds for inputs + reference + baseline.

    ``ref_charged`` becomes True once a record has counted ``ref_s`` in its ``harness_s``, so the
    harness time summed over a case's records counts the reference once.
    """

    case: AttentionCase
    seed: int
    device: str
    inputs: CaseInputs
    ref: AttnResult
    base: tuple[torch.Tensor, torch.Tensor]
    ref_s: float
    ref_charged: bool = False


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def prepare_context(case: AttentionCase, seed: int = 0, device: str = "cpu") -> CaseContext:
    """Inputs, reference and baseline of ``case`` on ``device``, computed once for every backend.

    For an engine replay (``case.engine``) the reference and baseline are the engine's whole layer
    (:meth:`conformance.engines.base.Engine.reference`)."""
    t0 = time.perf_counter()
    inputs = make_inputs(case, seed, device)
    if case.engine:
        from conformance.engines import get_engine

        engine = get_engine(case.engine)
        ref, base = engine.reference(case, inputs), engine.baseline(case, inputs)
    else:
        ref, base = reference(case, inputs), baseline(case, inputs)
    _sync(device)
    return CaseContext(case, seed, device, inputs, ref, base, time.perf_counter() - t0)


def repro_command(case: AttentionCase, backend_name: str, device: str, seed: int) -> str:
    """One shell line that reruns this (case, backend) alone."""
    case_json = json.dumps(case.to_json(), separators=(",", ":"), sort_keys=True)
    return (
        f"attnconf run --backend {shlex.quote(backend_name)} --device {shlex.quote(device)} "
        f"--seed {seed} --case-json {shlex.quote(case_json)}"
    )


def _fresh_inputs(inputs: CaseInputs) -> CaseInputs:
    """A copy whose tensors are clones: whatever the kernel writes stays in its own copy."""
    changes: dict[str, Any] = {k: v.clone() for k, v in vars(inputs).items() if isinstance(v, torch.Tensor)}
    if inputs.quant is not None:
        quant = {k: v.clone() for k, v in vars(inputs.quant).items() if isinstance(v, torch.Tensor)}
        changes["quant"] = dataclasses.replace(inputs.quant, **quant)
    return dataclasses.replace(inputs, **changes)


def _exc_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def check_backend(
    ctx: CaseContext,
    backend: Backend,
    *,
    overrides: Sequence[Mapping[str, Any]] = (),
    timer: Callable[[Callable[[], KernelOutput]], Timing] | None = None,
) -> CheckResult:
    """Judge ``backend`` on the context's case: UNSUPPORTED, ERROR, FAIL or PASS (with timing if ``timer``).

    ``kernel_s`` is the one verified kernel call (first-call compilation included); ``harness_s`` is
    everything else (support check, preparation, comparison, and the context's ``ref_s`` the first
    time the context is used); benchmarking time goes to ``extra["bench_s"]``.
    """
    t_start = time.perf_counter()
    case = ctx.case
    ref_share = 0.0 if ctx.ref_charged else ctx.ref_s
    ctx.ref_charged = True
    clock = {"kernel": 0.0, "bench": 0.0}
    extra: dict[str, Any] = {}
    try:
        version = backend.version()
    except Exception as exc:  # a broken version probe must not hide the verdict
        version = f"unknown ({_exc_line(exc)})"

    def finish(
        status: Status, reason: str = "", stats: ErrorStats | None = None, timing: Timing | None = None
    ) -> CheckResult:
        elapsed = time.perf_counter() - t_start + ref_share
        return CheckResult(
            case_id=case.id,
            backend=backend.name,
            family=backend.family,
            status=status,
            case=case.to_json(),
            reason=reason,
            version=version,
            device=ctx.device,
            seed=ctx.seed,
            stats=stats,
            timing=timing,
            repro=repro_command(case, backend.name, ctx.device, ctx.seed),
            elapsed_s=elapsed,
            kernel_s=clock["kernel"],
            harness_s=elapsed - clock["kernel"] - clock["bench"],
            extra=extra,
        )

    engine = None
    if case.engine:
        from conformance.engines import get_engine

        engine = get_engine(case.engine)
        extra["engine"] = {"engine": case.engine, "scenario": case.scenario, "seed": engine.seed}
    try:
        support = backend.supports(case, ctx.device) if engine is None else engine.supports(case, backend, ctx.device)
    except Exception as exc:
        return finish(Status.ERROR, f"supports() raised {_exc_line(exc)}")
    if not support:
        return finish(Status.UNSUPPORTED, support.reason or "refused without a reason")
    tol = resolve(case, backend.name, overrides)
    extra["tolerance"] = tol.fields()
    try:
        inputs = _fresh_inputs(ctx.inputs)
        fn = backend.prepare(case, inputs) if engine is None else engine.prepare(case, inputs, backend, ctx.device)
        t0 = time.perf_counter()
        result = fn()
        _sync(ctx.device)
        clock["kernel"] = time.perf_counter() - t0
        notes = getattr(fn, "notes", ())  # read after the call: an engine lists the calls it made
        if notes:
            extra["notes"] = list(notes)
    except Exception as exc:
        return finish(Status.ERROR, _exc_line(exc))
    if not isinstance(result, KernelOutput):
        got = type(result).__name__
        return finish(Status.ERROR, f"TypeError: the prepared callable must return KernelOutput, got {got}")
    problem = _shape_problem(ctx, result)
    if problem:
        return finish(Status.FAIL, problem)
    stats, details = _compare(ctx.ref, ctx.base, result, tol)
    if stats.failed_checks:
        return finish(Status.FAIL, " | ".join(details), stats)
    timing = None
    if timer is not None:
        t0 = time.perf_counter()
        try:
            timing = timer(fn)
        except Exception as exc:  # the verdict stands; the missing number is explained
            extra["timing_error"] = _exc_line(exc)
        clock["bench"] = time.perf_counter() - t0
        extra["bench_s"] = clock["bench"]
    return finish(Status.PASS, "", stats, timing)


def _shape_problem(ctx: CaseContext, result: KernelOutput) -> str:
    want_out, want_lse = tuple(ctx.ref.out.shape), tuple(ctx.ref.lse.shape)
    if tuple(result.out.shape) != want_out:
        return f"shape: out {tuple(result.out.shape)} != reference {want_out} (total_q, h, dv)"
    if result.lse is not None and tuple(result.lse.shape) != want_lse:
        return f"shape: lse {tuple(result.lse.shape)} != reference {want_lse} (h, total_q)"
    return ""


def compare(
    ref: AttnResult, base: tuple[torch.Tensor, torch.Tensor], kernel_out: KernelOutput, tol: Tolerance
) -> ErrorStats:
    """Error statistics of ``kernel_out`` against ``ref``, judged with ``tol`` (resolved: no None field).

    ``worst`` is the (token, head, dim) of the largest ratio ``|out-ref| / allowed``; ``error_ratio``
    is that ratio (``max|out-ref| / (factor * max|base-ref| + atol)`` when rtol is 0), so passing
    needs <= 1; ``max_rel`` is ``max |out-ref| / max(|ref|, atol)``.  Baseline entries that are not
    finite are left out of the baseline's error (an overflowing baseline must not allow everything).
    """
    return _compare(ref, base, kernel_out, tol)[0]


def _masked_max(x: torch.Tensor, keep: torch.Tensor) -> float:
    return float(torch.where(keep, x, torch.zeros_like(x)).max()) if x.numel() else 0.0


def _cosine(o: torch.Tensor, r: torch.Tensor) -> float:
    """Cosine similarity of the flattened tensors in fp64 (fp32 sums lose the 1e-6 it must resolve); NaN if ref is 0."""
    o64, r64 = o.double().flatten(), r.double().flatten()
    r_norm, o_norm = float(r64.norm()), float(o64.norm())
    if r_norm == 0:
        return math.nan
    return float(o64 @ r64) / (r_norm * o_norm) if o_norm else 0.0


def _compare(ref: AttnResult, base, kernel_out: KernelOutput, tol: Tolerance) -> tuple[ErrorStats, list[str]]:
    missing = tol.missing()
    if missing:
        raise ValueError(f"tol must be resolved (conformance.verdict.tolerance.resolve); unset fields: {missing}")
    r = ref.out
    ct, dev = r.dtype, r.device
    if tuple(kernel_out.out.shape) != tuple(r.shape):
        got = tuple(kernel_out.out.shape)
        raise ValueError(f"kernel out must have the reference's shape {tuple(r.shape)}, got {got}")
    o = kernel_out.out.to(dev, ct)
    _, h, dv = r.shape
    n = r.numel()

    def where_out(flat: int) -> str:
        return f"(token {flat // (h * dv)}, head {(flat // dv) % h}, dim {flat % dv})"

    berr = (base[0].to(dev, ct) - r).abs()
    bfin = torch.isfinite(berr)
    b_max = _masked_max(berr, bfin)
    b_mean = float(torch.where(bfin, berr, 0.0).sum()) / max(n, 1)
    finite = torch.isfinite(o)
    err = torch.where(finite, (o - r).abs(), math.inf)
    allowed_max = tol.factor * b_max + tol.atol
    allowed = allowed_max + tol.rtol * r.abs()
    ratio = err / allowed.clamp_min(torch.finfo(ct).tiny)
    worst_flat = int(ratio.argmax()) if n else 0
    error_ratio = float(ratio.max()) if n else 0.0
    over = int((ratio > 1).sum())
    mismatch_frac = over / n if n else 0.0
    max_abs = float(err.max()) if n else 0.0
    mean_abs = float(err.mean()) if n else 0.0
    max_rel = float((err / r.abs().clamp_min(max(tol.atol, torch.finfo(ct).tiny))).max()) if n else 0.0
    nonfinite = int((~finite & torch.isfinite(r)).sum())
    cosine = _cosine(o, r) if not nonfinite else math.nan
    mean_allowed = tol.mean_factor * b_mean + tol.mean_atol

    details: dict[str, str] = {}
    if nonfinite:
        first = int(torch.nonzero((~finite & torch.isfinite(r)).flatten())[0])
        details["nonfinite"] = (
            f"nonfinite: {nonfinite} NaN/Inf outputs where the reference is finite, first at {where_out(first)}"
        )
    if mismatch_frac > tol.max_mismatch_frac:
        w = worst_flat
        rel = f" + rtol {tol.rtol:g} x |ref| {float(r.flatten()[w].abs()):.1e}" if tol.rtol else ""
        details["max_error"] = (
            f"max_error: |out-ref| {float(err.flatten()[w]):.1e} at {where_out(w)} "
            f"> allowed {float(allowed.flatten()[w]):.1e} "
            f"({tol.factor:g} x baseline {b_max:.1e} + atol {tol.atol:.1e}{rel}); error ratio {error_ratio:.2f}; "
            f"{over} of {n} elements over ({mismatch_frac:.2%}, allowed {tol.max_mismatch_frac:.2%})"
        )
    if not mean_abs <= mean_allowed:
        details["mean_error"] = (
            f"mean_error: mean|out-ref| {mean_abs:.1e} > allowed {mean_allowed:.1e} "
            f"({tol.mean_factor:g} x baseline mean {b_mean:.1e} + mean_atol {tol.mean_atol:.1e}); "
            f"ratio {mean_abs / mean_allowed:.2f}"
        )
    if cosine < tol.min_cosine:  # NaN (skipped) compares False
        details["cosine"] = f"cosine: similarity {cosine:.6f} < min_cosine {tol.min_cosine:g}"

    masked_notes: list[str] = []
    zero_rows = (r == 0).all(dim=-1)  # (total_q, h): fully masked rows, output exactly 0
    row_err = err.amax(dim=-1) if dv else torch.zeros_like(zero_rows, dtype=ct)
    bad_rows = zero_rows & (row_err > tol.atol)
    if bool(bad_rows.any()):
        t, hh = (int(x) for x in torch.nonzero(bad_rows)[0])
        masked_notes.append(
            f"{int(bad_rows.sum())} fully masked rows not 0, first at (token {t}, head {hh}) "
            f"with max|out| {float(row_err[t, hh]):.1e} > atol {tol.atol:.1e}"
        )

    lse_max_abs = lse_allowed = None
    if kernel_out.lse is not None:
        lse_max_abs, lse_allowed, lse_detail, masked_lse = _compare_lse(ref.lse, base[1], kernel_out.lse, tol)
        if lse_detail:
            details["lse"] = lse_detail
        if masked_lse:
            masked_notes.append(masked_lse)
    if masked_notes:
        details["masked_rows"] = "masked_rows: " + "; ".join(masked_notes)

    failed = [c for c in CHECKS if c in details]
    stats = ErrorStats(
        max_abs=max_abs,
        max_rel=max_rel,
        mean_abs=mean_abs,
        worst=(worst_flat // (h * dv), (worst_flat // dv) % h, worst_flat % dv) if n else (-1, -1, -1),
        mismatch_frac=mismatch_frac,
        error_ratio=error_ratio,
        baseline_max_abs=b_max,
        baseline_mean_abs=b_mean,
        allowed_max_abs=allowed_max,
        cosine=cosine,
        nonfinite=nonfinite,
        lse_max_abs=lse_max_abs,
        lse_allowed=lse_allowed,
        failed_checks=tuple(failed),
    )
    return stats, [details[c] for c in failed]


def _compare_lse(ref_lse: torch.Tensor, base_lse: torch.Tensor, kernel_lse: torch.Tensor, tol: Tolerance):
    """(max abs error, allowed at the worst row, 'lse' failure text or '', masked-row note or '')."""
    ct, dev = ref_lse.dtype, ref_lse.device
    if tuple(kernel_lse.shape) != tuple(ref_lse.shape):
        got = tuple(kernel_lse.shape)
        raise ValueError(f"kernel lse must have the reference's shape {tuple(ref_lse.shape)}, got {got}")
    total_q = ref_lse.shape[1]

    def where_row(flat: int) -> str:
        return f"(token {flat % total_q}, head {flat // total_q})"

    lk = kernel_lse.to(dev, ct)
    live = torch.isfinite(ref_lse)
    masked_note = ""
    bad_masked = ~live & (lk != ref_lse)  # the reference's only non-finite value is -inf
    if bool(bad_masked.any()):
        first = int(torch.nonzero(bad_masked.flatten())[0])
        masked_note = (
            f"{int(bad_masked.sum())} rows with reference LSE -inf have another kernel LSE, "
            f"first at {where_row(first)}: "
            f"{float(lk.flatten()[first])} (adapters must return -inf, SEMANTICS.md section 4)"
        )
    if not bool(live.any()):
        return 0.0, tol.lse_atol, "", masked_note
    lb = base_lse.to(dev, ct)
    b_err = (lb - ref_lse).abs()
    b_max = _masked_max(b_err, live & torch.isfinite(b_err))
    diff = torch.where(live, torch.where(torch.isfinite(lk), (lk - ref_lse).abs(), math.inf), 0.0)
    safe_ref = torch.where(live, ref_lse, 0.0)
    allowed = tol.lse_factor * b_max + tol.lse_atol + tol.lse_rtol * safe_ref.abs()
    ratio = diff / allowed.clamp_min(torch.finfo(ct).tiny)
    w = int(ratio.argmax())
    max_abs = float(diff.max())
    allowed_w = float(allowed.flatten()[w])
    detail = ""
    if float(ratio.flatten()[w]) > 1:
        detail = (
            f"lse: |lse-ref| {float(diff.flatten()[w]):.1e} at {where_row(w)} > allowed {allowed_w:.1e} "
            f"({tol.lse_factor:g} x baseline {b_max:.1e} + lse_atol {tol.lse_atol:.1e} "
            f"+ lse_rtol {tol.lse_rtol:g} x |lse| {float(safe_ref.flatten()[w].abs()):.1e}); "
            f"kernel {float(lk.flatten()[w]):.6g} vs reference {float(ref_lse.flatten()[w]):.6g}; "
            f"{int((ratio > 1).sum())} of {int(live.sum())} rows over"
        )
    return max_abs, allowed_w, detail, masked_note
