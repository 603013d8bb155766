"""A gate needs evidence (issue 29): compare exits 4 when a family judged nothing, a NaN error ratio fails closed,
and a record marked pass whose statistics are NaN or inf is counted as a fail by every reader (report, compare,
ledger audit, run's summary), which says so."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from conformance.cli import main
from conformance.records import CheckResult, judged_results, NONFINITE_PASS, Status
from conformance.results_file import read_records
from conformance.reporting.compare import compare_results
from conformance.running.outcome import RunSummary
from tests.conformance.reporting.test_fail_closed import CASES, FAMILIES, full, header, result, write


def unsupported(r: CheckResult, reason: str = "runs on cuda, not cpu") -> CheckResult:
    return dataclasses.replace(r, status=Status.UNSUPPORTED, stats=None, reason=reason)


def nan_pass(r: CheckResult, **stats: float) -> CheckResult:
    """A record marked pass whose statistics hold NaN/inf (an older or buggy writer, or a hand edit)."""
    assert r.status is Status.PASS and r.stats is not None
    return dataclasses.replace(r, stats=dataclasses.replace(r.stats, **(stats or {"max_abs": math.nan})))


def compare(capsys, old: Path, new: Path, *extra: str) -> tuple[int, str, str]:
    status = main(["compare", str(old), str(new), *extra])
    out = capsys.readouterr()
    return status, out.out, out.err


# ------------------------------------------------------------------------------- compare: nothing judged, exit 4


def test_compare_of_two_files_whose_every_pair_is_unsupported_exits_4(tmp_path: Path, capsys) -> None:
    every = [unsupported(r) for r in full()]
    old = write(tmp_path / "old.jsonl", header(), *every)
    new = write(tmp_path / "new.jsonl", header(), *every)
    summary = tmp_path / "c.json"
    status, out, err = compare(capsys, old, new, "--json", str(summary))
    assert status == 4
    assert "NOTHING JUDGED" in out and "Nothing judged: family kern every one of its 3 pairs is unsupported" in out
    assert err.splitlines() == [
        f"attnconf compare: nothing judged: family {f} every one of its 3 pairs is unsupported in both files; most "
        "common refusal: runs on cuda, not cpu (3 of 3)"
        for f in sorted(FAMILIES)
    ]
    data = json.loads(summary.read_text())
    assert data["exit_status"] == 4 and data["verdict"] == "nothing judged"
    assert [u["family"] for u in data["unjudged"]] == sorted(FAMILIES) and not data["allow_unjudged"]
    status, out, _ = compare(capsys, old, new, "--allow-unjudged")
    assert status == 0 and "no regression" in out and "(accepted with --allow-unjudged)" in out


def test_a_new_run_on_a_machine_without_the_kernel_regresses_and_is_named(tmp_path: Path, capsys) -> None:
    """OLD judged every pair of family kern, NEW none: the lost capabilities regress (1 before 4), and the
    summary says the family judged nothing."""
    old = write(tmp_path / "old.jsonl", header(), *full())
    new = write(tmp_path / "new.jsonl", header(), *[unsupported(r) if r.family == "kern" else r for r in full()])
    status, out, err = compare(capsys, old, new)
    assert status == 1 and "REGRESSED" in out and "| capabilities lost | 3 |" in out
    assert "Nothing judged: family kern judged 3 of its 3 pairs in OLD and none in NEW" in out
    assert "nothing judged: family kern" in err


def test_a_family_unsupported_in_both_beside_a_judged_one_still_exits_4(tmp_path: Path, capsys) -> None:
    records = [unsupported(r) if r.family == "other" else r for r in full()]
    old = write(tmp_path / "old.jsonl", header(), *records)
    new = write(tmp_path / "new.jsonl", header(), *records)
    status, out, err = compare(capsys, old, new)
    assert status == 4 and err.count("nothing judged") == 1 and "family other" in err


def test_pairs_unsupported_on_one_side_only_beside_judged_ones_are_capability_changes(tmp_path: Path, capsys) -> None:
    """Some pairs judged on both sides, others unsupported on one side only: lost (a regression) or gained
    capability, never 'nothing judged'."""
    base = full()
    lost = [unsupported(r) if r.case_id == CASES[0].id else r for r in base]
    gained_old = [unsupported(r) if r.case_id == CASES[1].id else r for r in base]
    old = write(tmp_path / "old.jsonl", header(), *base)
    status, out, err = compare(capsys, old, write(tmp_path / "lost.jsonl", header(), *lost))
    assert status == 1 and "| capabilities lost | 2 |" in out and "nothing judged" not in (out + err).lower()
    old2 = write(tmp_path / "old2.jsonl", header(), *gained_old)
    status, out, err = compare(capsys, old2, old)
    assert status == 0 and "| capabilities gained | 2 |" in out and "nothing judged" not in (out + err).lower()


# ------------------------------------------------------------------------------- compare: a NaN error ratio


def test_compare_with_a_nan_ratio_in_new_exits_1(tmp_path: Path, capsys) -> None:
    """Both records fail (a fail with a NaN ratio is no new failure): NaN where OLD had a number regresses."""
    old_records = [result(CASES[0], "kern", "fail", ratio=1.5)] + full()[1:]
    new_records = [
        dataclasses.replace(old_records[0], stats=dataclasses.replace(old_records[0].stats, error_ratio=math.nan))
    ]
    new_records += full()[1:]
    old = write(tmp_path / "old.jsonl", header(), *old_records)
    new = write(tmp_path / "new.jsonl", header(), *new_records)
    summary = tmp_path / "c.json"
    status, out, _ = compare(capsys, old, new, "--json", str(summary))
    assert status == 1 and "| error-ratio regressions | 1 |" in out and "| kern | " in out and "| nan |" in out
    data = json.loads(summary.read_text())
    assert [r["case_id"] for r in data["regressions"]["ratio_regressions"]] == [CASES[0].id]
    assert data["regressions"]["ratio_regressions"][0]["new_ratio"] == "nan"  # JSON has no NaN: its name
    # the reverse: NaN in OLD, a number in NEW is a ratio fix, not a regression
    status, out, _ = compare(capsys, new, old)
    assert status == 0 and "| error ratio no longer NaN | 1 |" in out


@pytest.mark.parametrize(
    ("old_status", "old_ratio", "new_status", "new_ratio", "regression", "fix"),
    [
        ("fail", 1.5, "fail", math.nan, True, False),
        ("fail", math.nan, "fail", 1.5, False, True),
        ("fail", math.nan, "fail", math.nan, False, False),  # both failures already: nothing changed
        ("fail", math.inf, "fail", math.nan, True, False),
        ("pass", 0.1, "pass", 0.1, False, False),
        ("fail", 1.5, "fail", 4.0, True, False),
    ],
)
def test_the_nan_ratio_rule(old_status, old_ratio, new_status, new_ratio, regression: bool, fix: bool) -> None:
    old = result(CASES[0], "kern", old_status, ratio=old_ratio)
    new = result(CASES[0], "kern", new_status, ratio=new_ratio)
    cmp = compare_results([old], [new])
    assert bool(cmp.ratio_regressions) is regression and bool(cmp.ratio_fixes) is fix
    assert cmp.exit_status == (1 if regression else 0)


def test_a_nan_ratio_on_both_sides_of_a_pass_is_a_regression_by_effective_status() -> None:
    """A pass record with a NaN ratio is a fail: two of them are no regression of the ratio (both failures), and
    a pass becoming one is a new failure."""
    good = result(CASES[0], "kern", "pass", ratio=0.1)
    bad = nan_pass(good, error_ratio=math.nan)
    assert compare_results([good], [bad]).new_failures and compare_results([good], [bad]).exit_status == 1
    assert compare_results([bad], [good]).fixed
    both = compare_results([bad], [bad])
    assert not both.ratio_regressions and both.nonfinite_passes == {"old": 1, "new": 1}


@pytest.mark.parametrize(
    "rules",
    [
        {"ratio_threshold": math.nan},
        {"ratio_threshold": math.inf},
        {"ratio_threshold": 0.5},
        {"ratio_floor": -1.0},
        {"ratio_floor": math.inf},
        {"perf_margin": math.nan},
        {"perf_margin": -0.1},
    ],
)
def test_compare_results_refuses_rules_that_switch_a_check_off(rules: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(rules))):
        compare_results([result(CASES[0])], [result(CASES[0])], **rules)


# ------------------------------------------------------------------------------- a pass with NaN/inf statistics


@pytest.mark.parametrize(
    "bad",
    [
        {"max_abs": math.nan},
        {"mean_abs": math.inf},
        {"error_ratio": math.nan},
        {"max_rel": -math.inf},
        {"cosine": math.inf},
        {"lse_max_abs": math.nan},
        {"nonfinite": 3},
        {"max_abs": "NaN?"},  # a hand edit that is no number at all
    ],
)
def test_a_pass_record_with_nonfinite_statistics_is_effectively_a_fail(bad: dict) -> None:
    record = nan_pass(result(CASES[0]), **bad)
    assert record.status is Status.PASS and record.effective_status is Status.FAIL
    judged = record.judged()
    assert judged.status is Status.FAIL and judged.reason.startswith(NONFINITE_PASS)
    assert judged.extra["recorded_status"] == "pass"
    assert judged_results([record, result(CASES[1])])[1] == 1


def test_a_nan_cosine_alone_is_an_all_zero_reference_not_a_defect() -> None:
    record = nan_pass(result(CASES[0]), cosine=math.nan)
    assert record.effective_status is Status.PASS and record.judged() is record
    fail = result(CASES[0], status="fail", ratio=math.nan)
    assert fail.effective_status is Status.FAIL and fail.judged() is fail  # a fail stays what it is


def test_report_counts_a_pass_with_nan_statistics_as_a_fail(tmp_path: Path, capsys) -> None:
    records = full()
    records[0] = nan_pass(records[0])
    path = write(tmp_path / "run.jsonl", header(), *records)
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir()
    summary = tmp_path / "report.json"
    args = ["report", str(path), "--out", str(tmp_path / "rep"), "--ledger-dir", str(ledgers)]
    assert main([*args, "--json", str(summary)]) == 0
    assert f"attnconf report: {NONFINITE_PASS}: 1 record(s)" in capsys.readouterr().err
    data = json.loads(summary.read_text())
    assert data["nonfinite_passes"] == 1
    assert data["backends"]["kern-x"]["counts"]["fail"] == 1 and data["backends"]["kern-x"]["counts"]["pass"] == 2
    (unexpected,) = data["unexpected"]
    assert unexpected["case_id"] == records[0].case_id and unexpected["reason"].startswith(NONFINITE_PASS)
    md = (tmp_path / "rep" / "report.md").read_text()
    assert f"**{NONFINITE_PASS}: 1 record(s)**" in md


def test_compare_counts_a_pass_with_nan_statistics_as_a_new_failure(tmp_path: Path, capsys) -> None:
    old = write(tmp_path / "old.jsonl", header(), *full())
    records = full()
    records[0] = nan_pass(records[0], lse_max_abs=math.inf)
    new = write(tmp_path / "new.jsonl", header(), *records)
    summary = tmp_path / "c.json"
    status, out, _ = compare(capsys, old, new, "--json", str(summary))
    assert status == 1 and "| new failures | 1 |" in out and f"{NONFINITE_PASS}: 1 record(s) of the new file." in out
    data = json.loads(summary.read_text())
    assert data["nonfinite_passes"] == {"old": 0, "new": 1}
    assert data["regressions"]["new_failures"][0]["new_status"] == "fail"


def test_ledger_audit_counts_a_pass_with_nan_statistics_as_a_problem(tmp_path: Path, capsys) -> None:
    records = full()
    records[0] = nan_pass(records[0])
    path = write(tmp_path / "run.jsonl", header(), *records)
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir()
    assert main(["ledger", "audit", str(path), "--ledger-dir", str(ledgers), "--no-suites", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["nonfinite_passes"] == 1 and data["problems"] == 1 and data["unexplained"] == 1
    assert main(["ledger", "audit", str(path), "--ledger-dir", str(ledgers), "--no-suites", "--strict"]) == 1
    assert f"{NONFINITE_PASS}: 1 record(s)" in capsys.readouterr().out


def test_run_summary_counts_a_pass_with_nan_statistics_as_a_fail() -> None:
    summary = RunSummary(out=Path("r.jsonl"))
    summary.keep_recorded([nan_pass(result(CASES[0])), result(CASES[1])])
    counted = summary.add(nan_pass(result(CASES[2]), error_ratio=math.inf))
    assert counted.status is Status.FAIL and summary.nonfinite_passes == 2 and summary.problems == 2
    assert summary.counts_all() == {"fail": 2, "pass": 1} and summary.exit_code == 1
    listing = summary.listing()
    assert f"{NONFINITE_PASS}: 2 record(s)" in listing and listing.splitlines()[-1] == "exit 1: 2 problem(s)"
    assert summary.to_json()["nonfinite_passes"] == 2


def test_a_resumed_run_counts_a_hand_edited_pass_with_nan_as_an_unexpected_failure(tmp_path: Path, capsys) -> None:
    """The file keeps what it holds; the run's summary and exit status count the record as a fail."""
    out = tmp_path / "r.jsonl"
    case = tmp_path / "case.json"
    case.write_text(json.dumps(CASES[0].to_json()))
    args = ["run", "--case-json", f"@{case}", "--backend", "tests.conformance.fakes:ExactBackend", "--jobs", "1"]
    args += ["--no-progress", "--out", str(out), "--ledger-dir", str(tmp_path)]
    assert main(args) == 0
    [head], [record] = read_records(out)
    assert record.status is Status.PASS
    edited = nan_pass(record, max_abs=math.nan)
    out.write_text(
        json.dumps(head.to_json(), allow_nan=True) + "\n" + json.dumps(edited.to_json(), allow_nan=True) + "\n"
    )
    capsys.readouterr()
    assert main([*args, "--resume"]) == 1
    err = capsys.readouterr().err
    assert f"{NONFINITE_PASS}: 1 record(s), listed with the problems" in err
    assert f"fail    fake-exact  {CASES[0].id}  {NONFINITE_PASS} (max_abs=nan)" in err
    assert read_records(out)[1][0].status is Status.PASS  # nothing rewritten
