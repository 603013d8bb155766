"""The comparison behind the verdict: a kernel's (out, lse) against the reference, bounded by the baseline.

:func:`compare` turns the tolerance model of :mod:`conformance.verdict.tolerance` into :class:`ErrorStats`
and one failure text per failed sub-check (:data:`CHECKS`, in that order); :mod:`conformance.verdict.check`
runs the kernel and calls it.  Non-finite values fail closed (see :func:`compare`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from attnfast.base import KernelOutput
from attnref import AttnResult

from conformance.records import ErrorStats
from conformance.verdict.hostread import Pending, read_host
from conformance.verdict.tolerance import ResolvedTolerance, Tolerance, is_resolved

__all__ = [
    "CHECKS",
    "STATISTICS_CHECKS",
    "BaselineErrors",
    "baseline_errors",
    "compare",
    "compare_details",
    "compare_pending",
    "cosine_similarity",
    "failed_by_statistics",
]

#: Fixed order of the sub-checks in ``failed_checks`` and in the failure text.
CHECKS = ("nonfinite", "max_error", "mean_error", "cosine", "lse", "masked_rows")
#: The sub-checks a record's own statistics decide, with the tolerance it was judged by (:func:`failed_by_statistics`);
#: ``lse`` and ``masked_rows`` need the rows, which a record does not keep.
STATISTICS_CHECKS = ("nonfinite", "max_error", "mean_error", "cosine")


def _failing(
    nonfinite: int, mismatch_frac: float, mean_abs: float, baseline_mean: float, cosine: float, tol: Any
) -> tuple[str, ...]:
    """The :data:`STATISTICS_CHECKS` these numbers fail under ``tol`` (its ``max_mismatch_frac``, ``mean_factor``,
    ``mean_atol`` and ``min_cosine``), in that order: one place for the rule the comparison and a re-judged record
    share."""
    failed = []
    if nonfinite:
        failed.append("nonfinite")
    if mismatch_frac > tol.max_mismatch_frac:
        failed.append("max_error")
    if not mean_abs <= tol.mean_factor * baseline_mean + tol.mean_atol:  # a NaN mean fails
        failed.append("mean_error")
    # a NaN cosine (an all-zero reference; a non-finite output, judged by nonfinite) compares False: not judged here
    if cosine < tol.min_cosine:
        failed.append("cosine")
    return tuple(failed)


def failed_by_statistics(stats: ErrorStats, tol: Tolerance) -> tuple[str, ...]:
    """Which of :data:`STATISTICS_CHECKS` ``stats`` fail under ``tol``, as the comparison decided them when it made
    the statistics: a record judged again from its ``stats`` and ``extra["tolerance"]`` alone (no tensor, no GPU)
    gets back the part of its ``failed_checks`` that those checks make.  ``tol`` needs ``max_mismatch_frac``,
    ``mean_factor``, ``mean_atol`` and ``min_cosine`` set (``ValueError`` otherwise)."""
    unset = [n for n in ("max_mismatch_frac", "mean_factor", "mean_atol", "min_cosine") if getattr(tol, n) is None]
    if unset:
        raise ValueError(f"tol must set {', '.join(unset)} to judge statistics")
    return _failing(stats.nonfinite, stats.mismatch_frac, stats.mean_abs, stats.baseline_mean_abs, stats.cosine, tol)


def compare(
    ref: AttnResult, base: tuple[torch.Tensor, torch.Tensor], kernel_out: KernelOutput, tol: Tolerance
) -> ErrorStats:
    """Error statistics of ``kernel_out`` against ``ref``, judged with ``tol`` (resolved: no None field).

    ``worst`` is the (token, head, dim) of the largest ratio ``|out-ref| / allowed``; ``error_ratio``
    is that ratio, so passing needs <= 1; ``allowed_max_abs`` is the bound at ``worst`` without its rtol term,
    ``factor * max|base-ref| + min(atol, atol_rel * |ref|)`` (``atol`` on a fully masked row); ``max_rel`` is
    ``max |out-ref| / max(|ref|, atol)``.

    Fail closed on non-finite values:

    * a NaN or +-inf output where the reference is finite fails ``nonfinite`` (counted in ``nonfinite``)
      and ``max_error`` (its error is +inf); ``cosine`` is then NaN and not judged on its own;
    * a NaN or +-inf LSE on a row whose reference LSE is finite fails ``lse`` (``lse_max_abs`` is +inf);
      on a row whose reference LSE is ``-inf`` (fully masked, no sink) anything but ``-inf`` fails
      ``masked_rows``;
    * a baseline (output or LSE) that is not finite where the reference is finite never widens a bound:
      those elements are left out of the baseline's max and mean error (the bound is made from the
      finite rest, at worst ``atol`` alone), and :func:`check_backend` records their count in the
      result's ``extra["baseline_nonfinite"]`` (``{"out": n, "lse": m}``, absent when both are 0).
    """
    return compare_details(ref, base, kernel_out, tol)[0]


def _as_ref(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``x`` on ``ref``'s device, in ``ref``'s dtype: every comparison is made in the reference's dtype."""
    # no mutate: every tensor of a CPU test is on the CPU already, so no test can observe the device move
    on_device = x.to(ref.device)  # pragma: no mutate
    return on_device.to(ref.dtype)


def _masked_max_t(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The largest of ``x`` where ``keep`` (0 where nothing is kept, or for an empty ``x``), as a 0-d tensor."""
    return torch.where(keep, x, torch.zeros_like(x)).max() if x.numel() else x.new_zeros(())


def _read(*values: torch.Tensor) -> list[float]:
    """0-d tensors of one device as Python floats, in one host read (one wait for the device).  Exact: every value
    is float32/float64 (widened to float64 without rounding) or an integer below 2^53."""
    return read_host(values, [])[0]


def _cosine(dot: float, r_norm: float, o_norm: float) -> float:
    if r_norm == 0:
        return math.nan
    return dot / (r_norm * o_norm) if o_norm else 0.0


def cosine_similarity(o: torch.Tensor, r: torch.Tensor) -> float:
    """Cosine similarity of the flattened tensors in fp64 (fp32 sums lose the 1e-6 it must resolve); NaN if ref is 0."""
    o64, r64 = o.double().flatten(), r.double().flatten()
    r_norm, o_norm, dot = _read(r64.norm(), o64.norm(), o64 @ r64)
    return _cosine(dot, r_norm, o_norm)


@dataclass(frozen=True)
class BaselineErrors:
    """The baseline's part of every bound on one context, from the reference and the baseline alone (the same for
    every kernel and tolerance, so a context reads it once: :func:`baseline_errors`).  ``out_*``: over the output's
    elements whose baseline error is finite, their largest and summed ``|base-ref|``, and ``out_nonfinite`` the
    elements whose baseline is not finite where the reference is; ``lse_*``: over the live rows (finite reference
    LSE: ``lse_live`` of them) the largest finite ``|base-ref|`` and the count whose baseline LSE is not finite
    (all None when the baseline has no LSE of the reference's shape: a comparison with a kernel LSE then finds
    them itself)."""

    out_nonfinite: int
    out_max: float
    out_sum: float
    lse_nonfinite: int | None = None
    lse_max: float | None = None
    lse_live: int | None = None


def baseline_errors_pending(ref: AttnResult, base) -> Pending[BaselineErrors]:
    """:class:`BaselineErrors` of ``(ref, base)`` as tensors not read yet."""
    r = ref.out
    berr = (_as_ref(base[0], r) - r).abs()
    bfin = torch.isfinite(berr)  # a non-finite baseline element must not widen the bound: left out
    values = [(~bfin & torch.isfinite(r)).sum(), _masked_max_t(berr, bfin), torch.where(bfin, berr, 0.0).sum()]
    base_lse, ref_lse = base[1], ref.lse
    has_lse = isinstance(base_lse, torch.Tensor) and tuple(base_lse.shape) == tuple(ref_lse.shape)
    if has_lse:
        values += _lse_baseline_pending(ref_lse, base_lse)

    def finish(v: list[float]) -> BaselineErrors:
        if not has_lse:
            return BaselineErrors(int(v[0]), v[1], v[2])
        return BaselineErrors(int(v[0]), v[1], v[2], int(v[3]), v[4], int(v[5]))

    return Pending(values, finish)


def baseline_errors(ref: AttnResult, base) -> BaselineErrors:
    """:class:`BaselineErrors` of ``(ref, base)``, in one host read."""
    return baseline_errors_pending(ref, base).read()


def compare_details(
    ref: AttnResult, base, kernel_out: KernelOutput, tol: Tolerance, *, known: BaselineErrors | None = None
) -> tuple[ErrorStats, list[str], dict[str, int]]:
    """(stats, failure texts in CHECKS order, non-finite baseline counts {"out": n, "lse": m} or {}).  ``known``:
    :func:`baseline_errors` of ``(ref, base)`` read already (one host read for the kernel's statistics then; else
    two)."""
    return compare_pending(ref, base, kernel_out, tol, known=known).read()


def compare_pending(
    ref: AttnResult, base, kernel_out: KernelOutput, tol: Tolerance, *, known: BaselineErrors | None = None
) -> Pending[tuple[ErrorStats, list[str], dict[str, int]]]:
    """:func:`compare_details` as tensors not read yet (the output's and the LSE's statistics together) and the
    rest of the comparison once they are read.  Raises here what :func:`compare_details` raises before its read
    (an unresolved ``tol``, a kernel output or LSE of another shape, an ``lse_slack`` of another shape), and from
    ``finish`` what it raises after (a negative or non-finite ``lse_slack``)."""
    if not is_resolved(tol):
        raise ValueError(f"tol must be resolved (conformance.verdict.tolerance.resolve); unset fields: {tol.missing()}")
    r = ref.out
    ct = r.dtype
    if tuple(kernel_out.out.shape) != tuple(r.shape):
        got = tuple(kernel_out.out.shape)
        raise ValueError(f"kernel out must have the reference's shape {tuple(r.shape)}, got {got}")
    if known is None:
        known = baseline_errors(ref, base)
    o = _as_ref(kernel_out.out, r)
    _, h, dv = r.shape
    n = r.numel()

    def where_out(flat: int) -> str:
        return f"(token {flat // (h * dv)}, head {(flat // dv) % h}, dim {flat % dv})"

    b_max, b_sum = known.out_max, known.out_sum
    b_mean = b_sum / max(n, 1)
    finite = torch.isfinite(o)
    err = torch.where(finite, (o - r).abs(), math.inf)
    zero_rows = (r == 0).all(dim=-1)  # (total_q, h): fully masked rows, output exactly 0
    r_abs = r.abs()
    allowed = tol.factor * b_max + _atol(r, zero_rows, tol) + tol.rtol * r_abs
    ratio = err / allowed.clamp_min(torch.finfo(ct).tiny)
    row_err = err.amax(dim=-1) if dv else r.new_zeros(zero_rows.shape)
    bad_rows = zero_rows & (row_err > tol.atol)
    o64, r64 = o.double().flatten(), r.double().flatten()
    # One host read for the kernel's statistics, the output's and the LSE's (the baseline's are read already): each
    # read waits for the GPU, and behind the other processes sharing it.  Each value is the reduction the text names.
    kernel_stats = [bad_rows.sum(), r64.norm(), o64.norm(), o64 @ r64, (~finite & torch.isfinite(r)).sum()]
    if n:  # the largest ratio, its index, the count over, the errors' max, mean and largest relative error
        rel_err = err / r_abs.clamp_min(max(tol.atol, torch.finfo(ct).tiny))
        w_t = ratio.argmax()
        w_row = torch.div(w_t, dv, rounding_mode="floor")  # the worst element's (token, head) row
        kernel_stats += [w_t, ratio.max(), (ratio > 1).sum(), err.max(), err.mean(), rel_err.max()]
        kernel_stats += [torch.take(r_abs, w_t), torch.take(zero_rows, w_row)]  # the worst element's atol (no read)
    lse_plan = None
    if kernel_out.lse is not None:
        if known.lse_max is None:  # the context's baseline has no LSE of the reference's shape: as it always was
            known = dataclasses.replace(known, **_lse_baseline(ref.lse, base[1]))
        assert known.lse_max is not None and known.lse_live is not None
        lse_plan = _lse_pending(ref.lse, kernel_out.lse, tol, kernel_out.lse_slack, known.lse_max, known.lse_live)
    lse_values = [] if lse_plan is None else lse_plan.values

    def finish(read: list[float]) -> tuple[ErrorStats, list[str], dict[str, int]]:
        rows_over, r_norm, o_norm, dot, nonfinite = read[0], read[1], read[2], read[3], int(read[4])
        if n:
            # no mutate: with n == 0 worst_flat is never read (worst is (-1, -1, -1) and max_error cannot fail)
            worst_flat = int(read[5])  # pragma: no mutate
            error_ratio, over, max_abs, mean_abs, max_rel = read[6], int(read[7]), read[8], read[9], read[10]
            ref_w, masked_w = read[11], bool(read[12])
        else:
            worst_flat, error_ratio, over, max_abs, mean_abs, max_rel = 0, 0.0, 0, 0.0, 0.0, 0.0
            ref_w, masked_w = 0.0, True
        atol_w = tol.atol if masked_w or _atol_fixed(tol) else min(tol.atol, tol.atol_rel * ref_w)  # as _atol's
        allowed_max = tol.factor * b_max + atol_w
        mismatch_frac = over / n if n else 0.0
        # no mutate: the guard only saves work; cosine_similarity of an output with a NaN/Inf is NaN anyway
        cosine = _cosine(dot, r_norm, o_norm) if not nonfinite else math.nan  # pragma: no mutate
        mean_allowed = tol.mean_factor * b_mean + tol.mean_atol
        base_nonfinite = {"out": known.out_nonfinite, "lse": 0}
        failing = _failing(nonfinite, mismatch_frac, mean_abs, b_mean, cosine, tol)

        details: dict[str, str] = {}
        if "nonfinite" in failing:
            first = int(torch.nonzero((~finite & torch.isfinite(r)).flatten())[0])
            details["nonfinite"] = (
                f"nonfinite: {nonfinite} NaN/Inf outputs where the reference is finite, first at {where_out(first)}"
            )
        if "max_error" in failing:
            w = worst_flat
            rel = f" + rtol {tol.rtol:g} x |ref| {float(r.flatten()[w].abs()):.1e}" if tol.rtol else ""
            const = f"atol_rel {tol.atol_rel:.3g} x |ref| {ref_w:.1e}" if atol_w < tol.atol else f"atol {tol.atol:.1e}"
            details["max_error"] = (
                f"max_error: |out-ref| {float(err.flatten()[w]):.1e} at {where_out(w)} "
                f"> allowed {float(allowed.flatten()[w]):.1e} "
                f"({tol.factor:g} x baseline {b_max:.1e} + {const}{rel}); error ratio {error_ratio:.2f}; "
                f"{over} of {n} elements over ({mismatch_frac:.2%}, allowed {tol.max_mismatch_frac:.2%})"
            )
        if "mean_error" in failing:
            details["mean_error"] = (
                f"mean_error: mean|out-ref| {mean_abs:.1e} > allowed {mean_allowed:.1e} "
                f"({tol.mean_factor:g} x baseline mean {b_mean:.1e} + mean_atol {tol.mean_atol:.1e}); "
                f"ratio {mean_abs / mean_allowed:.2f}"
            )
        if "cosine" in failing:
            details["cosine"] = f"cosine: similarity {cosine:.6f} < min_cosine {tol.min_cosine:g}"

        masked_notes: list[str] = []
        if rows_over:
            t, hh = (int(x) for x in torch.nonzero(bad_rows)[0])
            masked_notes.append(
                f"{int(rows_over)} fully masked rows not 0, first at (token {t}, head {hh}) "
                f"with max|out| {float(row_err[t, hh]):.1e} > atol {tol.atol:.1e}"
            )

        lse_max_abs = lse_allowed = None
        if lse_plan is not None:
            lse_max_abs, lse_allowed, lse_detail, masked_lse = lse_plan.finish(read[len(kernel_stats) :])
            assert known.lse_nonfinite is not None
            base_nonfinite["lse"] = known.lse_nonfinite
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
        return stats, [details[c] for c in failed], base_nonfinite if any(base_nonfinite.values()) else {}

    return Pending([*kernel_stats, *lse_values], finish)


def _atol_fixed(tol: ResolvedTolerance) -> bool:
    """Whether ``atol`` applies unscaled everywhere: ``atol_rel`` inf, or ``atol`` inf (the bound switched off)."""
    return math.isinf(tol.atol) or math.isinf(tol.atol_rel)


def _atol(r: torch.Tensor, zero_rows: torch.Tensor, tol: ResolvedTolerance) -> torch.Tensor:
    """The constant term of each element: ``min(atol, atol_rel * |ref|)``, the rounding of the element itself in
    the case dtype where that is below ``atol``; ``atol`` on a fully masked row (reference all 0: judged by
    ``masked_rows`` against ``atol``) and everywhere when :func:`_atol_fixed`."""
    if _atol_fixed(tol):
        return torch.full_like(r, tol.atol)
    return torch.where(zero_rows[..., None], tol.atol, torch.clamp(r.abs() * tol.atol_rel, max=tol.atol))


def _lse_baseline_pending(ref_lse: torch.Tensor, base_lse: torch.Tensor) -> list[torch.Tensor]:
    """:class:`BaselineErrors`' LSE fields (``lse_nonfinite``, ``lse_max``, ``lse_live``) as 0-d tensors not read
    yet."""
    lb = _as_ref(base_lse, ref_lse)
    live = torch.isfinite(ref_lse)
    b_err = (lb - ref_lse).abs()
    return [(live & ~torch.isfinite(lb)).sum(), _masked_max_t(b_err, live & torch.isfinite(b_err)), live.sum()]


def _lse_baseline(ref_lse: torch.Tensor, base_lse: torch.Tensor) -> dict[str, Any]:
    """:class:`BaselineErrors`' LSE fields of a baseline LSE that :func:`baseline_errors_pending` left out, in one
    host read."""
    nonfinite, b_max, live_rows = _read(*_lse_baseline_pending(ref_lse, base_lse))
    return {"lse_nonfinite": int(nonfinite), "lse_max": b_max, "lse_live": int(live_rows)}


def _compare_lse(
    ref_lse: torch.Tensor,
    base_lse: torch.Tensor,
    kernel_lse: torch.Tensor,
    tol: ResolvedTolerance,
    slack: torch.Tensor | None = None,
) -> tuple[float, float, str, str]:
    """:func:`_lse_pending` on its own, the baseline's part read first (two host reads)."""
    known = _lse_baseline(ref_lse, base_lse)
    return _lse_pending(ref_lse, kernel_lse, tol, slack, known["lse_max"], known["lse_live"]).read()


def _lse_pending(
    ref_lse: torch.Tensor,
    kernel_lse: torch.Tensor,
    tol: ResolvedTolerance,
    slack: torch.Tensor | None,
    b_max: float,
    live_rows: int,
) -> Pending[tuple[float, float, str, str]]:
    """(max abs error, allowed at the worst row, 'lse' failure text or '', masked-row note or ''), as tensors not
    read yet; ``b_max``, ``live_rows``: the baseline's :class:`BaselineErrors` (``lse_max``, ``lse_live``).

    Rows with a finite reference LSE ("live") are compared numerically; a NaN or +-inf kernel LSE there
    has error +inf and fails.  Rows with reference LSE ``-inf`` (fully masked, no sink) need exactly
    ``-inf``.  Baseline rows that are not finite are left out of the bound's baseline term.  ``slack``
    (the kernel output's ``lse_slack``: the reference's shape, finite, ``>= 0``, else ``ValueError``) is added to
    each live row's bound and named in the failure text.
    """
    ct = ref_lse.dtype
    if tuple(kernel_lse.shape) != tuple(ref_lse.shape):
        got = tuple(kernel_lse.shape)
        raise ValueError(f"kernel lse must have the reference's shape {tuple(ref_lse.shape)}, got {got}")
    if slack is not None:
        if not isinstance(slack, torch.Tensor) or tuple(slack.shape) != tuple(ref_lse.shape):
            got = tuple(slack.shape) if isinstance(slack, torch.Tensor) else type(slack).__name__
            raise ValueError(f"kernel lse_slack must have the reference LSE's shape {tuple(ref_lse.shape)}, got {got}")
        slack = _as_ref(slack, ref_lse)
    total_q = ref_lse.shape[1]

    def where_row(flat: int) -> str:
        return f"(token {flat % total_q}, head {flat // total_q})"

    lk = _as_ref(kernel_lse, ref_lse)
    live = torch.isfinite(ref_lse)
    bad_masked = ~live & (lk != ref_lse)  # the reference's only non-finite value is -inf
    # a NaN slack would make every comparison with the bound false (a pass), an infinite one switch the bound off
    bad_slack = (
        live.new_zeros((), dtype=torch.long) if slack is None else (~(torch.isfinite(slack) & (slack >= 0))).sum()
    )
    values = [bad_masked.sum(), bad_slack]
    if live_rows:
        kernel_finite = torch.isfinite(lk)
        diff = torch.where(live, torch.where(kernel_finite, (lk - ref_lse).abs(), math.inf), 0.0)
        safe_ref = torch.where(live, ref_lse, 0.0)
        allowed = tol.lse_factor * b_max + tol.lse_atol + tol.lse_rtol * safe_ref.abs()
        if slack is not None:
            allowed = allowed + torch.where(live, slack, 0.0)
        ratio = diff / allowed.clamp_min(torch.finfo(ct).tiny)
        nonfinite = live & ~kernel_finite
        flat_ratio = ratio.flatten()
        w_t = flat_ratio.argmax()
        values += [diff.max(), nonfinite.sum(), w_t, torch.take(allowed, w_t), torch.take(flat_ratio, w_t)]

    def finish(read: list[float]) -> tuple[float, float, str, str]:
        masked_bad, slack_bad = read[0], read[1]
        if slack_bad:
            raise ValueError(f"kernel lse_slack must be finite and >= 0 on every row, {int(slack_bad)} rows are not")
        masked_note = ""
        if masked_bad:
            first = int(torch.nonzero(bad_masked.flatten())[0])
            masked_note = (
                f"{int(masked_bad)} rows with reference LSE -inf have another kernel LSE, "
                f"first at {where_row(first)}: "
                f"{float(lk.flatten()[first])} (adapters must return -inf, SEMANTICS.md section 4)"
            )
        if not live_rows:
            return 0.0, tol.lse_atol, "", masked_note
        max_abs, nonfinite_rows, w_f, allowed_w, ratio_w = read[2:7]
        if nonfinite_rows:  # fails even under an infinite lse_atol (inf / inf is no ratio)
            w = int(torch.nonzero(nonfinite.flatten())[0])
            detail = (
                f"lse: {int(nonfinite_rows)} NaN/Inf LSE where the reference is finite, first at {where_row(w)}: "
                f"kernel {float(lk.flatten()[w])} vs reference {float(ref_lse.flatten()[w]):.6g}"
            )
            return max_abs, float(allowed.flatten()[w]), detail, masked_note
        w = int(w_f)
        detail = ""
        if ratio_w > 1:
            detail = (
                f"lse: |lse-ref| {float(diff.flatten()[w]):.1e} at {where_row(w)} > allowed {allowed_w:.1e} "
                f"({tol.lse_factor:g} x baseline {b_max:.1e} + lse_atol {tol.lse_atol:.1e} "
                f"+ lse_rtol {tol.lse_rtol:g} x |lse| {float(safe_ref.flatten()[w].abs()):.1e}"
                f"{'' if slack is None else f' + kernel lse_slack {float(slack.flatten()[w]):.1e}'}); "
                f"kernel {float(lk.flatten()[w]):.6g} vs reference {float(ref_lse.flatten()[w]):.6g}; "
                f"{int((ratio > 1).sum())} of {int(live_rows)} rows over"
            )
        return max_abs, allowed_w, detail, masked_note

    return Pending(values, finish)
