"""Diff two results files: what an upgrade (kernel version, driver, harness) changed.

Records are joined by (case id, backend family), so ``fa2`` 2.8.3 in the old file meets ``fa2``
2.8.4 in the new one, and a renamed adapter of one family still joins.  Reported:

* new failures: a non-problem status (pass, unsupported) became fail/error/crash/timeout;
* fixed: a problem became pass; changed failures: one problem status became another;
* error-ratio regressions (among pairs that are not new failures): both runs compared outputs and the new ratio
  exceeds ``ratio_threshold`` times the old one and ``ratio_floor``.  A NaN ratio fails closed: NaN in NEW where
  OLD is a number is a regression; NaN in both is a regression unless both records are failures already;
* ratio fixes: an error ratio that was NaN in OLD and is a number in NEW;
* performance regressions beyond measured noise: new p20 > old p80 x (1 + margin), with the default
  ``margin=None`` ("auto") the median relative p20-p80 spread of the pairs (at least 2 %); improvements
  symmetrically (new p80 < old p20 / (1 + margin));
* capability changes (supported <-> unsupported) and cases present in only one file;
* kernel variant changes (not a regression by themselves): pairs whose records both name the kernel variant that
  ran (``extra["variant"]``) and the two differ, each with whether its numbers moved (:func:`numbers_moved`);
* gradient regressions of backward cases (:mod:`conformance.backward.diff`): each of dQ, dK, dV, d sinks by the
  error-ratio rule above, and gradient numbers one run has and the other lacks (fail closed).

A comparison *regressed* when there is a new failure, an error-ratio, gradient or performance regression, missing
gradient numbers, or a lost capability; ``attnconf compare`` then exits 1.  It *judged nothing*
(:attr:`Comparison.unjudged`) for a backend family none of whose compared pairs was judged (not ``unsupported``)
in both files; a gate never passes on that, so ``attnconf compare`` exits 4 (``NO_EVIDENCE``) unless
``allow_unjudged``; a regression (1) takes precedence.  Pairs judged on both sides while others are unsupported on
one side only are capability changes (lost: a regression; gained: not).

Records are counted by :attr:`conformance.records.CheckResult.effective_status`: a ``pass`` record whose statistics
are NaN or inf is a ``fail`` (``nonfinite_passes`` counts them per side, and the summary says so).

:func:`compare_files` first checks that the files may be compared at all
(:mod:`conformance.reporting.compare_inputs`: readable, one suite, one tolerance, NEW holding every pair of
OLD) and raises :class:`CompareRefused` otherwise (``attnconf compare`` exits 2).  What a comparison leaves out
by request (``allow_subset``, ``only_new_families``, ``allow_skipped``) is counted in its summary and JSON.
Why the thresholds are what they are: ``docs/concepts/running.md`` (*compare*, *Thresholds and noise*).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from conformance.backward.diff import GradChange, GradMissing, gradient_diffs
from conformance.exits import Exit
from conformance.records import CheckResult, Header, judged_results, Status
from conformance.reporting.compare_inputs import CompareRefused, check_inputs

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11

__all__ = [
    "MAX_ROWS",
    "CompareRefused",
    "CompareRules",
    "Comparison",
    "Pair",
    "compare_files",
    "compare_results",
    "numbers_moved",
    "variant_of",
]

Key = tuple[str, str]
MAX_ROWS = 200  # per section of the Markdown summary; the counts are always complete


@dataclass(frozen=True)
class Pair:
    old: CheckResult
    new: CheckResult

    @property
    def key(self) -> Key:
        return (self.new.case_id, _family(self.new))


@dataclass
class Comparison:
    """Every difference found; see the module docstring for the categories."""

    old_source: str = "old"
    new_source: str = "new"
    old_versions: dict[str, str] = field(default_factory=dict)
    new_versions: dict[str, str] = field(default_factory=dict)
    common: int = 0
    new_failures: list[Pair] = field(default_factory=list)
    fixed: list[Pair] = field(default_factory=list)
    changed_failures: list[Pair] = field(default_factory=list)
    ratio_regressions: list[Pair] = field(default_factory=list)
    grad_regressions: list[GradChange] = field(default_factory=list)
    grad_missing: list[GradMissing] = field(default_factory=list)
    perf_regressions: list[tuple[Pair, float]] = field(default_factory=list)
    perf_improvements: list[tuple[Pair, float]] = field(default_factory=list)
    capability_lost: list[Pair] = field(default_factory=list)
    capability_gained: list[Pair] = field(default_factory=list)
    only_old: list[Key] = field(default_factory=list)
    only_new: list[Key] = field(default_factory=list)
    #: families present in one file only (e.g. a one-backend run compared with a full run): counts
    families_only_old: dict[str, int] = field(default_factory=dict)
    families_only_new: dict[str, int] = field(default_factory=dict)
    #: pairs with error statistics in both files (checked); of them, those whose outputs differ are
    #: :attr:`numerics_changed`, the rest :attr:`identical_errors`
    compared_errors: int = 0
    #: the checked pairs whose outputs are not the same (:func:`numbers_moved`), in key order
    numerics_changed: list[Pair] = field(default_factory=list)
    #: of the checked pairs, those both of whose records carry an output digest (compared bit for bit)
    digest_compared: int = 0
    duplicates: int = 0
    margin: float = 0.0
    margin_auto: bool = True
    ratio_threshold: float = 2.0
    ratio_floor: float = 0.5
    #: what the comparison left out by request: OLD pairs NEW lacks (allow_subset), OLD families outside
    #: NEW's backends (only_new_families), lines of each file that were not records (allow_skipped)
    not_in_new: list[Key] = field(default_factory=list)
    outside_scope: dict[str, int] = field(default_factory=dict)
    old_skipped: list[str] = field(default_factory=list)
    new_skipped: list[str] = field(default_factory=list)
    old_suite: str = ""
    new_suite: str = ""
    tolerance: str = ""
    notes: list[str] = field(default_factory=list)
    #: pairs whose error ratio was NaN in OLD and is a number in NEW
    ratio_fixes: list[Pair] = field(default_factory=list)
    #: (family, why) of each family none of whose compared pairs was judged in both files
    unjudged: list[tuple[str, str]] = field(default_factory=list)
    #: ``--allow-unjudged``: such a family does not make the comparison exit 4 (it is still listed)
    allow_unjudged: bool = False
    #: ``pass`` records with non-finite statistics, counted as fails, per side (``old``, ``new``)
    nonfinite_passes: dict[str, int] = field(default_factory=dict)
    #: what reading the files noted (a newer writer's schema, duplicates dropped), ``PATH: note``
    file_notes: list[str] = field(default_factory=list)
    #: pairs whose kernel variant (``extra["variant"]``) is recorded in both files and differs
    variant_changes: list[Pair] = field(default_factory=list)

    @property
    def identical_errors(self) -> int:
        """Checked pairs whose outputs are the same bits (:func:`numbers_moved`: by the output digest where both
        records carry one, else by equal max error and LSE error)."""
        return self.compared_errors - len(self.numerics_changed)

    @property
    def exit_status(self) -> Exit:
        """1 regressed; 4 a family judged nothing (unless ``allow_unjudged``); else 0."""
        if self.regressed:
            return Exit.PROBLEMS
        if self.unjudged and not self.allow_unjudged:
            return Exit.NO_EVIDENCE
        return Exit.OK

    @property
    def verdict(self) -> str:
        """``regressed``, ``nothing judged`` or ``no regression`` (as :attr:`exit_status` decides)."""
        return {Exit.PROBLEMS: "regressed", Exit.NO_EVIDENCE: "nothing judged"}.get(self.exit_status, "no regression")

    @property
    def regressed(self) -> bool:
        return bool(
            self.new_failures
            or self.ratio_regressions
            or self.grad_regressions
            or self.grad_missing
            or self.perf_regressions
            or self.capability_lost
        )


def _family(r: CheckResult) -> str:
    return r.family or r.backend


def _index(results: list[CheckResult]) -> tuple[dict[Key, CheckResult], int]:
    out: dict[Key, CheckResult] = {}
    dup = 0
    for r in results:
        key = (r.case_id, _family(r))
        dup += key in out
        out[key] = r  # the last record wins, as in reports
    return out, dup


def variant_of(r: CheckResult) -> dict | None:
    """The kernel variant a record names (``extra["variant"]``), or None (an older record, a composition)."""
    v = r.extra.get("variant") if isinstance(r.extra, dict) else None
    return v if isinstance(v, dict) and v else None


def _digest(r: CheckResult) -> str | None:
    d = r.extra.get("digest") if isinstance(r.extra, dict) else None
    return d if isinstance(d, str) and d else None


def numbers_moved(p: Pair) -> bool | None:
    """Whether the pair's output changed between the files: by the output digests (``extra["digest"]``:
    :func:`conformance.verdict.check.output_digest`) when both records carry one, else by their max error and LSE
    error (two kernels that both round right can share those with other bits); None when one side has no numbers."""
    so, sn = p.old.stats, p.new.stats
    if so is None or sn is None:
        return None
    do, dn = _digest(p.old), _digest(p.new)
    if do is not None and dn is not None:
        return do != dn
    return not (so.max_abs == sn.max_abs and so.lse_max_abs == sn.lse_max_abs)


def _nan(x: object) -> bool:
    """An error ratio that is no number to compare (NaN, or not a number at all in a hand-edited file)."""
    return not isinstance(x, (int, float)) or isinstance(x, bool) or math.isnan(x)


def _unjudged(pairs: list[Pair]) -> list[tuple[str, str]]:
    """(family, why) of each family none of whose pairs is judged (not unsupported) in both files."""
    by_family: dict[str, list[Pair]] = {}
    for p in pairs:
        by_family.setdefault(p.key[1], []).append(p)
    out = []
    for fam, ps in sorted(by_family.items()):
        if any(p.old.status is not Status.UNSUPPORTED and p.new.status is not Status.UNSUPPORTED for p in ps):
            continue
        old_judged = sum(p.old.status is not Status.UNSUPPORTED for p in ps)
        new_judged = sum(p.new.status is not Status.UNSUPPORTED for p in ps)
        refused = [p.new.reason if p.new.status is Status.UNSUPPORTED else p.old.reason for p in ps]
        reason, n = Counter(" ".join((r or "(no reason)").split())[:200] for r in refused).most_common()[0]
        where = (
            f"judged {old_judged} of its {len(ps)} pairs in OLD and none in NEW"
            if old_judged
            else f"judged {new_judged} of its {len(ps)} pairs in NEW and none in OLD"
            if new_judged
            else f"every one of its {len(ps)} pairs is unsupported in both files"
        )
        out.append((fam, f"{where}; most common refusal: {reason} ({n} of {len(ps)})"))
    return out


def _check_rules(ratio_threshold: float, ratio_floor: float, perf_margin: float | None) -> None:
    """The rules' numbers (the command line checks them first: :mod:`conformance.running.usage`)."""
    if not (math.isfinite(ratio_threshold) and ratio_threshold >= 1):
        raise ValueError(f"ratio_threshold must be a finite number >= 1, got {ratio_threshold}")
    if not (math.isfinite(ratio_floor) and ratio_floor >= 0):
        raise ValueError(f"ratio_floor must be a finite number >= 0, got {ratio_floor}")
    if perf_margin is not None and not (math.isfinite(perf_margin) and perf_margin >= 0):
        raise ValueError(f"perf_margin must be a finite number >= 0 or None (auto), got {perf_margin}")


def _spread(r: CheckResult) -> float:
    t = r.timing
    assert t is not None
    return (t.p80_ms - t.p20_ms) / t.median_ms if t.median_ms > 0 else 0.0


def _versions(headers: list[Header], results: list[CheckResult]) -> dict[str, str]:
    out = {_family(r): r.version for r in results}
    for h in headers:
        for name, info in h.backends.items():
            out[info.get("family") or name] = info.get("version", "")
    return out


class CompareRules(TypedDict, total=False):
    """The rules :func:`compare_results` takes by keyword (its defaults when left out)."""

    ratio_threshold: float
    ratio_floor: float
    perf_margin: float | None


def compare_results(
    old: list[CheckResult],
    new: list[CheckResult],
    *,
    ratio_threshold: float = 2.0,
    ratio_floor: float = 0.5,
    perf_margin: float | None = None,
) -> Comparison:
    """Join by (case id, family) and classify every difference (records counted by their effective status);
    ``ValueError`` for a rule number out of range (a threshold below 1, a NaN or infinite one, a negative floor)."""
    _check_rules(ratio_threshold, ratio_floor, perf_margin)
    old, old_nonfinite = judged_results(old)
    new, new_nonfinite = judged_results(new)
    old_ix, dup_old = _index(old)
    new_ix, dup_new = _index(new)
    cmp = Comparison(duplicates=dup_old + dup_new, ratio_threshold=ratio_threshold, ratio_floor=ratio_floor)
    cmp.nonfinite_passes = {"old": old_nonfinite, "new": new_nonfinite}
    shared = {k[1] for k in old_ix} & {k[1] for k in new_ix}
    for ix, mine, other in ((old_ix, "only_old", new_ix), (new_ix, "only_new", old_ix)):
        setattr(cmp, mine, sorted(k for k in set(ix) - set(other) if k[1] in shared))
        counts = getattr(cmp, "families_" + mine)
        for k in ix:
            if k[1] not in shared:
                counts[k[1]] = counts.get(k[1], 0) + 1
    pairs = [Pair(old_ix[k], new_ix[k]) for k in sorted(set(old_ix) & set(new_ix))]
    cmp.common = len(pairs)
    for p in pairs:
        so, sn = p.old.stats, p.new.stats
        if so is not None and sn is not None:
            cmp.compared_errors += 1
            if numbers_moved(p):
                cmp.numerics_changed.append(p)
            cmp.digest_compared += _digest(p.old) is not None and _digest(p.new) is not None
    for p in pairs:
        vo, vn = variant_of(p.old), variant_of(p.new)
        if vo is not None and vn is not None and vo != vn:
            cmp.variant_changes.append(p)
        o, n = p.old.status, p.new.status
        if not o.is_problem and n.is_problem:
            cmp.new_failures.append(p)
        elif o.is_problem and n is Status.PASS:
            cmp.fixed.append(p)
        elif o.is_problem and n.is_problem and o is not n:
            cmp.changed_failures.append(p)
        if o is not Status.UNSUPPORTED and n is Status.UNSUPPORTED:
            cmp.capability_lost.append(p)
        elif o is Status.UNSUPPORTED and n is not Status.UNSUPPORTED:
            cmp.capability_gained.append(p)
        if p.old.stats is not None and p.new.stats is not None and not (n.is_problem and not o.is_problem):
            r_old, r_new = p.old.stats.error_ratio, p.new.stats.error_ratio
            if _nan(r_new):  # no number to compare: fail closed, unless both were failures already
                if not _nan(r_old) or not (o.is_problem and n.is_problem):
                    cmp.ratio_regressions.append(p)
            elif _nan(r_old):
                cmp.ratio_fixes.append(p)
            elif r_new > ratio_floor and r_new > ratio_threshold * r_old:
                cmp.ratio_regressions.append(p)
    cmp.unjudged = _unjudged(pairs)
    cmp.grad_regressions, cmp.grad_missing = gradient_diffs(
        ((p.old, p.new) for p in pairs), ratio_threshold=ratio_threshold, ratio_floor=ratio_floor
    )
    timed = [p for p in pairs if p.old.timing is not None and p.new.timing is not None]
    if perf_margin is None:
        spreads = [max(_spread(p.old), _spread(p.new)) for p in timed]
        cmp.margin, cmp.margin_auto = max(0.02, statistics.median(spreads)) if spreads else 0.02, True
    else:
        cmp.margin, cmp.margin_auto = perf_margin, False
    for p in timed:
        to, tn = p.old.timing, p.new.timing
        # no mutate: for the type checker; `timed` holds only pairs timed on both sides
        assert to is not None and tn is not None  # pragma: no mutate
        slowdown = tn.median_ms / to.median_ms if to.median_ms > 0 else math.inf
        if tn.p20_ms > to.p80_ms * (1 + cmp.margin):
            cmp.perf_regressions.append((p, slowdown))
        elif tn.p80_ms * (1 + cmp.margin) < to.p20_ms:
            cmp.perf_improvements.append((p, slowdown))
    cmp.perf_regressions.sort(key=lambda x: -x[1])
    cmp.perf_improvements.sort(key=lambda x: x[1])
    return cmp


def compare_files(
    old: Path | str,
    new: Path | str,
    *,
    allow_skipped: bool = False,
    allow_subset: bool = False,
    only_new_families: bool = False,
    allow_unjudged: bool = False,
    drop_duplicates: bool = False,
    **kwargs: Unpack[CompareRules],
) -> Comparison:
    """:func:`compare_results` on two results files, with their sources and package versions;
    :class:`CompareRefused` when they may not be compared (:func:`check_inputs`).  ``allow_unjudged``: a family
    that judged nothing does not make :attr:`Comparison.exit_status` 4."""
    from conformance.reporting.compare_inputs import suite_of, tolerance_of

    ins = check_inputs(
        old,
        new,
        allow_skipped=allow_skipped,
        allow_subset=allow_subset,
        only_new_families=only_new_families,
        drop_duplicates=drop_duplicates,
    )
    cmp = compare_results(ins.old_results, ins.new_results, **kwargs)
    cmp.allow_unjudged = allow_unjudged
    cmp.old_source, cmp.new_source = str(old), str(new)
    old_h, new_h = list(ins.old.headers), list(ins.new.headers)
    cmp.old_versions, cmp.new_versions = _versions(old_h, ins.old_results), _versions(new_h, ins.new_results)
    cmp.not_in_new, cmp.outside_scope, cmp.notes = ins.not_in_new, ins.outside_scope, ins.notes
    cmp.file_notes = ins.file_notes
    # families outside NEW's scope are listed on their own line, not as families the new run lost
    cmp.old_versions = {k: v for k, v in cmp.old_versions.items() if k not in cmp.outside_scope}
    cmp.old_skipped = [str(s) for s in ins.old.skipped]
    cmp.new_skipped = [str(s) for s in ins.new.skipped]
    cmp.old_suite, cmp.new_suite = suite_of(old_h[0]), suite_of(new_h[0])
    cmp.tolerance = tolerance_of(new_h[0])[1]
    return cmp
