"""The report's *Kernel variants* section: which variant of each kernel ran, and how it fared.

A record names the kernel variant that ran in ``extra["variant"]`` (:meth:`attnfast.base.Backend.prepare`: the
entry point, the arguments that select a variant, what the kernel's dispatcher picked).  The section groups each
backend's records by it, with their statuses (effective: a pass with a non-finite statistic counts as a fail), so
a failure that belongs to one variant (one SDPA backend, one FA4 compile key) shows as such.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from conformance.records import CheckResult
from conformance.reporting.compare import variant_of

__all__ = ["MAX_VARIANTS", "variant_label", "variant_sections"]

#: rows per backend (the most frequent variants first; the rest are counted in one row)
MAX_VARIANTS = 40


def variant_label(variant: dict[str, Any]) -> str:
    """``key=value`` pairs, keys sorted (the entry point first)."""
    keys = sorted(variant, key=lambda k: (k != "entry", k))
    return ", ".join(f"{k}={variant[k]}" for k in keys)


def variant_sections(results: Iterable[CheckResult], backends: list[str]) -> dict[str, Any] | None:
    """Rows of (backend, variant, records, status counts), or None when no record names a variant."""
    groups: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    unnamed: Counter[str] = Counter()
    for r in results:
        v = variant_of(r)
        if v is None:
            unnamed[r.backend] += 1
            continue
        groups[r.backend][variant_label(v)][r.effective_status.value] += 1
    if not groups:
        return None
    rows = []
    for b in [b for b in backends if b in groups] + sorted(set(groups) - set(backends)):
        ranked = sorted(groups[b].items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
        shown, rest = ranked[:MAX_VARIANTS], ranked[MAX_VARIANTS:]
        for label, counts in shown:
            rows.append({"backend": b, "variant": label, "records": sum(counts.values()), "counts": dict(counts)})
        if rest:
            merged: Counter[str] = sum((c for _, c in rest), Counter())
            rows.append(
                {
                    "backend": b,
                    "variant": f"({len(rest)} more variants)",
                    "records": sum(merged.values()),
                    "counts": dict(merged),
                }
            )
    notes = [
        f"{b}: {n} records name no variant (unsupported, a composition, or an older record)"
        for b, n in sorted(unnamed.items())
        if b in groups
    ]
    return {"rows": rows, "notes": notes}
