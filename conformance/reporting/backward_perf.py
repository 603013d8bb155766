"""The report's backward timing table: one row per timed backward record (``Timing.phase`` ``backward`` or
``fwd+bwd``, :mod:`conformance.perf.timing`), beside its forward twin where the same run timed it.

Columns: the backward alone (median, p20-p80, TFLOP/s at 2.5 x the forward FLOPs, % of the device roofline), the
whole training call (median and TFLOP/s at 3.5 x), and the forward twin (the same case without ``backward`` and
``deterministic``, same backend: the ``perf`` suite holds one for every backward case) with the backward-to-forward
time ratio (flash-attn's backward runs about 2-3 times its forward).  A record whose adapter cannot rerun its
backward alone has only the whole-call columns.  Forward timings stay in the main performance table.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from conformance.cases.case import AttentionCase
from conformance.perf.roofline import PHASES
from conformance.records import CheckResult

__all__ = ["BACKWARD_PHASES", "backward_perf_rows", "is_backward_timing"]

BACKWARD_PHASES = ("backward", "fwd+bwd")


def is_backward_timing(r: CheckResult) -> bool:
    return r.timing is not None and r.timing.phase in BACKWARD_PHASES


def _fmt(x: float | None, spec: str) -> str:
    return "" if x is None else format(x, spec)


def _twin_id(r: CheckResult) -> str | None:
    try:
        case = AttentionCase.from_json(r.case)
    except (KeyError, TypeError, ValueError):
        return None  # a record from a newer case model this version cannot rebuild
    return case.replace(backward=False, deterministic=False).id


def _tflops(flops: float | None, ms: float | None) -> float | None:
    return None if not flops or not ms else flops / (ms * 1e-3) / 1e12


def backward_perf_rows(results: Iterable[CheckResult]) -> list[dict[str, Any]]:
    """``[{case_id, backend, status, phase, bwd_ms, bwd_p20_ms, bwd_p80_ms, bwd_tflops, roofline, fwd_bwd_ms,
    fwd_bwd_tflops, fwd_ms, fwd_tflops, bwd_over_fwd, method}]`` (formatted strings, empty where not measured),
    sorted by case id and backend."""
    results = list(results)
    forward = {(r.case_id, r.backend): r for r in results if r.timing is not None and r.timing.phase == "forward"}
    rows = []
    for r in sorted(filter(is_backward_timing, results), key=lambda r: (r.case_id, r.backend)):
        t = r.timing
        assert t is not None
        fwd_flops = None if t.flops is None else t.flops / PHASES[t.phase]
        whole_ms = t.median_ms if t.phase == "fwd+bwd" else t.fwd_bwd_ms
        bwd = t.phase == "backward"
        twin_id = _twin_id(r)
        twin = forward.get((twin_id, r.backend)) if twin_id else None
        fwd_ms = twin.timing.median_ms if twin is not None and twin.timing is not None else None
        rows.append(
            {
                "case_id": r.case_id,
                "backend": r.backend,
                "status": r.status.value,
                "phase": t.phase,
                "bwd_ms": _fmt(t.median_ms, ".4g") if bwd else "",
                "bwd_p20_ms": _fmt(t.p20_ms, ".4g") if bwd else "",
                "bwd_p80_ms": _fmt(t.p80_ms, ".4g") if bwd else "",
                "bwd_tflops": _fmt(t.tflops, ".1f") if bwd else "",
                "roofline": _fmt(t.roofline_pct, ".0f") or "n/a",
                "fwd_bwd_ms": _fmt(whole_ms, ".4g"),
                "fwd_bwd_tflops": _fmt(_tflops(None if fwd_flops is None else 3.5 * fwd_flops, whole_ms), ".1f"),
                "fwd_ms": _fmt(fwd_ms, ".4g"),
                "fwd_tflops": _fmt(twin.timing.tflops if twin is not None and twin.timing is not None else None, ".1f"),
                "bwd_over_fwd": _fmt(t.median_ms / fwd_ms if bwd and fwd_ms else None, ".2f"),
                "method": t.method,
            }
        )
    return rows
