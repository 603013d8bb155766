"""compare: a planted wrong backend of the same family regresses; identical runs do not; each rule."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from conformance.cases.case import AttentionCase
from conformance.verdict.check import check_backend, prepare_context
from conformance.cli import main
from conformance.reporting.compare import compare_results
from conformance.reporting.compare_markdown import render_markdown
from conformance.records import CheckResult, ErrorStats, Header, Status, Timing
from conformance.results_writer import append_record
from tests.conformance.fakes import ExactBackend, WindowOffByOneBackend

WINDOW_CASES = [
    AttentionCase(requests=((6, 6), (1, 9)), num_heads=2, num_kv_heads=1, head_dim=16, window=(2, 0)),
    AttentionCase(requests=((8, 8),), num_heads=2, num_kv_heads=2, head_dim=8, causal=True, window=(3, None)),
]

#: what `attnconf run --case-json` writes (custom cases, default tolerance); compare refuses a file without one
HEADER = Header(
    suite="custom",
    backends={"fake": {"name": "fake", "family": "fake"}},
    env={"run": {"seed": 0}},
    sweep={"suite": None, "seed": 0, "tol": []},
)


def test_planted_window_bug_regresses_identical_runs_do_not(tmp_path: Path) -> None:
    old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    for path in (old, new):
        append_record(path, HEADER)
    for case in WINDOW_CASES:
        ctx = prepare_context(case)
        append_record(old, check_backend(ctx, ExactBackend()))
        append_record(new, check_backend(ctx, WindowOffByOneBackend()))  # same family "fake", one bug
    summary = tmp_path / "summary.md"
    assert main(["compare", str(old), str(new), "--out", str(summary)]) == 1
    text = summary.read_text()
    assert "REGRESSED" in text and "## New failures (2)" in text
    assert all(c.id in text for c in WINDOW_CASES)
    assert main(["compare", str(old), str(old)]) == 0
    assert main(["compare", str(new), str(old)]) == 0  # the reverse direction only fixes things
    assert main(["compare", str(old), str(new), "--perf-threshold", "fast"]) == 2


def rec(
    case_id: str,
    status: str = "pass",
    family: str = "fa",
    ratio: float | None = 0.1,
    timing: tuple[float, float, float] | None = None,
) -> CheckResult:
    stats = (
        None
        if ratio is None
        else ErrorStats(
            max_abs=ratio,
            max_rel=ratio,
            mean_abs=ratio,
            worst=(0, 0, 0),
            mismatch_frac=0.0,
            error_ratio=ratio,
            baseline_max_abs=1.0,
            baseline_mean_abs=1.0,
            allowed_max_abs=1.0,
            cosine=1.0,
        )
    )
    t = (
        None
        if timing is None
        else Timing(median_ms=timing[1], p20_ms=timing[0], p80_ms=timing[2], reps=50, method="test")
    )
    return CheckResult(
        case_id=case_id,
        backend=family + "-x",
        family=family,
        status=Status(status),
        case={},
        stats=stats,
        timing=t,
    )


def test_each_rule() -> None:
    old = [
        rec("same"),
        rec("breaks"),
        rec("heals", "fail", ratio=5.0),
        rec("drifts", ratio=0.2),
        rec("noise", ratio=0.1),
        rec("slower", timing=(1.0, 1.02, 1.04)),
        rec("jitter", timing=(1.0, 1.02, 1.04)),
        rec("faster", timing=(2.0, 2.02, 2.04)),
        rec("dropped", "pass", ratio=0.1),
        rec("gained", "unsupported", ratio=None),
        rec("gone"),
        rec("crashy", "fail", ratio=9.0),
    ]
    new = [
        rec("same"),
        rec("breaks", "crash", ratio=None),
        rec("heals"),
        rec("drifts", ratio=0.9),
        rec("noise", ratio=0.4),
        rec("slower", timing=(1.2, 1.22, 1.24)),
        rec("jitter", timing=(1.03, 1.05, 1.07)),
        rec("faster", timing=(1.0, 1.02, 1.04)),
        rec("dropped", "unsupported", ratio=None),
        rec("gained"),
        rec("fresh"),
        rec("crashy", "crash", ratio=None),
    ]
    cmp = compare_results(old, new, perf_margin=0.05)
    ids = lambda pairs: [p.key[0] for p in pairs]
    assert ids(cmp.new_failures) == ["breaks"]
    assert ids(cmp.fixed) == ["heals"]
    assert ids(cmp.changed_failures) == ["crashy"]
    assert ids(cmp.ratio_regressions) == ["drifts"]  # 0.1 -> 0.4 grew 4x but stays under the 0.5 floor
    assert [p.key[0] for p, _ in cmp.perf_regressions] == ["slower"]  # jitter: new p20 1.03 < old p80 1.04 x 1.05
    assert [p.key[0] for p, _ in cmp.perf_improvements] == ["faster"]
    assert ids(cmp.capability_lost) == ["dropped"] and ids(cmp.capability_gained) == ["gained"]
    assert cmp.only_old == [("gone", "fa")] and cmp.only_new == [("fresh", "fa")]
    assert cmp.regressed
    text = render_markdown(cmp)
    assert "## Performance regressions (1)" in text and "| fa | slower |" in text


def test_auto_margin_follows_the_measured_spread() -> None:
    noisy = [rec(f"c{i}", timing=(0.8, 1.0, 1.2)) for i in range(5)]  # 40 % spread
    slower = [
        dataclasses.replace(r, timing=dataclasses.replace(r.timing, p20_ms=1.3, median_ms=1.4, p80_ms=1.5))
        for r in noisy
    ]
    cmp = compare_results(noisy, slower)  # 1.3 > 1.2 but not by the 40 % noise margin
    assert cmp.margin_auto and cmp.margin == pytest.approx(0.4)
    assert not cmp.perf_regressions and not cmp.regressed
    assert compare_results(noisy, slower, perf_margin=0.0).perf_regressions


def test_join_is_by_family_not_backend_name() -> None:
    old = [rec("a", family="fam")]
    new = [dataclasses.replace(rec("a", "fail", family="fam"), backend="renamed-adapter")]
    cmp = compare_results(old, new)
    assert [p.key for p in cmp.new_failures] == [("a", "fam")] and not cmp.only_new


def test_families_in_one_file_only_are_summarised_and_identical_numerics_counted() -> None:
    old = [rec("a"), rec("b", ratio=0.2)]
    new = [rec("a"), rec("b", ratio=0.3), rec("a", family="other"), rec("c", family="other")]
    cmp = compare_results(old, new)
    assert cmp.only_new == [] and cmp.families_only_new == {"other": 2}
    assert (cmp.identical_errors, cmp.compared_errors) == (1, 2)
    text = render_markdown(cmp)
    assert "Families only in the new file, not compared: other (2 records)." in text
    assert (
        "Numerics: 2 of the 2 pairs in both files have error statistics in both runs; of those, 1 unchanged, 1 "
        "changed. All 2 compared by max error and LSE error (the same errors, not proven the same bits): the records "
        "carry no output digest."
    ) in text


def test_the_numerics_line_says_what_was_compared_and_what_changed_each_way() -> None:
    """Issue 28's worked example read "1417 of 1417 pairs checked ... 0 by their output digests ..., 1417 by their
    max error ... only; 0 changed": which pairs, and which counts were changes, was unclear.  Now: the pairs with
    numbers of all the pairs in both files, why the others have none, unchanged and changed, and the changed ones
    per way of comparing."""

    def digest(r: CheckResult, d: str) -> CheckResult:
        return dataclasses.replace(r, extra={"digest": d})

    old = [digest(rec("a"), "1:-"), digest(rec("b"), "2:-"), rec("c"), rec("d"), rec("e", "unsupported", ratio=None)]
    new = [digest(rec("a"), "1:-"), digest(rec("b"), "9:-"), rec("c"), rec("d", ratio=0.2), rec("e", ratio=None)]
    new[4] = dataclasses.replace(new[4], status=Status.UNSUPPORTED)
    cmp = compare_results(old, new)
    assert (cmp.common, cmp.compared_errors, cmp.digest_compared, len(cmp.numerics_changed)) == (5, 4, 2, 2)
    assert (
        "Numerics: 4 of the 5 pairs in both files have error statistics in both runs (the other 1 lack them on one "
        "side or both: unsupported, or no output compared); of those, 2 unchanged, 2 changed. Compared bit for bit "
        "by their output digests: 2 (1 changed); by max error and LSE error (the same errors, not proven the same "
        "bits), where a record has no digest: 2 (1 changed)."
    ) in render_markdown(cmp)
    only_digests = compare_results(old[:2], new[:2])
    assert "of those, 1 unchanged, 1 changed. All 2 compared bit for bit by their output digests." in (
        render_markdown(only_digests)
    )
    assert "Numerics:" not in render_markdown(compare_results(old[4:], new[4:]))  # nothing with numbers: no line


@pytest.mark.parametrize("problem", ["fail", "error", "crash", "timeout"])
def test_compare_flags_unsupported_to_fail_as_new_failure(problem: str) -> None:
    """A case the backend refused in OLD and fails in NEW is a new failure (a regression), not just a capability
    gained: the rule is "a non-problem status became a problem", whichever non-problem status OLD had."""
    old = [rec("refused", "unsupported", ratio=None), rec("held")]
    new = [rec("refused", problem, ratio=None), rec("held")]
    cmp = compare_results(old, new)
    assert [p.key[0] for p in cmp.new_failures] == ["refused"]
    assert [p.key[0] for p in cmp.capability_gained] == ["refused"]
    assert cmp.regressed and cmp.exit_status == 1
