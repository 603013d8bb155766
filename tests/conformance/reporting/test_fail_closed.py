"""compare, report and the records reader fail closed: every file compare may not compare is refused with
exit 2 and one line naming the file and the reason; what is accepted by an explicit option is counted."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import pytest

from conformance.cases.case import AttentionCase
from conformance.cli import main
from conformance.records import CheckResult, ErrorStats, Header, Status
from conformance.results_file import load_results, read_records, ResultsFileError
from conformance.results_writer import append_record

CASES = [
    AttentionCase(requests=((4, 4),), num_heads=2, num_kv_heads=1, head_dim=8, causal=True),
    AttentionCase(requests=((3, 5), (1, 6)), num_heads=2, num_kv_heads=2, head_dim=8),
    AttentionCase(requests=((2, 7),), num_heads=4, num_kv_heads=1, head_dim=16, window=(2, 0)),
]
FAMILIES = ("kern", "other")


def header(suite: str | None = "smoke", tol: list | None = None, families=FAMILIES, **sweep) -> Header:
    return Header(
        suite=suite or "custom",
        backends={f"{f}-x": {"name": f"{f}-x", "family": f, "version": "1.0"} for f in families},
        env={"run": {"seed": 0}},
        argv=["attnconf", "run", "--suite", suite or "custom"],
        sweep={"suite": suite, "seed": 0, "tol": tol or [], **sweep},
    )


def legacy_header(tol: list[str], tol_file: str | None = None) -> Header:
    """A header written before ``Header.sweep`` existed: the tolerance flags as typed, in env.run."""
    return Header(
        suite="smoke",
        backends={f"{f}-x": {"name": f"{f}-x", "family": f} for f in FAMILIES},
        env={"run": {"seed": 0, "tol": tol, "tol_file": tol_file}},
    )


def result(case: AttentionCase, family: str = "kern", status: str = "pass", ratio: float = 0.1) -> CheckResult:
    stats = ErrorStats(
        max_abs=ratio * 1e-3,
        max_rel=ratio,
        mean_abs=ratio * 1e-4,
        worst=(0, 0, 0),
        mismatch_frac=0.0,
        error_ratio=ratio,
        baseline_max_abs=1e-3,
        baseline_mean_abs=1e-4,
        allowed_max_abs=1e-2,
        cosine=1.0,
    )
    return CheckResult(
        case_id=case.id,
        backend=f"{family}-x",
        family=family,
        status=Status(status),
        case=case.to_json(),
        stats=stats,
        reason="" if status == "pass" else f"planted {status}",
        repro=f"attnconf run --backend {family}-x --case-json '{json.dumps(case.to_json())}'",
    )


def full() -> list[CheckResult]:
    return [result(c, f) for c in CASES for f in FAMILIES]


def write(path: Path, *records: Header | CheckResult) -> Path:
    for r in records:
        append_record(path, r)
    return path


@pytest.fixture
def old(tmp_path: Path) -> Path:
    return write(tmp_path / "old.jsonl", header(), *full())


def compare(capsys, *args: str) -> tuple[int, str, str]:
    status = main(["compare", *map(str, args)])
    out = capsys.readouterr()
    return status, out.out, out.err


def refused(capsys, old: Path, new: Path, *extra: str) -> str:
    """compare OLD NEW refuses: exit 2, nothing on stdout, one line on stderr naming NEW; that line."""
    status, out, err = compare(capsys, old, new, *extra)
    assert status == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnconf compare: refused: ") and str(new) in lines[0], err
    return lines[0]


# ------------------------------------------------------------------------------------- compare: refusals


def test_identical_runs_compare_and_the_summary_states_suite_and_tolerance(old: Path, capsys) -> None:
    status, out, err = compare(capsys, old, old)
    assert status == 0 and err == ""
    assert "no regression" in out and "Suite `smoke` in both; tolerance: the defaults in both." in out


def test_missing_file(old: Path, tmp_path: Path, capsys) -> None:
    assert "absent.jsonl: no such file" in refused(capsys, old, tmp_path / "absent.jsonl")


def test_empty_file(old: Path, tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert "empty.jsonl: empty file" in refused(capsys, old, empty)


def test_garbage_file(old: Path, tmp_path: Path, capsys) -> None:
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("<html>not a results file</html>\n[1, 2]\n")
    line = refused(capsys, old, garbage)
    assert "holds no records: 2 lines skipped (line 1: not JSON; line 2: not a record" in line


def test_unreadable_files(old: Path, tmp_path: Path, capsys) -> None:
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage\n")
    assert "binary.jsonl: not UTF-8 text (byte 0" in refused(capsys, old, binary)
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(old.read_bytes())[:200])
    assert "cut.jsonl.gz: not a complete gzip file" in refused(capsys, old, cut)


def test_truncated_last_line_needs_allow_skipped_and_is_then_counted(old: Path, tmp_path: Path, capsys) -> None:
    truncated = tmp_path / "truncated.jsonl"
    truncated.write_bytes(old.read_bytes()[:-40])  # a run killed mid-line
    line = refused(capsys, old, truncated)
    assert "1 line skipped (line 7: not JSON (the last line, cut short)); pass --allow-skipped" in line
    # accepted, it is counted; the record it held is a pair the new file lacks: --allow-subset too
    assert "lacks 1 of the 6" in refused(capsys, old, truncated, "--allow-skipped")
    status, out, _ = compare(capsys, old, truncated, "--allow-skipped", "--allow-subset")
    assert status == 0
    assert "Skipped 1 line of the new file (accepted with --allow-skipped): line 7: not JSON" in out
    assert "Not compared: 1 (case, family) pairs of the old file that the new one lacks" in out


def test_no_header(old: Path, tmp_path: Path, capsys) -> None:
    bare = write(tmp_path / "bare.jsonl", *full())
    assert "bare.jsonl: no header line" in refused(capsys, old, bare)
    only_header = write(tmp_path / "header-only.jsonl", header())
    assert "header-only.jsonl: no result records" in refused(capsys, old, only_header)


def test_other_suite(old: Path, tmp_path: Path, capsys) -> None:
    other = write(tmp_path / "other.jsonl", header("default"), *full())  # even with the same records
    line = refused(capsys, old, other)
    assert "a run of suite default, but" in line and "is of suite smoke" in line
    custom = write(tmp_path / "custom.jsonl", header(None), *full())
    assert "a run of suite custom" in refused(capsys, old, custom)


def test_other_tolerance(old: Path, tmp_path: Path, capsys) -> None:
    looser = header(tol=[{"factor": 3.0}], tol_args={"tol": ["factor=3"], "tol_file": None})
    new = write(tmp_path / "looser.jsonl", looser, *full())  # identical numerics: only the tolerance differs
    line = refused(capsys, old, new)
    assert 'judged with tolerance overrides [{"factor": 3.0}] (--tol factor=3), but' in line
    assert "with the defaults; verdicts under different (or unknown) tolerances are not comparable" in line


def test_tolerance_of_old_headers_is_parsed_from_their_flags(tmp_path: Path, capsys) -> None:
    """A header from before ``sweep`` recorded --tol as typed: parsed, it equals the same resolved override
    (a TOML int and a flag's float alike); a --tol-file whose contents it does not record matches nothing."""
    legacy = write(tmp_path / "legacy.jsonl", legacy_header(["factor=3"]), *full())
    now = write(tmp_path / "now.jsonl", header(tol=[{"factor": 3}]), *full())
    assert compare(capsys, legacy, now)[0] == 0
    with_file = write(tmp_path / "with-file.jsonl", legacy_header([], "tol.toml"), *full())
    assert "judged with tolerance --tol-file tol.toml (file contents not recorded)" in refused(capsys, now, with_file)
    assert compare(capsys, with_file, with_file)[0] == 0  # the same flags, the same file name: one tolerance
    unrecorded = write(tmp_path / "unrecorded.jsonl", Header(suite="smoke", backends={}, env={}), *full())
    assert "no tolerance recorded in the header" in refused(capsys, unrecorded, unrecorded)


def test_a_file_mixing_runs_is_refused(old: Path, tmp_path: Path, capsys) -> None:
    results = full()
    mixed = write(tmp_path / "mixed.jsonl", header(), *results[:3], header(tol=[{"atol": 1.0}]), *results[3:])
    line = refused(capsys, old, mixed)
    assert "mixes runs of different tolerances: header 1 has the defaults, header 2 has overrides" in line


def test_subset_is_refused_listing_the_pairs_unless_allowed(old: Path, tmp_path: Path, capsys) -> None:
    results = full()
    partial = write(tmp_path / "partial.jsonl", header(), *results[:2])  # a killed or shorter run
    line = refused(capsys, old, partial)
    missing = sorted((r.case_id, r.family) for r in results[2:])
    assert "lacks 4 of the 6 (case, family) pairs of" in line
    assert all(f"{c} x {f}" in line for c, f in missing) and "--allow-subset" in line
    status, out, _ = compare(capsys, old, partial, "--allow-subset")
    assert status == 0 and "Not compared: 4 (case, family) pairs" in out
    # a family missing entirely is a subset too
    one_family = write(tmp_path / "one-family.jsonl", header(), *[r for r in results if r.family == "kern"])
    assert "lacks 3 of the 6" in refused(capsys, old, one_family)


def test_only_new_families_scopes_to_what_new_was_asked_for(old: Path, tmp_path: Path, capsys) -> None:
    kern = [r for r in full() if r.family == "kern"]
    new = write(tmp_path / "kern.jsonl", header(families=("kern",)), *kern)
    status, out, _ = compare(capsys, old, new, "--only-new-families")
    assert status == 0 and "3 (case, family) pairs in both files" in out
    assert "Outside the comparison (--only-new-families: families the new run was not asked for): other (3" in out
    # within its families NEW must still be complete: a kern pair missing is refused
    short = write(tmp_path / "kern-short.jsonl", header(families=("kern",)), *kern[:2])
    assert "lacks 1 of the 3" in refused(capsys, old, short, "--only-new-families")
    # asked for a family it did not record: refused, not passed
    silent = write(tmp_path / "silent.jsonl", header(), *kern)
    assert "lacks 3 of the 6" in refused(capsys, old, silent, "--only-new-families")


def test_nothing_in_common_is_refused_even_as_a_subset(old: Path, tmp_path: Path, capsys) -> None:
    other = [result(c, "third") for c in CASES]
    new = write(tmp_path / "third.jsonl", header(families=("third",)), *other)
    line = refused(capsys, old, new, "--allow-subset")
    assert "no (case, family) pair in common" in line


def test_different_versions_are_compared_not_refused(old: Path, tmp_path: Path, capsys) -> None:
    """An upgrade diff is the point: new versions, one planted regression -> exit 1, no refusal."""
    h = header()
    h = dataclasses.replace(h, backends={k: {**v, "version": "2.0"} for k, v in h.backends.items()})
    results = full()
    results[0] = dataclasses.replace(results[0], status=Status.FAIL, reason="planted")
    new = write(tmp_path / "upgrade.jsonl", h, *results)
    status, out, err = compare(capsys, old, new)
    assert status == 1 and err == "" and "REGRESSED" in out and "| kern | 1.0 | 2.0 |" in out


# ------------------------------------------------------------------------------------- compare: --json, --out


def test_compare_json_to_stdout_and_to_a_file(old: Path, tmp_path: Path, capsys) -> None:
    results = full()
    results[1] = dataclasses.replace(results[1], status=Status.CRASH, stats=None, reason="SIGSEGV\nmore")
    new = write(tmp_path / "new.jsonl", header(), *results)
    status, out, _ = compare(capsys, old, new, "--json", "-")
    data = json.loads(out)  # stdout holds the JSON only
    assert status == 1 and data["exit_status"] == 1 and data["verdict"] == "regressed" and data["refusal"] is None
    assert data["compared"] == 6 and data["not_compared"]["not_in_new"] == 0
    assert data["counts"]["new_failures"] == 1 and data["counts"]["fixed"] == 0
    (failure,) = data["regressions"]["new_failures"]
    assert failure["case_id"] == results[1].case_id and failure["family"] == "other"
    assert (failure["old_status"], failure["new_status"], failure["reason"]) == ("pass", "crash", "SIGSEGV more")
    assert failure["repro"].startswith("attnconf run --backend other-x")
    assert data["old"]["suite"] == data["new"]["suite"] == "smoke" and data["tolerance"] == "the defaults"
    path = tmp_path / "sub" / "compare.json"
    status, out, _ = compare(capsys, new, old, "--json", path)  # the reverse: a fix
    data = json.loads(path.read_text())
    assert status == 0 and "no regression" in out and data["counts"]["fixed"] == 1 and data["exit_status"] == 0


def test_a_refusal_is_in_the_json_and_the_markdown_out(old: Path, tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    summary, md = tmp_path / "refused.json", tmp_path / "gate.md"
    line = refused(capsys, old, empty, "--json", summary, "--out", md)
    data = json.loads(summary.read_text())
    assert data["exit_status"] == 2 and data["verdict"] == "refused"
    assert data["refusal"] == {"file": str(empty), "reason": "empty file (not a results file of attnconf run)"}
    assert "REFUSED" in md.read_text() and line.split("refused: ")[1] in md.read_text()


# ------------------------------------------------------------------------------------- report


@pytest.fixture
def ledger_dir(tmp_path: Path) -> Path:
    d = tmp_path / "ledgers"
    d.mkdir()
    (d / "kern-x.toml").write_text(
        f'[[failure]]\npattern = "{CASES[2].id}"\nreason = "KNOWN"\nglob_reason = "a test ledger"\n'
    )
    return d


def test_report_counts_skipped_lines_and_refuses_empty_input(
    old: Path, tmp_path: Path, ledger_dir: Path, capsys
) -> None:
    truncated = tmp_path / "truncated.jsonl"
    truncated.write_bytes(old.read_bytes()[:-40])
    out = tmp_path / "rep"
    assert main(["report", str(truncated), "--out", str(out), "--ledger-dir", str(ledger_dir)]) == 0
    err = capsys.readouterr().err
    assert f"{truncated}: 1 line skipped (line 7: not JSON (the last line, cut short)); the rest is reported" in err
    assert (out / "report.md").is_file()
    empty, garbage = tmp_path / "empty.jsonl", tmp_path / "garbage.jsonl"
    empty.write_text("")
    garbage.write_text("garbage\n")
    only_header = write(tmp_path / "header-only.jsonl", header())
    for bad, reason in (
        (empty, "empty file (not a results file of attnconf run)"),
        (garbage, "holds no records: 1 line skipped (line 1: not JSON) (not a results file of attnconf run)"),
        (only_header, "no result records: nothing to report"),
        (tmp_path / "absent.jsonl", "no such file"),
    ):
        assert main(["report", str(bad), "--out", str(tmp_path / "bad"), "--ledger-dir", str(ledger_dir)]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"attnconf report: {bad}: {reason}", err
    # a header-only shard beside others is reported (and named), not refused
    assert main(["report", str(old), str(only_header), "--out", str(out), "--ledger-dir", str(ledger_dir)]) == 0
    assert f"{only_header}: no result records (only a header)" in capsys.readouterr().err


def test_report_json(old: Path, tmp_path: Path, ledger_dir: Path, capsys) -> None:
    results = full()
    results[1] = dataclasses.replace(results[1], status=Status.FAIL, reason="max_error:\nplanted")
    known = [i for i, r in enumerate(results) if r.case_id == CASES[2].id and r.family == "kern"][0]
    results[known] = dataclasses.replace(results[known], status=Status.FAIL, reason="window bug")
    path = write(tmp_path / "run.jsonl", header(), *results)
    with path.open("a") as fh:
        fh.write('{"type": "result", "case_id"')  # a killed writer's last line
    assert main(["report", str(path), "--out", str(tmp_path / "rep"), "--ledger-dir", str(ledger_dir)]) == 0
    capsys.readouterr()
    summary = tmp_path / "report.json"
    args = ["report", str(path), "--out", str(tmp_path / "rep"), "--ledger-dir", str(ledger_dir)]
    assert main([*args, "--json", str(summary)]) == 0
    data = json.loads(summary.read_text())
    assert data["exit_status"] == 0 and data["results"] == 6 and data["cases"] == 3 and data["skipped_lines"] == 1
    skipped = [{"line": 8, "reason": "not JSON (the last line, cut short)"}]
    assert data["files"] == [
        {"path": str(path), "headers": 1, "results": 6, "skipped_lines": skipped, "duplicates_dropped": 0, "schema": 1}
    ]
    assert data["backends"]["other-x"]["counts"]["fail"] == 1 and data["backends"]["kern-x"]["problems"] == 1
    assert data["ledger"]["unexpected"] == 1 and data["ledger"]["known"] == 1
    (unexpected,) = data["unexpected"]
    assert unexpected["case_id"] == results[1].case_id and unexpected["reason"] == "max_error: planted"
    assert unexpected["repro"] == results[1].repro
    (entry,) = data["known"]
    assert entry["reason"] == "KNOWN" and entry["count"] == 1 and entry["case_ids"] == [CASES[2].id]
    capsys.readouterr()
    assert main([*args, "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["results"] == 6  # stdout holds the JSON only


# ------------------------------------------------------------------------------------- the reader


def test_load_results_is_lenient_where_the_format_promises(tmp_path: Path) -> None:
    """Unknown keys and a newer schema load; an unknown record type is counted, not refused; gzip is found by
    content; read_records stays lenient (the runner's --resume and other readers)."""
    path = tmp_path / "future.jsonl"
    h = {**header().to_json(), "schema": 99, "new_field": {"x": 1}}
    r = {**full()[0].to_json(), "schema": 99, "provenance": "later version"}
    path.write_text("\n".join(json.dumps(x) for x in (h, r, {"type": "note", "text": "later"})) + "\n")
    read = load_results(path)
    assert len(read.headers) == 1 and len(read.results) == 1 and read.other_records == 1 and not read.skipped
    named_plain = tmp_path / "gz-content.jsonl"
    named_plain.write_bytes(gzip.compress(path.read_bytes()))
    assert len(load_results(named_plain).results) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text(path.read_text() + json.dumps({**r, "status": "flaky"}) + "\n")
    with pytest.raises(ResultsFileError, match=r"bad\.jsonl: 1 line skipped \(line 4: a result record this"):
        load_results(bad)
    assert load_results(bad, allow_skipped=True).skipped[0].line == 4
    assert [len(x) for x in read_records(bad)] == [1, 1]
