"""The gradient verdict: each of dQ, dK, dV (and d sinks) judged against the reference gradients.

The rule is the forward's (:mod:`conformance.verdict.tolerance`) applied to every gradient tensor ``g``, with
``ref`` the reference gradient (fp32 on bf16/fp16 inputs, fp64 on fp32 inputs:
:func:`conformance.verdict.reference.default_numerics`) and ``base`` the same-precision baseline gradient
(:mod:`conformance.backward.gradients`: the attnref backward with ``P`` and ``dS`` rounded to the case dtype before
their matmuls, as a flash kernel's backward does, with a soft-cap on fp16 inputs the tanh's argument formed in fp16,
and the gradients rounded to the case dtype).  With ``B = max|base - ref|`` over the finite baseline elements:

* ``|g - ref| <= factor * B + atol + rtol * |ref|`` elementwise (``max_error``);
* ``mean|g - ref| <= mean_factor * mean|base - ref| + mean_atol`` (``mean_error``);
* no NaN/Inf where the reference is finite (``nonfinite``), whatever the tolerance;
* cosine similarity of the flattened ``g`` and ``ref`` >= ``min(min_cosine, 1 - factor * (1 - cos_base))``
  (``cosine``; ``cos_base`` the baseline's cosine), judged only where ``max|ref| > factor * B + atol``: a gradient
  that is zero in exact arithmetic has a reference of rounding noise with no direction, and exact zeros are right.

The tolerance (:func:`resolve_grad`): :data:`DTYPE_DEFAULTS` (``factor`` 2, flash-attention's gradient ``rtol``;
``atol``, ``mean_*`` and ``min_cosine`` the forward table's), then with a soft-cap ``factor`` 3 and ``3e-4`` added
to ``atol``, then :data:`BACKEND_RULES` (a backend's measured need, with its evidence; empty today).  ``atol`` is
raised to flash-attention's ``dq_atol`` (:func:`rounding_atol`: twice the case dtype's rounding at the gradient's
own magnitude) where that is larger.  The forward's ``--tol`` overrides do not reach these bounds.

Failure text has check.py's shape, one sub-check per text: ``backward dq: max error 3.1e-02 at (token 5, head 1,
dim 7) > allowed 7.8e-03 (2 x baseline 1.9e-03 + atol 3.9e-03); error ratio 3.97; 12 of 4096 elements over``.

flash-attention's gradient rule this restates (with its source), the table and the measured need for ``dq_atol``:
``docs/concepts/backward.md`` (*Tolerance*).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from conformance.cases.case import AttentionCase
from conformance.verdict.compare import cosine_similarity

__all__ = ["BACKEND_RULES", "DTYPE_DEFAULTS", "GRADS", "GradTolerance", "LAYOUTS", "judge", "resolve_grad"]

#: The gradient tensors, in report order.
GRADS = ("dq", "dk", "dv", "dsinks")
#: What each index of a gradient names, for the failure text.
LAYOUTS: dict[str, tuple[str, ...]] = {
    "dq": ("token", "head", "dim"),
    "dk": ("key", "kv head", "dim"),
    "dv": ("key", "kv head", "dim"),
    "dsinks": ("head",),
}


@dataclass(frozen=True)
class GradTolerance:
    """The bound of one gradient tensor (see the module docstring)."""

    factor: float
    atol: float
    rtol: float
    mean_factor: float
    mean_atol: float
    min_cosine: float

    def fields(self) -> dict[str, float]:
        return dataclasses.asdict(self)


DTYPE_DEFAULTS: dict[str, GradTolerance] = {
    "bf16": GradTolerance(factor=2, atol=2**-8, rtol=0, mean_factor=2, mean_atol=2**-11, min_cosine=0.999),
    "fp16": GradTolerance(factor=2, atol=2**-11, rtol=0, mean_factor=2, mean_atol=2**-14, min_cosine=0.99999),
    "fp32": GradTolerance(factor=2, atol=1e-5, rtol=0, mean_factor=2, mean_atol=1e-6, min_cosine=0.999999),
}
#: flash-attention's soft-cap gradient bound: ``rtol`` 3 instead of 2 and ``3e-4`` added to ``atol``.
SOFTCAP_FACTOR, SOFTCAP_ATOL = 3.0, 3e-4
#: Backend name -> field overrides.  Empty: no backend has shown a measured need.
BACKEND_RULES: dict[str, Mapping[str, float]] = {}


def resolve_grad(case: AttentionCase, backend_name: str = "") -> GradTolerance:
    """The gradient tolerance of (case, backend): dtype default, then the soft-cap layer, then the backend's."""
    tol = DTYPE_DEFAULTS[case.dtype]
    if case.softcap is not None:
        tol = dataclasses.replace(tol, factor=SOFTCAP_FACTOR, atol=tol.atol + SOFTCAP_ATOL)
    return dataclasses.replace(tol, **BACKEND_RULES.get(backend_name, {}))


def _where(name: str, shape: tuple[int, ...], flat: int) -> str:
    idx = []
    for size in reversed(shape):
        idx.append(flat % size if size else 0)
        flat = flat // size if size else 0
    labels = LAYOUTS.get(name, tuple(f"dim{i}" for i in range(len(shape))))
    return "(" + ", ".join(f"{label} {i}" for label, i in zip(labels, reversed(idx))) + ")"


def rounding_atol(ref: torch.Tensor, dtype: torch.dtype | None) -> float:
    """flash-attention's ``dq_atol``: ``2 * max|(r + 0.3) - 0.3 - r|`` with ``r`` the finite reference elements rounded
    to ``dtype`` (the case dtype) and every step in that dtype; 0 without a dtype or elements."""
    if dtype is None or ref.numel() == 0:
        return 0.0
    r = torch.where(torch.isfinite(ref), ref, 0.0).to(dtype)
    return 2.0 * float((((r + 0.3) - 0.3) - r).abs().max())


def judge(
    name: str,
    got: torch.Tensor,
    ref: torch.Tensor,
    base: torch.Tensor,
    tol: GradTolerance,
    dtype: torch.dtype | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """(per-tensor numbers for the record, failure texts) of gradient ``name`` (see the module docstring).

    The numbers: ``max_abs``, ``allowed`` (at the worst element), ``error_ratio`` (``|g-ref| / allowed`` at its
    largest: passing needs <= 1), ``baseline_max_abs``, ``mean_abs``, ``baseline_mean_abs``, ``nonfinite``,
    ``cosine``, ``baseline_cosine``, ``worst`` (the index), ``failed`` (the sub-checks that failed)."""
    label = f"backward {name}"
    if tuple(got.shape) != tuple(ref.shape):
        layout = ", ".join(LAYOUTS.get(name, ()))
        text = f"{label}: shape {tuple(got.shape)} != reference {tuple(ref.shape)} ({layout})"
        return {"failed": ["shape"], "shape": list(got.shape)}, [text]
    r = ref
    g = got.to(r.device).to(r.dtype)
    b = base.to(r.device).to(r.dtype)
    n = r.numel()
    ref_finite = torch.isfinite(r)
    berr = (b - r).abs()
    bfin = torch.isfinite(berr)
    b_max = float(torch.where(bfin, berr, 0.0).max()) if n else 0.0
    b_mean = float(torch.where(bfin, berr, 0.0).sum()) / max(n, 1)
    finite = torch.isfinite(g)
    err = torch.where(finite, (g - r).abs(), math.inf)
    err = torch.where(ref_finite, err, 0.0)  # a non-finite reference element is not judged (none is expected)
    atol = max(tol.atol, rounding_atol(r, dtype))  # flash-attention's dq_atol where larger (module docstring)
    allowed = tol.factor * b_max + atol + tol.rtol * torch.where(ref_finite, r, 0.0).abs()
    ratio = err / allowed.clamp_min(torch.finfo(r.dtype).tiny)
    worst = int(ratio.argmax()) if n else 0
    error_ratio = float(ratio.max()) if n else 0.0
    over = int((ratio > 1).sum())
    nonfinite = int((~finite & ref_finite).sum())
    max_abs = float(err.max()) if n else 0.0
    mean_abs = float(err.mean()) if n else 0.0
    cosine = cosine_similarity(g, r) if not nonfinite else math.nan
    base_cosine = cosine_similarity(torch.where(bfin, b, r), r)
    min_cos = tol.min_cosine if math.isnan(base_cosine) else min(tol.min_cosine, 1 - tol.factor * (1 - base_cosine))
    mean_allowed = tol.mean_factor * b_mean + tol.mean_atol
    problems: dict[str, str] = {}
    if nonfinite:
        first = int(torch.nonzero((~finite & ref_finite).flatten())[0])
        problems["nonfinite"] = (
            f"{label}: {nonfinite} NaN/Inf gradients where the reference is finite, first at "
            f"{_where(name, tuple(r.shape), first)}"
        )
    if over:
        rel = f" + rtol {tol.rtol:g} x |ref|" if tol.rtol else ""
        problems["max_error"] = (
            f"{label}: max error {float(err.flatten()[worst]):.1e} at {_where(name, tuple(r.shape), worst)} "
            f"> allowed {float(allowed.flatten()[worst]):.1e} ({tol.factor:g} x baseline {b_max:.1e} + atol "
            f"{atol:.1e}{rel}); error ratio {error_ratio:.2f}; {over} of {n} elements over"
        )
    if not mean_abs <= mean_allowed:
        problems["mean_error"] = (
            f"{label}: mean error {mean_abs:.1e} > allowed {mean_allowed:.1e} ({tol.mean_factor:g} x baseline mean "
            f"{b_mean:.1e} + mean_atol {tol.mean_atol:.1e})"
        )
    # a reference no larger than the bound is a true zero's rounding noise (one visible key: dS = 0): no direction
    cos_judged = n > 0 and float(torch.where(ref_finite, r, 0.0).abs().max()) > tol.factor * b_max + atol
    if cos_judged and cosine < min_cos:  # NaN (not judged) compares False
        problems["cosine"] = f"{label}: cosine {cosine:.6f} < {min_cos:.6f} (baseline cosine {base_cosine:.6f})"
    stats = {
        "max_abs": max_abs,
        "allowed": float(allowed.flatten()[worst]) if n else atol,
        "atol": atol,
        "error_ratio": error_ratio,
        "baseline_max_abs": b_max,
        "mean_abs": mean_abs,
        "baseline_mean_abs": b_mean,
        "nonfinite": nonfinite,
        "cosine": cosine,
        "baseline_cosine": base_cosine,
        "cosine_judged": cos_judged,
        "worst": _where(name, tuple(r.shape), worst) if n else "",
        "failed": list(problems),
    }
    return stats, list(problems.values())
