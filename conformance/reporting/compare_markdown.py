"""The Markdown summary of a comparison (:class:`conformance.reporting.compare.Comparison`): what ``attnconf compare``
prints and writes with ``--out``; its JSON twin is :mod:`conformance.reporting.compare_summary`."""

from __future__ import annotations

from collections.abc import Sequence

from conformance.records import CheckResult, NONFINITE_PASS
from conformance.reporting.compare import MAX_ROWS, Comparison, Pair, _digest, _family, numbers_moved, variant_of

__all__ = ["render_markdown"]


def _rows(items: list, fmt) -> list[str]:
    lines = [fmt(x) for x in items[:MAX_ROWS]]
    if len(items) > MAX_ROWS:
        lines.append(f"| ... {len(items) - MAX_ROWS} more |")
    return lines


def _cell(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _ratio(r: CheckResult) -> str:
    if r.stats is None:
        return "n/a"
    x = r.stats.error_ratio
    return f"{x:.3g}" if isinstance(x, (int, float)) else repr(x)


def _numerics_line(cmp: Comparison) -> str:
    """What the numerics comparison compared and what differed: the pairs with error statistics in both runs (of
    all the pairs in both files), how many are unchanged and changed, and how they were compared, with the changed
    ones per way (bit for bit by the output digests, or by max error and LSE error where a record has no digest)."""
    n, rest = cmp.compared_errors, cmp.common - cmp.compared_errors
    changed = len(cmp.numerics_changed)
    by_digest_changed = sum(_digest(p.old) is not None and _digest(p.new) is not None for p in cmp.numerics_changed)
    by_errors = n - cmp.digest_compared
    line = f"Numerics: {n} of the {cmp.common} pairs in both files have error statistics in both runs"
    if rest:
        line += f" (the other {rest} lack them on one side or both: unsupported, or no output compared)"
    line += f"; of those, {n - changed} unchanged, {changed} changed."
    digest = "bit for bit by their output digests"
    errors = "by max error and LSE error (the same errors, not proven the same bits)"
    if not by_errors:
        return line + f" All {n} compared {digest}."
    if not cmp.digest_compared:
        return line + f" All {n} compared {errors}: the records carry no output digest."
    return line + (
        f" Compared {digest}: {cmp.digest_compared} ({by_digest_changed} changed); {errors}, where a record has "
        f"no digest: {by_errors} ({changed - by_digest_changed} changed)."
    )


def render_markdown(cmp: Comparison) -> str:
    """The summary ``attnconf compare`` prints and writes."""
    verdict = {"regressed": "REGRESSED", "nothing judged": "NOTHING JUDGED"}.get(cmp.verdict, cmp.verdict)
    out = [f"# Compare: {cmp.old_source} -> {cmp.new_source}: {verdict}", ""]
    families = sorted(set(cmp.old_versions) | set(cmp.new_versions))
    out += ["| family | old version | new version |", "|---|---|---|"]
    out += [f"| {f} | {cmp.old_versions.get(f, '-')} | {cmp.new_versions.get(f, '-')} |" for f in families]
    margin = f"{cmp.margin:.1%} ({'auto: median p20-p80 spread' if cmp.margin_auto else 'given'})"
    scope = (
        f"{cmp.common} (case, family) pairs in both files; only in old: {len(cmp.only_old)}, only in new: "
        f"{len(cmp.only_new)}; error-ratio rule: new > {cmp.ratio_threshold:g} x old and > {cmp.ratio_floor:g}; "
        f"performance margin {margin}."
    )
    out += ["", scope]
    if cmp.old_suite:
        out.append(f"Suite `{cmp.old_suite}` in both; tolerance: {cmp.tolerance} in both.")
    if cmp.not_in_new:
        out.append(
            f"Not compared: {len(cmp.not_in_new)} (case, family) pairs of the old file that the new one lacks "
            "(accepted with --allow-subset)."
        )
    if cmp.outside_scope:
        listed = ", ".join(f"{f} ({n} records)" for f, n in sorted(cmp.outside_scope.items()))
        out.append(f"Outside the comparison (--only-new-families: families the new run was not asked for): {listed}.")
    for label, skipped in (("old", cmp.old_skipped), ("new", cmp.new_skipped)):
        if skipped:
            first = "; ".join(skipped[:3]) + ("; ..." if len(skipped) > 3 else "")
            n = len(skipped)
            out.append(
                f"Skipped {n} line{'s' * (n != 1)} of the {label} file (accepted with --allow-skipped): {first}."
            )
    out.extend(f"{note}." for note in cmp.file_notes)
    out.extend(cmp.notes)
    for fam, why in cmp.unjudged:
        accepted = " (accepted with --allow-unjudged)" if cmp.allow_unjudged else ""
        out.append(f"Nothing judged: family {fam} {why}{accepted}.")
    for side, n in sorted(cmp.nonfinite_passes.items(), reverse=True):
        if n:
            out.append(f"{NONFINITE_PASS}: {n} record(s) of the {side} file.")
    if cmp.compared_errors:
        out.append(_numerics_line(cmp))
    for label, counts in (("old", cmp.families_only_old), ("new", cmp.families_only_new)):
        if counts:
            listed = ", ".join(f"{f} ({n} records)" for f, n in sorted(counts.items()))
            out.append(f"Families only in the {label} file, not compared: {listed}.")
    if cmp.duplicates:
        out.append(
            f"Warning: {cmp.duplicates} records share a (case, family) key with another of their file; "
            "the last one was used."
        )

    changes: list[tuple[str, Sequence[object]]] = [
        ("new failures", cmp.new_failures),
        ("error-ratio regressions", cmp.ratio_regressions),
        ("gradient regressions", cmp.grad_regressions),
        ("gradient numbers missing", cmp.grad_missing),
        ("performance regressions", cmp.perf_regressions),
        ("capabilities lost", cmp.capability_lost),
        ("fixed", cmp.fixed),
        ("still failing, status changed", cmp.changed_failures),
        ("performance improvements", cmp.perf_improvements),
        ("capabilities gained", cmp.capability_gained),
        ("error ratio no longer NaN", cmp.ratio_fixes),
        ("kernel variant changed", cmp.variant_changes),
    ]
    out += ["", "| change | count |", "|---|---|"] + [f"| {name} | {len(items)} |" for name, items in changes]

    def section(title: str, items: list, header: str, fmt) -> None:
        if not items:
            return  # the counts table above already says 0
        out.extend(["", f"## {title} ({len(items)})", "", header, "|" + "---|" * header.count("|", 1)])
        out.extend(_rows(items, fmt))

    section(
        "New failures",
        cmp.new_failures,
        "| family | case | old | new | reason |",
        lambda p: f"| {p.key[1]} | {p.key[0]} | {p.old.status.value} | {p.new.status.value} | {_cell(p.new.reason)} |",
    )
    section(
        "Error-ratio regressions",
        cmp.ratio_regressions,
        "| family | case | old ratio | new ratio | new status |",
        lambda p: f"| {p.key[1]} | {p.key[0]} | {_ratio(p.old)} | {_ratio(p.new)} | {p.new.status.value} |",
    )
    section(
        "Gradient regressions",
        cmp.grad_regressions,
        "| family | case | gradient | old ratio | new ratio | new status |",
        lambda g: (
            f"| {_family(g.new)} | {g.new.case_id} | {g.tensor} | {g.old_ratio:.3g} | {g.new_ratio:.3g} | "
            f"{g.new.status.value} |"
        ),
    )
    section(
        "Gradient numbers missing (not compared: fail closed)",
        cmp.grad_missing,
        "| family | case | gradient | lacking | why |",
        lambda g: f"| {_family(g.new)} | {g.new.case_id} | {g.tensor} | {g.side} | {_cell(g.why)} |",
    )
    section(
        "Performance regressions",
        cmp.perf_regressions,
        "| family | case | old median ms (p20-p80) | new median ms (p20-p80) | x |",
        lambda x: _perf_row(*x),
    )
    section(
        "Capabilities lost (supported -> unsupported)",
        cmp.capability_lost,
        "| family | case | old | new reason |",
        lambda p: f"| {p.key[1]} | {p.key[0]} | {p.old.status.value} | {_cell(p.new.reason)} |",
    )
    section(
        "Fixed",
        cmp.fixed,
        "| family | case | old | new |",
        lambda p: f"| {p.key[1]} | {p.key[0]} | {p.old.status.value} | {p.new.status.value} |",
    )
    section(
        "Still failing, status changed",
        cmp.changed_failures,
        "| family | case | old | new |",
        lambda p: f"| {p.key[1]} | {p.key[0]} | {p.old.status.value} | {p.new.status.value} |",
    )
    section(
        "Performance improvements",
        cmp.perf_improvements,
        "| family | case | old median ms (p20-p80) | new median ms (p20-p80) | x |",
        lambda x: _perf_row(*x),
    )
    section(
        "Capabilities gained (unsupported -> supported)",
        cmp.capability_gained,
        "| family | case | new |",
        lambda p: f"| {p.key[1]} | {p.key[0]} | {p.new.status.value} |",
    )
    section(
        "Error ratio no longer NaN",
        cmp.ratio_fixes,
        "| family | case | old ratio | new ratio | new status |",
        lambda p: f"| {p.key[1]} | {p.key[0]} | {_ratio(p.old)} | {_ratio(p.new)} | {p.new.status.value} |",
    )
    section(
        "Kernel variant changed (not a regression by itself)",
        cmp.variant_changes,
        "| family | case | old variant | new variant | numbers | new status |",
        lambda p: (
            f"| {p.key[1]} | {p.key[0]} | {_cell(_variant(p.old))} | {_cell(_variant(p.new))} | "
            f"{_moved(p)} | {p.new.status.value} |"
        ),
    )
    section(
        "Numerics changed (outputs not the same bits; a regression only where counted above)",
        cmp.numerics_changed,
        "| family | case | old status | new status | error ratio |",
        lambda p: (
            f"| {p.key[1]} | {p.key[0]} | {p.old.status.value} | {p.new.status.value} | "
            f"{_ratio(p.old)} -> {_ratio(p.new)} |"
        ),
    )
    section("Only in the old file", cmp.only_old, "| family | case |", lambda k: f"| {k[1]} | {k[0]} |")
    section("Only in the new file", cmp.only_new, "| family | case |", lambda k: f"| {k[1]} | {k[0]} |")
    return "\n".join(out) + "\n"


def _variant(r) -> str:
    """A variant as ``key=value`` pairs, keys sorted."""
    return ", ".join(f"{k}={v}" for k, v in sorted((variant_of(r) or {}).items()))


def _moved(p: Pair) -> str:
    moved = numbers_moved(p)
    if moved is None:
        return "not compared"
    return f"moved (ratio {_ratio(p.old)} -> {_ratio(p.new)})" if moved else "same"


def _perf_row(p: Pair, slowdown: float) -> str:
    to, tn = p.old.timing, p.new.timing
    assert to is not None and tn is not None
    return (
        f"| {p.key[1]} | {p.key[0]} | {to.median_ms:.4g} ({to.p20_ms:.4g}-{to.p80_ms:.4g}) | "
        f"{tn.median_ms:.4g} ({tn.p20_ms:.4g}-{tn.p80_ms:.4g}) | {slowdown:.2f} |"
    )
