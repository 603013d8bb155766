"""The machine-readable summary of ``attnconf compare --json`` (:func:`to_json`), and of its refusals.

Keys (schema 1): ``exit_status`` (0 no regression, 1 regressed, 2 refused, 4 nothing judged), ``verdict`` (``no
regression``, ``regressed``, ``refused``, ``nothing judged``), ``refusal`` (``{"file", "reason"}`` or null); for a
comparison also ``unjudged`` (one ``{"family", "reason"}`` per backend family none of whose compared pairs was
judged in both files; ``allow_unjudged`` says whether ``--allow-unjudged`` accepted them), ``nonfinite_passes``
(``{"old": n, "new": m}``: pass records with NaN/inf statistics, counted as fails), ``old`` and
``new`` (path, suite, family versions, skipped lines), ``tolerance``, ``compared`` ((case, family) pairs in
both), ``not_compared`` (pairs NEW lacks, pairs in one file only, families in one file only, families outside
``--only-new-families``), ``counts`` per category, ``regressions`` (new failures, error-ratio, performance,
capabilities lost: one object per pair with case id, family, statuses, error ratios, reason, repro; gradient
regressions and missing gradient numbers of backward cases: one object per (pair, gradient)),
``fixed``, ``changed_failures``, ``perf_improvements``, ``capability_gained``, ``ratio_fixes`` (error ratios NaN in
OLD, numbers in NEW), ``numerics``, ``rules``.
Every list is complete (the Markdown summary caps its tables).
"""

from __future__ import annotations

from conformance.reporting.compare import Comparison, Pair, numbers_moved, variant_of

__all__ = ["SCHEMA", "refusal_json", "to_json"]

SCHEMA = 1


def _pair_json(p: Pair) -> dict[str, object]:
    return {
        "case_id": p.key[0],
        "family": p.key[1],
        "old_status": p.old.status.value,
        "new_status": p.new.status.value,
        "old_ratio": p.old.stats.error_ratio if p.old.stats is not None else None,
        "new_ratio": p.new.stats.error_ratio if p.new.stats is not None else None,
        "reason": " ".join(p.new.reason.split())[:300],
        "repro": p.new.repro,
    }


def _variant_json(p: Pair) -> dict[str, object]:
    return {
        **_pair_json(p),
        "old_variant": variant_of(p.old),
        "new_variant": variant_of(p.new),
        "numbers_moved": numbers_moved(p),
    }


def _perf_json(p: Pair, slowdown: float) -> dict[str, object]:
    to, tn = p.old.timing, p.new.timing
    assert to is not None and tn is not None
    return {**_pair_json(p), "old_median_ms": to.median_ms, "new_median_ms": tn.median_ms, "slowdown": slowdown}


def _grad_json(g) -> dict[str, object]:
    out = {
        "case_id": g.new.case_id,
        "family": g.new.family or g.new.backend,
        "tensor": g.tensor,
        "old_status": g.old.status.value,
        "new_status": g.new.status.value,
    }
    if hasattr(g, "new_ratio"):
        return {**out, "old_ratio": g.old_ratio, "new_ratio": g.new_ratio}
    return {**out, "lacking": g.side, "why": g.why}


def refusal_json(path: str, reason: str) -> dict[str, object]:
    """The summary of a comparison refused before it began (exit 2)."""
    return {"schema": SCHEMA, "exit_status": 2, "verdict": "refused", "refusal": {"file": path, "reason": reason}}


def to_json(cmp: Comparison) -> dict[str, object]:
    """The summary of a comparison (module docstring)."""
    categories = {
        "new_failures": [_pair_json(p) for p in cmp.new_failures],
        "ratio_regressions": [_pair_json(p) for p in cmp.ratio_regressions],
        "grad_regressions": [_grad_json(g) for g in cmp.grad_regressions],
        "grad_missing": [_grad_json(g) for g in cmp.grad_missing],
        "perf_regressions": [_perf_json(p, x) for p, x in cmp.perf_regressions],
        "capability_lost": [_pair_json(p) for p in cmp.capability_lost],
        "fixed": [_pair_json(p) for p in cmp.fixed],
        "changed_failures": [_pair_json(p) for p in cmp.changed_failures],
        "perf_improvements": [_perf_json(p, x) for p, x in cmp.perf_improvements],
        "capability_gained": [_pair_json(p) for p in cmp.capability_gained],
        "ratio_fixes": [_pair_json(p) for p in cmp.ratio_fixes],
        "variant_changes": [_variant_json(p) for p in cmp.variant_changes],
    }
    return {
        "schema": SCHEMA,
        "exit_status": cmp.exit_status,
        "verdict": cmp.verdict,
        "refusal": None,
        "unjudged": [{"family": fam, "reason": why} for fam, why in cmp.unjudged],
        "allow_unjudged": cmp.allow_unjudged,
        "nonfinite_passes": cmp.nonfinite_passes,
        "old": {
            "path": cmp.old_source,
            "suite": cmp.old_suite,
            "versions": cmp.old_versions,
            "skipped_lines": cmp.old_skipped,
        },
        "new": {
            "path": cmp.new_source,
            "suite": cmp.new_suite,
            "versions": cmp.new_versions,
            "skipped_lines": cmp.new_skipped,
        },
        "tolerance": cmp.tolerance,
        "compared": cmp.common,
        "not_compared": {
            "not_in_new": len(cmp.not_in_new),
            "only_in_old": [list(k) for k in cmp.only_old],
            "only_in_new": [list(k) for k in cmp.only_new],
            "families_only_old": cmp.families_only_old,
            "families_only_new": cmp.families_only_new,
            "outside_scope": cmp.outside_scope,
        },
        "counts": {name: len(items) for name, items in categories.items()},
        "regressions": {
            k: categories[k]
            for k in (
                "new_failures",
                "ratio_regressions",
                "grad_regressions",
                "grad_missing",
                "perf_regressions",
                "capability_lost",
            )
        },
        "fixed": categories["fixed"],
        "changed_failures": categories["changed_failures"],
        "perf_improvements": categories["perf_improvements"],
        "capability_gained": categories["capability_gained"],
        "ratio_fixes": categories["ratio_fixes"],
        "variant_changes": categories["variant_changes"],
        "numerics": {
            "compared": cmp.compared_errors,
            "identical": cmp.identical_errors,
            "by_digest": cmp.digest_compared,
            "changed": [_pair_json(p) for p in cmp.numerics_changed],
        },
        "rules": {
            "ratio_threshold": cmp.ratio_threshold,
            "ratio_floor": cmp.ratio_floor,
            "perf_margin": cmp.margin,
            "perf_margin_auto": cmp.margin_auto,
        },
        "duplicates": cmp.duplicates,
        "notes": cmp.file_notes + cmp.notes,
    }
