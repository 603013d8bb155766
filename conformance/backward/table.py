"""The report's Backward section: per kernel, its backward cases and the worst error ratio of each gradient.

Read from the records of backward cases (``case["backward"]``) and their ``extra["backward"]``
(:mod:`conformance.backward.composition`).  Columns per kernel: the backward cases, by status; the worst error
ratio of dQ, dK, dV and d sinks over the cases judged (``|g - ref| / allowed`` at its largest: above 1 fails), with
the case it came from on hover and in the notes; ``deterministic``: the cases run with the kernel's deterministic
option whose two backward runs were bitwise equal (``k/n``); ``run to run``: the same for the other cases (not
promised, shown only).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from conformance.records import CheckResult, Status

from .verdict import GRADS

__all__ = ["backward_section"]

COLUMNS = ("cases", "pass", "fail", "error", "unsupported", *GRADS, "deterministic", "run to run")


def _ratio_text(worst: tuple[float, str] | None) -> str:
    if worst is None:
        return "-"
    return "inf" if math.isinf(worst[0]) else f"{worst[0]:.3g}"


def backward_section(results: Iterable[CheckResult], backends: list[str]) -> dict[str, Any] | None:
    """``{columns, rows: [{backend, cells: [text]}], notes: [text]}``, or None without backward records."""
    rows: dict[str, dict[str, Any]] = {}
    for r in results:
        case = r.case if isinstance(r.case, dict) else {}
        if not case.get("backward"):
            continue
        row = rows.setdefault(
            r.backend,
            {"n": 0, "status": {}, "worst": {}, "det": [0, 0], "rtr": [0, 0]},
        )
        row["n"] += 1
        key = r.status.value if r.status in (Status.PASS, Status.FAIL, Status.UNSUPPORTED) else "error"
        row["status"][key] = row["status"].get(key, 0) + 1
        bw = r.extra.get("backward") if isinstance(r.extra, dict) else None
        if not isinstance(bw, dict):
            continue
        for name, stats in (bw.get("tensors") or {}).items():
            ratio = stats.get("error_ratio") if isinstance(stats, dict) else None
            if ratio is None:
                continue
            ratio = float(ratio)
            ratio = math.inf if math.isnan(ratio) else ratio  # a NaN gradient is as bad as it gets
            best = row["worst"].get(name)
            if best is None or ratio > best[0]:
                row["worst"][name] = (ratio, r.case_id)
        det = bw.get("deterministic")
        if isinstance(det, dict):
            slot = row["det"] if det.get("requested") else row["rtr"]
            slot[0] += bool(det.get("equal"))
            slot[1] += 1
    if not rows:
        return None
    out_rows, notes = [], []
    for b in backends:
        if b not in rows:
            continue
        row = rows[b]
        cells = [str(row["n"])] + [str(row["status"].get(k, 0)) for k in ("pass", "fail", "error", "unsupported")]
        cells += [_ratio_text(row["worst"].get(g)) for g in GRADS]
        cells += [f"{k}/{n}" if n else "-" for k, n in (row["det"], row["rtr"])]
        out_rows.append({"backend": b, "cells": cells})
        for g in GRADS:
            if g in row["worst"]:
                notes.append(f"{b}: worst {g} ratio {_ratio_text(row['worst'][g])} in `{row['worst'][g][1]}`")
    return {"columns": list(COLUMNS), "rows": out_rows, "notes": notes}
