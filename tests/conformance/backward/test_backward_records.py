"""Backward records: the report's Backward section and compare's gradient diffs (fail closed on missing numbers)."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from conformance.backward.diff import gradient_diffs
from conformance.backward.table import COLUMNS, backward_section
from conformance.cli import main
from conformance.records import CheckResult, Header, Status
from conformance.results_file import load_results
from conformance.results_writer import append_record
from conformance.reporting.compare import compare_results
from conformance.reporting.compare_markdown import render_markdown
from conformance.reporting.report_render import write_report
from conformance.verdict.check import check_backend, prepare_context
from tests.conformance.backward.grad_fakes import FlashStyleBackend, GqaDkFirstHeadBackend
from tests.conformance.backward.test_planted import CASES

HEADER = Header(
    suite="custom",
    backends={"fake-bwd-flash": {"name": "fake-bwd-flash", "family": "fake"}},
    env={"run": {"seed": 0}},
    sweep={"suite": None, "seed": 0, "tol": []},
)


@pytest.fixture(scope="module")
def records() -> dict[str, CheckResult]:
    plain, det = prepare_context(CASES["plain"]), prepare_context(CASES["deterministic"])
    return {
        "pass": check_backend(plain, FlashStyleBackend()),
        "det": check_backend(det, FlashStyleBackend()),
        "gqa_bug": check_backend(plain, GqaDkFirstHeadBackend()),
    }


def with_ratio(r: CheckResult, tensor: str, ratio: float | None) -> CheckResult:
    extra = copy.deepcopy(r.extra)
    if ratio is None:
        del extra["backward"]["tensors"][tensor]
    else:
        extra["backward"]["tensors"][tensor]["error_ratio"] = ratio
    return dataclasses.replace(r, extra=extra)


def test_records_round_trip_their_gradient_numbers(records, tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    append_record(path, HEADER)
    append_record(path, records["pass"])
    back = load_results(path).results[0]
    assert back.extra["backward"] == json.loads(json.dumps(records["pass"].extra["backward"]))
    assert set(back.extra["backward"]["tensors"]["dq"]) >= {"max_abs", "allowed", "error_ratio", "baseline_max_abs"}


def test_backward_section_per_kernel(records) -> None:
    rs = list(records.values())
    section = backward_section(rs, ["fake-bwd-flash", "fake-bwd-gqa-first-head", "idle"])
    assert section["columns"] == list(COLUMNS)
    rows = {r["backend"]: dict(zip(COLUMNS, r["cells"])) for r in section["rows"]}
    assert set(rows) == {"fake-bwd-flash", "fake-bwd-gqa-first-head"}
    good, bad = rows["fake-bwd-flash"], rows["fake-bwd-gqa-first-head"]
    assert (good["cases"], good["pass"], good["fail"], good["deterministic"], good["run to run"]) == (
        "2",
        "2",
        "0",
        "1/1",
        "1/1",
    )
    assert float(good["dk"]) <= 1 < float(bad["dk"]) and bad["fail"] == "1" and good["dsinks"] == "-"
    assert any("worst dk ratio" in n and CASES["plain"].id in n for n in section["notes"])
    forward_only = dataclasses.replace(records["pass"], case={"requests": [[1, 1]]}, extra={})
    assert backward_section([forward_only], ["fake-bwd-flash"]) is None


def test_report_has_a_backward_section(records, tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    append_record(path, HEADER)
    for r in records.values():
        append_record(path, r)
    md, html = write_report([path], tmp_path / "report")
    text = md.read_text()
    assert "## Backward" in text and "| fake-bwd-gqa-first-head | 1 | 0 | 1 |" in text
    assert '<h3 id="backward">Backward</h3>' in html.read_text()  # a details section, under the verdict (issue 28)


def test_compare_flags_a_gradient_regression(records) -> None:
    old = records["pass"]
    worse = with_ratio(old, "dk", 0.9)
    cmp = compare_results([with_ratio(old, "dk", 0.3)], [worse])
    assert cmp.regressed and [(g.tensor, g.old_ratio, g.new_ratio) for g in cmp.grad_regressions] == [("dk", 0.3, 0.9)]
    assert "## Gradient regressions (1)" in render_markdown(cmp)
    assert not compare_results([old], [old]).regressed
    assert not compare_results([worse], [with_ratio(old, "dk", 0.3)]).regressed  # better is no regression
    assert not compare_results([with_ratio(old, "dk", 0.1)], [with_ratio(old, "dk", 0.3)]).regressed  # < floor


def test_missing_gradient_numbers_fail_closed(records) -> None:
    old = records["pass"]
    for new in (with_ratio(old, "dq", None), dataclasses.replace(old, extra={})):
        cmp = compare_results([old], [new])
        assert cmp.regressed and len(cmp.grad_missing) == 1 and cmp.grad_missing[0].side == "new"
        assert "Gradient numbers missing" in render_markdown(cmp)
    cmp = compare_results([with_ratio(old, "dv", None)], [old])
    assert cmp.regressed and cmp.grad_missing[0].side == "old" and cmp.grad_missing[0].tensor == "dv"
    nan = with_ratio(old, "dq", float("nan"))
    assert gradient_diffs([(old, nan)])[1][0].why == "dq error ratio not a number"


def test_a_new_gradient_failure_is_a_new_failure_not_a_gradient_diff(records) -> None:
    bad = dataclasses.replace(records["gqa_bug"], backend="fake-bwd-flash", family="fake")
    cmp = compare_results([dataclasses.replace(records["pass"], family="fake")], [bad])
    assert [p.new.status for p in cmp.new_failures] == [Status.FAIL] and not cmp.grad_regressions


def test_compare_cli_exits_1_on_a_gradient_regression(records, tmp_path: Path) -> None:
    old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    for path, r in ((old, with_ratio(records["pass"], "dq", 0.2)), (new, with_ratio(records["pass"], "dq", 0.8))):
        append_record(path, HEADER)
        append_record(path, r)
    summary = tmp_path / "s.json"
    assert main(["compare", str(old), str(new), "--json", str(summary)]) == 1
    data = json.loads(summary.read_text())
    assert data["regressions"]["grad_regressions"][0]["tensor"] == "dq"
    assert main(["compare", str(old), str(old)]) == 0


def test_compare_judges_gradients_by_its_own_rule_numbers(records) -> None:
    """dk 0.3 -> 0.9: a regression by the defaults (x2, floor 0.5), none under x4 or under a floor of 1."""
    old, new = [with_ratio(records["pass"], "dk", 0.3)], [with_ratio(records["pass"], "dk", 0.9)]
    assert [g.tensor for g in compare_results(old, new).grad_regressions] == ["dk"]
    assert not compare_results(old, new, ratio_threshold=4.0).grad_regressions
    assert not compare_results(old, new, ratio_floor=1.0).grad_regressions
