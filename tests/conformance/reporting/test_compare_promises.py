"""compare's promises that the rule tests of test_compare.py leave open (found by `nox -s mutation`): each test is
named after the promise it checks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from conformance.records import Timing
from conformance.reporting.compare import compare_results
from tests.conformance.reporting.test_compare import rec


def _timed(r, p20: float, median: float, p80: float):
    return dataclasses.replace(r, timing=Timing(median_ms=median, p20_ms=p20, p80_ms=p80, reps=50, method="test"))


def test_auto_margin_is_the_p20_p80_spread_relative_to_the_median() -> None:
    """Spread (p80 - p20) / median: 0.8 / 2.0 = 0.4, not 0.8 x 2.0; the larger of the two sides counts."""
    old = [_timed(rec(f"c{i}"), 1.6, 2.0, 2.4) for i in range(3)]
    new = [_timed(rec(f"c{i}"), 1.9, 2.0, 2.1) for i in range(3)]
    cmp = compare_results(old, new)
    assert cmp.margin_auto and cmp.margin == pytest.approx(0.4)


def test_auto_margin_of_a_zero_median_is_no_spread() -> None:
    """A timing of 0 ms (a kernel below the clock's resolution) has no spread: the margin is the 2 % floor."""
    old = [_timed(rec(f"c{i}"), 0.0, 0.0, 0.0) for i in range(3)]
    cmp = compare_results(old, old)
    assert cmp.margin == pytest.approx(0.02) and not cmp.perf_regressions


def test_duplicated_pairs_are_counted_on_each_side() -> None:
    """A (case, family) pair recorded twice is counted (the last record wins, as in reports); none: 0."""
    assert compare_results([rec("a"), rec("b")], [rec("a"), rec("b")]).duplicates == 0
    cmp = compare_results([rec("a"), rec("a"), rec("b")], [rec("a"), rec("b"), rec("b"), rec("b", "fail")])
    assert cmp.duplicates == 3
    assert [p.key[0] for p in cmp.new_failures] == ["b"]  # the last record of b in NEW


@pytest.mark.parametrize("ratio", [True, "0.3", None, [0.3]])
def test_an_error_ratio_that_is_no_number_compares_like_nan(ratio) -> None:
    """A hand-edited ratio that is not a number (a bool, a string, null) is no number to compare: between two
    failing records, one where OLD had a number is a ratio regression, and a number where OLD had none a ratio fix.
    (In a ``pass`` record it makes the record a fail: a new failure, test_evidence.py.)"""
    old = [rec("a", "fail", ratio=3.0)]
    new = [dataclasses.replace(old[0], stats=dataclasses.replace(old[0].stats, error_ratio=ratio))]
    cmp = compare_results(old, new)
    assert [p.key[0] for p in cmp.ratio_regressions] == ["a"] and cmp.regressed and not cmp.ratio_fixes
    back = compare_results(new, old)
    assert [p.key[0] for p in back.ratio_fixes] == ["a"] and not back.regressed


def test_versions_are_the_headers_and_a_version_nobody_recorded_is_empty(tmp_path: Path) -> None:
    from conformance.reporting.compare import compare_files
    from conformance.results_writer import append_record
    from tests.conformance.reporting.test_compare import HEADER

    old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    for path, info in ((old, {"name": "fa-x", "family": "fa"}), (new, {"name": "fa-x", "version": "2.8.4"})):
        append_record(path, dataclasses.replace(HEADER, backends={"fa-x": info}))
        append_record(path, rec("a"))
    cmp = compare_files(old, new)
    assert cmp.old_versions == {"fa": ""}  # no version in the header or the record: empty, never None
    assert cmp.new_versions == {"fa": "", "fa-x": "2.8.4"}  # a header backend without a family: by its name


def _refused(r, reason: str):
    return dataclasses.replace(r, reason=reason)


def test_a_family_that_judged_nothing_says_where_it_judged_and_its_most_common_refusal() -> None:
    """Each family none of whose pairs was judged in both files gets one line: how many pairs each file judged,
    and the most common refusal of the side that refused (whitespace folded, at most 200 characters, ties to the
    first seen, "(no reason)" for an empty one)."""
    long = "no  sm90\n kernel " + "x" * 300
    old = [
        rec("a", family="lost"),
        rec("b", family="lost"),
        rec("c", family="lost"),
        _refused(rec("a", "unsupported", family="gained", ratio=None), "old refusal"),
        _refused(rec("b", "unsupported", family="gained", ratio=None), "other"),
        _refused(rec("a", "unsupported", family="never", ratio=None), "old reason, not counted"),
        rec("a", family="kept"),
    ]
    new = [
        _refused(rec("a", "unsupported", family="lost", ratio=None), long),
        _refused(rec("b", "unsupported", family="lost", ratio=None), "no sm90 kernel"),
        _refused(rec("c", "unsupported", family="lost", ratio=None), long),
        rec("a", family="gained"),
        rec("b", family="gained"),
        _refused(rec("a", "unsupported", family="never", ratio=None), ""),
        rec("a", family="kept"),
    ]
    folded = ("no sm90 kernel " + "x" * 300)[:200]
    assert compare_results(old, new).unjudged == [
        ("gained", "judged 2 of its 2 pairs in NEW and none in OLD; most common refusal: old refusal (1 of 2)"),
        ("lost", f"judged 3 of its 3 pairs in OLD and none in NEW; most common refusal: {folded} (2 of 3)"),
        ("never", "every one of its 1 pairs is unsupported in both files; most common refusal: (no reason) (1 of 1)"),
    ]


@pytest.mark.parametrize(
    ("rules", "ok"),
    [
        ({"ratio_threshold": 1.0}, True),  # inclusive bounds: a threshold of 1, a floor of 0, a margin of 0
        ({"ratio_floor": 0.0}, True),
        ({"perf_margin": 0.0}, True),
        ({"ratio_threshold": 1.5}, True),
        ({"ratio_threshold": 0.99}, False),
        ({"ratio_threshold": float("nan")}, False),
        ({"ratio_threshold": float("inf")}, False),
        ({"ratio_floor": -0.01}, False),
        ({"ratio_floor": float("inf")}, False),
        ({"perf_margin": -0.01}, False),
        ({"perf_margin": float("nan")}, False),
    ],
)
def test_rule_numbers_are_checked_with_inclusive_bounds(rules: dict, ok: bool) -> None:
    """A threshold >= 1, a floor >= 0 and a margin >= 0 or None (auto), every one finite; else ValueError naming it."""
    if ok:
        compare_results([rec("a")], [rec("a")], **rules)
        return
    (name,) = rules
    with pytest.raises(ValueError, match=rf"^{name} must be a finite number >= [01]"):
        compare_results([rec("a")], [rec("a")], **rules)


def test_the_comparison_records_the_rule_numbers_it_applied() -> None:
    """The summary states the threshold, floor and margin the comparison used (defaults 2, 0.5, auto)."""
    cmp = compare_results([rec("a")], [rec("a")], ratio_threshold=3.0, ratio_floor=0.25, perf_margin=0.1)
    assert (cmp.ratio_threshold, cmp.ratio_floor, cmp.margin, cmp.margin_auto) == (3.0, 0.25, 0.1, False)
    cmp = compare_results([rec("a")], [rec("a")])
    assert (cmp.ratio_threshold, cmp.ratio_floor, cmp.margin, cmp.margin_auto) == (2.0, 0.5, 0.02, True)


def test_identical_errors_count_the_pairs_whose_max_and_lse_errors_are_equal() -> None:
    old = [rec("a"), rec("b"), rec("c"), rec("d", "unsupported", ratio=None)]
    new = [rec("a"), rec("b"), rec("c", ratio=0.2), rec("d", "unsupported", ratio=None)]
    cmp = compare_results(old, new)
    assert (cmp.identical_errors, cmp.compared_errors) == (2, 3)
    lse = dataclasses.replace(new[0], stats=dataclasses.replace(new[0].stats, lse_max_abs=1e-3))
    assert compare_results(old[:1], [lse]).identical_errors == 0


def test_a_failure_that_stays_the_same_failure_is_no_change_and_fail_to_unsupported_is_a_lost_capability() -> None:
    old = [rec("same", "fail", ratio=3.0), rec("gone", "fail", ratio=3.0), rec("moved", "fail", ratio=3.0)]
    new = [rec("same", "fail", ratio=3.0), rec("gone", "unsupported", ratio=None), rec("moved", "error", ratio=None)]
    cmp = compare_results(old, new)
    assert [p.key[0] for p in cmp.changed_failures] == ["moved"]
    assert [p.key[0] for p in cmp.capability_lost] == ["gone"] and not cmp.fixed and not cmp.new_failures


def test_nan_ratios_on_both_sides_regress_unless_both_records_are_failures() -> None:
    """A hand-edited ``unsupported`` record with NaN statistics after a NaN failure: not two failures, so the NaN
    ratio fails closed."""
    nan = float("nan")
    old = [rec("both", "fail", ratio=nan), rec("one", "fail", ratio=nan)]
    new = [rec("both", "crash", ratio=nan), rec("one", "unsupported", ratio=nan)]
    assert [p.key[0] for p in compare_results(old, new).ratio_regressions] == ["one"]


@pytest.mark.parametrize(
    ("old", "new", "regressed"),
    [
        (0.3, 0.6, False),  # exactly threshold x old: not beyond it
        (0.3, 0.61, True),
        (0.1, 0.5, False),  # exactly the floor: not beyond it
        (0.1, 0.51, True),
    ],
)
def test_a_ratio_regression_must_exceed_both_the_threshold_and_the_floor(old, new, regressed) -> None:
    cmp = compare_results([rec("a", ratio=old)], [rec("a", ratio=new)])
    assert bool(cmp.ratio_regressions) is regressed


def test_a_pair_timed_on_one_side_only_is_not_compared_for_speed() -> None:
    old = [_timed(rec("a"), 1.0, 1.0, 1.0), rec("b")]
    new = [rec("a"), _timed(rec("b"), 9.0, 9.0, 9.0)]
    cmp = compare_results(old, new)
    assert not cmp.perf_regressions and not cmp.perf_improvements and cmp.margin == pytest.approx(0.02)


def test_a_performance_change_carries_its_median_slowdown() -> None:
    """new median / old median; an old median of 0 makes any measurable time an infinite slowdown."""
    old = [
        _timed(rec("fast"), 4.0, 4.0, 4.0),
        _timed(rec("faster"), 4.0, 4.0, 4.0),
        _timed(rec("short"), 0.5, 0.5, 0.5),
        _timed(rec("slow"), 2.0, 2.0, 2.0),
        _timed(rec("zero"), 0.0, 0.0, 0.0),
    ]
    new = [
        _timed(rec("fast"), 2.0, 2.0, 2.0),
        _timed(rec("faster"), 1.0, 1.0, 1.0),
        _timed(rec("short"), 0.75, 0.75, 0.75),
        _timed(rec("slow"), 3.0, 3.0, 3.0),
        _timed(rec("zero"), 0.5, 0.5, 0.5),
    ]
    cmp = compare_results(old, new, perf_margin=0.05)
    # regressions worst first, improvements best first
    assert [(p.key[0], s) for p, s in cmp.perf_regressions] == [("zero", float("inf")), ("short", 1.5), ("slow", 1.5)]
    assert [(p.key[0], s) for p, s in cmp.perf_improvements] == [("faster", 0.25), ("fast", 0.5)]


@pytest.mark.parametrize(
    ("old", "new", "verdict"),
    [
        ((1.0, 1.0, 1.0), (1.25, 1.25, 1.25), None),  # new p20 exactly old p80 x (1 + margin): not beyond it
        ((1.0, 1.0, 1.0), (1.26, 1.26, 1.26), "regression"),
        ((1.25, 1.25, 1.25), (1.0, 1.0, 1.0), None),  # new p80 x (1 + margin) exactly old p20
        ((1.26, 1.26, 1.26), (1.0, 1.0, 1.0), "improvement"),
        ((1.2, 1.2, 1.2), (1.0, 1.0, 1.0), None),  # 1.0 / 1.25 < 1.2, but 1.0 x 1.25 is not
    ],
)
def test_a_performance_change_must_exceed_the_margin_on_the_far_percentile(old, new, verdict) -> None:
    cmp = compare_results([_timed(rec("a"), *old)], [_timed(rec("a"), *new)], perf_margin=0.25)
    assert (bool(cmp.perf_regressions), bool(cmp.perf_improvements)) == (
        verdict == "regression",
        verdict == "improvement",
    )


def _file(path: Path, *records, header=None) -> Path:
    from conformance.results_writer import append_record
    from tests.conformance.reporting.test_compare import HEADER

    append_record(path, header or HEADER)
    for r in records:
        append_record(path, r)
    return path


def test_compare_files_refuses_by_default_what_it_can_be_told_to_accept(tmp_path: Path) -> None:
    """Lines that are not records, a subset, families outside NEW's backends, a pair recorded twice: refused
    unless asked (``allow_skipped``, ``allow_subset``, ``only_new_families``, ``drop_duplicates``); a family that
    judged nothing exits 4 unless ``allow_unjudged``."""
    from conformance.reporting.compare import CompareRefused, compare_files
    from tests.conformance.reporting.test_compare import HEADER

    old = _file(tmp_path / "old.jsonl", rec("a"), rec("b"))
    garbled = _file(tmp_path / "garbled.jsonl", rec("a"), rec("b"))
    with garbled.open("a") as f:
        f.write("{not json\n")
    with pytest.raises(CompareRefused):
        compare_files(old, garbled)
    cmp = compare_files(old, garbled, allow_skipped=True)
    assert cmp.new_skipped == ["line 4: not JSON"] and cmp.old_skipped == []
    assert (cmp.old_source, cmp.new_source) == (str(old), str(garbled))
    rules = compare_files(old, old, ratio_threshold=3.0, ratio_floor=0.25, perf_margin=0.1)
    assert (rules.ratio_threshold, rules.ratio_floor, rules.margin) == (3.0, 0.25, 0.1)  # passed on to the rules
    back = compare_files(garbled, old, allow_skipped=True)
    assert back.old_skipped == ["line 4: not JSON"] and back.new_skipped == []
    subset = _file(tmp_path / "subset.jsonl", rec("a"))
    with pytest.raises(CompareRefused):
        compare_files(old, subset)
    assert compare_files(old, subset, allow_subset=True).not_in_new == [("b", "fa")]
    fa_only = dataclasses.replace(HEADER, backends={"fa-x": {"name": "fa-x", "family": "fa"}})
    two = _file(tmp_path / "two.jsonl", rec("a"), rec("b"), rec("a", family="other"))
    narrow = _file(tmp_path / "narrow.jsonl", rec("a"), rec("b"), header=fa_only)
    with pytest.raises(CompareRefused):
        compare_files(two, narrow)
    scoped = compare_files(two, narrow, only_new_families=True)
    assert scoped.outside_scope == {"other": 1} and scoped.old_versions == {"fa": "", "fake": ""}  # "other" apart
    twice = _file(tmp_path / "twice.jsonl", rec("a"), rec("b"), rec("b"))
    with pytest.raises(CompareRefused):
        compare_files(old, twice)
    assert compare_files(old, twice, drop_duplicates=True).common == 2
    refused = _file(
        tmp_path / "refused.jsonl", rec("a", "unsupported", ratio=None), rec("b", "unsupported", ratio=None)
    )
    assert compare_files(refused, refused).exit_status == 4
    assert compare_files(refused, refused, allow_unjudged=True).exit_status == 0


@pytest.mark.parametrize("extra", [None, [], "digest"])
def test_a_record_whose_extra_is_no_object_carries_no_digest(extra) -> None:
    """A hand-edited ``extra`` that is no JSON object (null, a list, a string) carries no output digest: the pair is
    compared by its errors, and nothing fails on it."""
    old = [rec("a")]
    new = [dataclasses.replace(rec("a"), extra=extra)]
    cmp = compare_results(old, new)
    assert (cmp.compared_errors, cmp.digest_compared, cmp.numerics_changed) == (1, 0, [])


@pytest.mark.parametrize("digest", ["", 0, 123, ["x"], None])
def test_a_digest_that_is_no_nonempty_string_is_no_digest(digest) -> None:
    """An empty or non-string ``digest`` is no digest: two such records are compared by their errors (so different
    errors are moved numbers), and no pair is counted as compared by digest."""
    old = [dataclasses.replace(rec("a", ratio=0.1), extra={"digest": digest})]
    new = [dataclasses.replace(rec("a", ratio=0.2), extra={"digest": digest})]
    cmp = compare_results(old, new)
    assert cmp.digest_compared == 0 and [p.key[0] for p in cmp.numerics_changed] == ["a"]


def test_errors_are_compared_only_where_both_records_have_numbers() -> None:
    """A pair with statistics on one side only (a pass that became an error, an error that became a pass) is not
    an error comparison: ``compared`` counts the pairs with numbers on both sides."""
    old = [rec("a"), rec("b"), rec("c", "error", ratio=None)]
    new = [rec("a"), rec("b", "error", ratio=None), rec("c")]
    cmp = compare_results(old, new)
    assert (cmp.common, cmp.compared_errors, cmp.numerics_changed) == (3, 1, [])


@pytest.mark.parametrize("variant", [{}, [], "fa2", 0, None])
def test_a_variant_that_is_no_nonempty_object_is_no_variant(variant) -> None:
    """An empty or non-object ``extra["variant"]`` (a hand-edited file, an older record) names no variant: a pair
    whose other side names one is no variant change."""
    old = [dataclasses.replace(rec("a"), extra={"variant": variant})]
    new = [dataclasses.replace(rec("a"), extra={"variant": {"entry": "x"}})]
    assert compare_results(old, new).variant_changes == []
    assert compare_results(new, old).variant_changes == []
