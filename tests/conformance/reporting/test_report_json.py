"""``attnconf report --json``'s verdict (issue 28): the exit status the results imply for a gate, its reasons, one
line per backend, the unexpected problems grouped by cause with their repro lines, and the baseline comparison.

It fails closed: a backend that judged nothing reads as exit 4, never 0; a pass with NaN statistics is a fail; a
baseline the results lack pairs of reads as compare's refusal (2); a baseline that cannot be compared is a refusal
whose summary has no verdict.  The results' status is checked against ``attnconf run``'s own rule
(:class:`conformance.running.outcome.RunSummary`) and the baseline's against ``attnconf compare``'s exit status on the
same files.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, strategies as st

from conformance.cli import main
from conformance.exits import Exit
from conformance.records import Header, Status
from conformance.ledger.entries import load_ledger
from conformance.reporting.report import _selected, load_runs
from conformance.reporting.report_summary import SCHEMA, gate_status
from conformance.running.outcome import RunSummary
from tests.conformance.reporting.report_data import write_files
from tests.conformance.reporting.test_fail_closed import full, header, write


def _strict(text: str) -> Any:
    """JSON as any strict parser reads it: NaN, Infinity and -Infinity refused."""

    def refuse(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def report(capsys, *args: str | Path) -> tuple[int, dict | None, str]:
    """``attnconf report ARGS --json -``: (exit status, the summary on stdout, stderr)."""
    capsys.readouterr()
    code = main(["report", *map(str, args), "--json", "-"])
    out, err = capsys.readouterr()
    return code, (_strict(out) if out.strip() else None), err


def compare_status(capsys, old: Path, new: Path) -> int:
    capsys.readouterr()
    code = main(["compare", str(old), str(new)])
    capsys.readouterr()
    return code


def run_status(paths: list[Path], ledger_dir: Path | None) -> int:
    """What ``attnconf run`` exits on these records: its own summary and rule over the report's reading."""
    runs = load_runs(paths)
    summary = RunSummary(out=paths[0], backends=_selected(runs))
    summary.keep_recorded(runs.results)
    summary.finish(load_ledger(ledger_dir))
    return summary.exit_code


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_files(tmp_path_factory.mktemp("verdict-json"))


def test_the_verdict_of_a_run_with_problems_and_a_baseline(files: dict[str, Path], capsys) -> None:
    new, old, ledgers = files["new"], files["old"], files["ledgers"]
    out = files["tmp"] / "rep"
    code, data, err = report(capsys, new, "--baseline", old, "--ledger-dir", ledgers, "--out", out)
    assert code == 0 and f"wrote {out}/report.md" in err  # the report's own status: it was written
    assert data is not None and data["schema"] == SCHEMA == 2 and data["exit_status"] == 0
    verdict = data["verdict"]
    assert (verdict["exit_status"], verdict["results_exit_status"], verdict["baseline_exit_status"]) == (1, 1, 1)
    assert verdict["results_exit_status"] == run_status([new], ledgers)
    assert verdict["baseline_exit_status"] == compare_status(capsys, old, new)
    assert verdict["reasons"] == [
        "6 unexpected problem(s) in kern",
        "backend refuser judged nothing: unsupported: refuses every case: planted",
        f"baseline: regressed against {old}: 7 new failure(s)",
    ]
    assert verdict["headline"].startswith("6 unexpected problem(s) in kern (1 known)")
    lines = {b["backend"]: b for b in verdict["backends"]}
    assert list(lines) == ["kern", "other", "refuser"]
    assert lines["kern"] == {
        "backend": "kern",
        "version": "1.0",
        "total": 11,
        "judged": 10,
        "passed": 3,
        "unexpected": 6,
        "known": 1,
        "unsupported": 1,
        "nothing_judged": None,
    }
    for b in lines.values():  # every judged pair is a pass, an unexpected or a known problem
        assert b["judged"] == b["passed"] + b["unexpected"] + b["known"] == b["total"] - b["unsupported"]
    assert lines["refuser"]["judged"] == 0 and lines["refuser"]["nothing_judged"].startswith("unsupported: ")
    groups = verdict["problem_groups"]
    assert [(g["backend"], g["status"], g["cause"], g["count"]) for g in groups] == [
        ("kern", "fail", "failed max_error", 3),
        ("kern", "fail", "failed lse", 2),
        ("kern", "crash", "worker killed by SIGSEGV (exit status N)", 1),
    ]
    problems = [p for g in groups for p in g["problems"]]
    assert all(g["count"] == len(g["problems"]) for g in groups)
    assert {p["case_id"] for p in problems} == {u["case_id"] for u in data["unexpected"]}
    assert all(p["repro"].startswith("attnconf run --backend kern --case-json @") for p in problems)
    assert groups[2]["problems"][0]["reason"] == "worker killed by SIGSEGV (exit status -11) Fatal Python error"
    # the baseline is attnconf compare --json's own summary of the same files
    cmp_json = files["tmp"] / "cmp.json"
    assert main(["compare", str(old), str(new), "--json", str(cmp_json)]) == 1
    expected = json.loads(cmp_json.read_text())
    del expected["attnconf_output"]
    assert data["baseline"] == expected


def test_a_clean_run_is_exit_0_with_no_reason(tmp_path: Path, capsys) -> None:
    path = write(tmp_path / "r.jsonl", header(), *full())
    code, data, _ = report(capsys, path, "--out", tmp_path / "rep")
    assert code == 0 and data is not None
    verdict = data["verdict"]
    assert (verdict["exit_status"], verdict["results_exit_status"], verdict["baseline_exit_status"]) == (0, 0, None)
    assert verdict["reasons"] == [] and verdict["problem_groups"] == [] and data["baseline"] is None
    assert verdict["results_exit_status"] == run_status([path], None)
    assert all(b["nothing_judged"] is None and b["judged"] == b["passed"] == 3 for b in verdict["backends"])


@pytest.mark.parametrize("case", ["every-pair-unsupported", "one-backend-unsupported", "selected-without-records"])
def test_nothing_judged_never_reads_as_a_pass(tmp_path: Path, capsys, case: str) -> None:
    """Exit 4, never 0: a file whose every pair is unsupported, a backend every pair of which is unsupported
    beside one that passed, a backend the run selected with no record at all."""
    records = full()
    if case == "every-pair-unsupported":
        records = [
            dataclasses.replace(r, status=Status.UNSUPPORTED, stats=None, reason="not installed") for r in records
        ]
    elif case == "one-backend-unsupported":
        records = [
            dataclasses.replace(r, status=Status.UNSUPPORTED, stats=None, reason="not installed")
            if r.family == "other"
            else r
            for r in records
        ]
    else:
        records = [r for r in records if r.family == "kern"]
    path = write(tmp_path / "r.jsonl", header(), *records)
    code, data, _ = report(capsys, path, "--out", tmp_path / "rep")
    assert code == 0 and data is not None
    verdict = data["verdict"]
    assert verdict["exit_status"] == verdict["results_exit_status"] == Exit.NO_EVIDENCE
    assert verdict["results_exit_status"] == run_status([path], None)
    nothing = {b["backend"]: b["nothing_judged"] for b in verdict["backends"] if b["nothing_judged"] is not None}
    expected = {
        "every-pair-unsupported": {"kern-x": "unsupported: not installed", "other-x": "unsupported: not installed"},
        "one-backend-unsupported": {"other-x": "unsupported: not installed"},
        "selected-without-records": {"other-x": "no pair of it was recorded"},
    }[case]
    assert nothing == expected
    assert verdict["reasons"] == [f"backend {b} judged nothing: {why}" for b, why in expected.items()]


def test_a_pass_with_nan_statistics_is_an_unexpected_fail_and_the_json_stays_strict(tmp_path: Path, capsys) -> None:
    records = full()
    nan = records[0].stats
    assert nan is not None
    records[0] = dataclasses.replace(records[0], stats=dataclasses.replace(nan, error_ratio=math.nan, max_abs=math.inf))
    path = write(tmp_path / "r.jsonl", header(), *records)
    code, data, err = report(capsys, path, "--out", tmp_path / "rep")
    assert code == 0 and data is not None and "non-finite statistics: treated as fail: 1 record" in err
    verdict = data["verdict"]
    assert verdict["exit_status"] == verdict["results_exit_status"] == Exit.PROBLEMS == run_status([path], None)
    assert data["nonfinite_passes"] == 1
    ((group_problem,),) = [g["problems"] for g in verdict["problem_groups"]]
    assert group_problem["case_id"] == records[0].case_id and group_problem["status"] == "fail"
    assert "max abs inf" in group_problem["worst"]


def test_nan_ratios_in_the_baseline_comparison_stay_strict_json(tmp_path: Path, capsys) -> None:
    """An error ratio NaN in NEW where OLD has a number: compare's ratio regression, exit 1, written as "nan"."""
    old = write(tmp_path / "old.jsonl", header(), *full())
    records = full()
    stats = records[0].stats
    assert stats is not None
    records[0] = dataclasses.replace(
        records[0], status=Status.FAIL, stats=dataclasses.replace(stats, error_ratio=math.nan)
    )
    new = write(tmp_path / "new.jsonl", header(), *records)
    code, data, _ = report(capsys, new, "--baseline", old, "--out", tmp_path / "rep")
    assert code == 0 and data is not None
    assert data["verdict"]["baseline_exit_status"] == compare_status(capsys, old, new) == Exit.PROBLEMS
    assert data["baseline"]["regressions"]["new_failures"][0]["new_ratio"] == "nan"


def test_a_baseline_the_results_lack_pairs_of_reads_as_compares_refusal(tmp_path: Path, capsys) -> None:
    """The report compares what it can (pairs of OLD the results lack are counted); the verdict says what the
    gate would: attnconf compare OLD NEW refuses (2), so a clean run does not read as 0."""
    old = write(tmp_path / "old.jsonl", header(), *full())
    new = write(tmp_path / "new.jsonl", header(), *full()[1:])
    code, data, _ = report(capsys, new, "--baseline", old, "--out", tmp_path / "rep")
    assert code == 0 and data is not None
    verdict = data["verdict"]
    assert verdict["results_exit_status"] == 0
    assert verdict["baseline_exit_status"] == compare_status(capsys, old, new) == Exit.USAGE
    assert verdict["exit_status"] == Exit.USAGE
    assert verdict["reasons"] == [
        f"baseline: not a whole comparison (attnconf compare refuses it): {new} lacks 1 (case, family) pair(s) of {old}"
    ]
    assert data["baseline"]["not_compared"]["not_in_new"] == 1


def test_a_baseline_with_lines_that_are_not_records_reads_as_compares_refusal(tmp_path: Path, capsys) -> None:
    old = write(tmp_path / "old.jsonl", header(), *full())
    new = write(tmp_path / "new.jsonl", header(), *full())
    with new.open("a") as fh:
        fh.write('{"type": "result", "case_id"')  # a killed writer's last line
    code, data, _ = report(capsys, new, "--baseline", old, "--out", tmp_path / "rep")
    assert code == 0 and data is not None
    verdict = data["verdict"]
    assert verdict["baseline_exit_status"] == compare_status(capsys, old, new) == verdict["exit_status"] == 2
    assert verdict["reasons"][0].endswith("the new file has 1 line(s) that are not records")


def test_a_baseline_family_that_judged_nothing_is_exit_4(tmp_path: Path, capsys) -> None:
    """The results judged something (kern and other passed); against the baseline, whose family other refused
    every pair, no pair of other was judged in both files: compare's exit 4 comes through."""
    refused = [
        dataclasses.replace(r, status=Status.UNSUPPORTED, stats=None, reason="not here") if r.family == "other" else r
        for r in full()
    ]
    old = write(tmp_path / "old.jsonl", header(), *refused)
    new = write(tmp_path / "new.jsonl", header(), *full())
    code, data, _ = report(capsys, new, "--baseline", old, "--out", tmp_path / "rep")
    assert code == 0 and data is not None
    verdict = data["verdict"]
    assert verdict["results_exit_status"] == 0
    assert verdict["baseline_exit_status"] == compare_status(capsys, old, new) == Exit.NO_EVIDENCE
    assert verdict["exit_status"] == Exit.NO_EVIDENCE
    assert [r.split(":")[0] for r in verdict["reasons"]] == ["baseline"]
    assert verdict["reasons"][0].startswith("baseline: nothing judged: family other ")


def test_a_baseline_that_does_not_match_is_refused_and_its_summary_has_no_verdict(tmp_path: Path, capsys) -> None:
    """Another suite: the report is refused (exit 2, nothing written), and the JSON says so: a script reading
    verdict.exit_status finds null, never 0."""
    old = write(tmp_path / "old.jsonl", header(suite="default"), *full())
    new = write(tmp_path / "new.jsonl", header(), *full())
    code, data, err = report(capsys, new, "--baseline", old, "--out", tmp_path / "rep")
    assert code == 2 and data is not None and len(err.strip().splitlines()) == 1
    assert data["exit_status"] == 2 and data["verdict"] is None and data["schema"] == SCHEMA
    assert data["refusal"]["file"] == str(old) and "cannot be compared with" in data["refusal"]["reason"]
    assert not (tmp_path / "rep" / "report.md").exists()


def test_the_summary_file_follows_the_output_rules(tmp_path: Path, capsys) -> None:
    """--json FILE: a file the user wrote there is kept as a numbered backup, an earlier summary replaced."""
    path = write(tmp_path / "r.jsonl", header(), *full())
    summary = tmp_path / "verdict.json"
    summary.write_text("mine\n")
    args = ["report", str(path), "--out", str(tmp_path / "rep"), "--json", str(summary)]
    assert main(args) == 0
    assert (tmp_path / "verdict.1.json").read_text() == "mine\n"
    assert _strict(summary.read_text())["verdict"]["exit_status"] == 0
    assert main(args) == 0
    assert not (tmp_path / "verdict.2.json").exists()


@given(st.lists(st.sampled_from([None, 0, 1, 2, 3, 4, 5]), max_size=4))
def test_gate_status_fails_closed(statuses: list[int | None]) -> None:
    """0 only when every status is 0 (or none is given); 1 over 2 over 4; any other non-zero wins over 0."""
    got = gate_status(*statuses)
    present = [s for s in statuses if s is not None]
    assert (got == 0) == all(s == 0 for s in present)
    for first in (1, 2, 4):
        if first in present:
            assert got == first
            break
    else:
        assert got == max(present, default=0)


def test_header_of_another_tool_without_backends_still_gets_a_line_per_backend(tmp_path: Path, capsys) -> None:
    """A header naming no backend: the backends come from the records (and a verdict is still given)."""
    path = write(tmp_path / "r.jsonl", Header(suite="smoke", backends={}, env={}), *full())
    code, data, _ = report(capsys, path, "--out", tmp_path / "rep")
    assert code == 0 and data is not None
    assert [b["backend"] for b in data["verdict"]["backends"]] == ["kern-x", "other-x"]
    assert data["verdict"]["exit_status"] == 0
