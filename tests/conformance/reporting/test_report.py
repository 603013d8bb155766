"""Reports: both files, failures with summary / worst error / repro, the ledger split, inline plots."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conformance.cases.case import AttentionCase
from conformance.cli import main
from conformance.ledger.entries import load_ledger
from conformance.records import CheckResult, Header, Status, Timing
from conformance.results_writer import append_record
from conformance.reporting.report import build_context, load_runs
from conformance.reporting.report_render import write_report
from tests.conformance.reporting.report_data import stats

WIN = AttentionCase(requests=((5, 9),), num_heads=4, num_kv_heads=2, head_dim=16, window=(3, 0))
PLAIN = AttentionCase(requests=((7, 7), (1, 4)), num_heads=2, num_kv_heads=2, head_dim=8, causal=True)
SINK = AttentionCase(requests=((2, 2),), num_heads=2, num_kv_heads=1, head_dim=8, sinks=True)


def rec(case: AttentionCase, backend: str, status: str, **kw) -> CheckResult:
    return CheckResult(
        case_id=case.id,
        backend=backend,
        family=backend,
        status=Status(status),
        case=case.to_json(),
        repro=f"attnconf run --backend {backend} --case-json {case.id}",
        kernel_s=0.002,
        harness_s=0.010,
        **kw,
    )


@pytest.fixture
def results_file(tmp_path: Path) -> Path:
    path = tmp_path / "r.jsonl"
    append_record(
        path,
        Header(
            suite="smoke",
            backends={
                "kern": {
                    "name": "kern",
                    "family": "kern",
                    "version": "1.2.3",
                    "available": "yes",
                    "devices": "cuda",
                    "refuses.sinks": "no sink argument",
                },
                "other": {
                    "name": "other",
                    "family": "other",
                    "version": "0.1",
                    "available": "yes",
                    "devices": "cuda",
                },
            },
            env={
                "host": "box",
                "torch": "2.13",
                "gpu": "H200",
                "driver": "580.1",
                "compute_capability": "9.0",
                "run": {"device": "cuda", "seed": 0},
            },
            argv=["attnconf", "run", "--suite", "smoke"],
            started="2026-01-01T00:00:00+00:00",
        ),
    )
    timing = Timing(
        median_ms=1.5,
        p20_ms=1.4,
        p80_ms=1.6,
        reps=100,
        method="cuda-events",
        tflops=500.0,
        gbps=None,
        roofline_pct=50.0,
        bound="compute",
    )
    for r in [
        rec(
            WIN,
            "kern",
            "fail",
            stats=stats(97.7, ("max_error",)),
            reason="max_error: |out-ref| 9.8e-01 at (token 3, head 1, dim 5)",
        ),
        rec(PLAIN, "kern", "pass", stats=stats(0.3), timing=timing),
        rec(SINK, "kern", "unsupported", reason="sinks: no sink argument"),
        rec(
            WIN,
            "other",
            "crash",
            reason="worker killed by SIGSEGV (exit status -11)\nFatal Python error: Segmentation fault",
        ),
        rec(PLAIN, "other", "timeout", reason="no reply within 5 s; worker killed"),
        rec(SINK, "other", "fail", stats=stats(3.0, ("lse",)), reason="lse: |lse-ref| 2.0e+00"),
    ]:
        append_record(path, r)
    return path


@pytest.fixture
def ledger_dir(tmp_path: Path) -> Path:
    d = tmp_path / "ledgers"
    d.mkdir()
    (d / "kern.toml").write_text(
        '[[failure]]\npattern = "*_win3-0*"\nreason = "KNOWN-WINDOW-BUG"\nevidence = "issue 895"\n'
        'glob_reason = "a test ledger"\n'
        '[[failure]]\npattern = "*_causal-*"\nreason = "was broken once"\nglob_reason = "a test ledger"\n'
        '[[failure]]\npattern = "*_nothing_*"\nreason = "STALE-ONE"\nglob_reason = "a test ledger"\n'
    )
    return d


def test_report_writes_both_files_with_failures_split_by_ledger(
    results_file: Path, ledger_dir: Path, tmp_path: Path
) -> None:
    md_path, html_path = write_report([results_file], tmp_path / "out", ledger_dir)
    md, html = md_path.read_text(), html_path.read_text()
    for text in (md, html):
        assert "Unexpected problems (3)" in text  # crash, timeout, lse fail; the window failure is known
        assert "Known failures (1)" in text and "KNOWN-WINDOW-BUG" in text
        assert SINK.summary() in text and WIN.summary() in text
        assert "SIGSEGV" in text and f"attnconf run --backend other --case-json {WIN.id}" in text
        assert "max abs 0.03 at (token, head, dim) (3, 1, 5); error ratio 3" in text  # worst error of the lse failure
        assert "STALE-ONE" in text and PLAIN.id in text  # stale entry; unexpected pass of *_causal-*
        assert "H200" in text and "1.2.3" in text and "no sink argument" in text  # environment, versions, capabilities
        assert "10.00" in text and "2.00" in text  # median harness and kernel ms
        assert "500.0" in text  # the performance table
    known_section = md.split("## Known failures")[1].split("##")[0]
    assert WIN.id in known_section
    unexpected_section = md.split("## Unexpected problems")[1].split("## Known")[0]
    assert f"`kern` {WIN.id}" not in unexpected_section
    assert (tmp_path / "out" / "error_ratio.png").read_bytes()[:4] == b"\x89PNG"
    # self-contained: plots inline, no external resources (links only to the page's own sections)
    assert "data:image/png;base64," in html
    assert not re.search(r'(src|href)="(?!data:|#)', html)


def test_feature_matrix_counts(results_file: Path) -> None:
    ctx = build_context(load_runs([results_file]), load_ledger(None), plots=False)
    assert ctx["backends"] == ["kern", "other"]
    rows = {row["feature"]: row["cells"] for row in ctx["matrix"]}
    assert rows["window"][0]["fail"] == 1 and rows["window"][1]["crash"] == 1
    assert rows["sinks"][0]["unsupported"] == 1 and rows["sinks"][1]["fail"] == 1
    assert rows["causal"][0]["pass"] == 1 and rows["causal"][1]["timeout"] == 1
    totals = {t["backend"]: t for t in ctx["totals"]}
    assert totals["kern"]["counts"]["fail"] == 1 and totals["other"]["problems"] == 3


def test_later_files_replace_earlier_records(results_file: Path, tmp_path: Path) -> None:
    rerun = tmp_path / "rerun.jsonl"
    append_record(rerun, rec(WIN, "other", "pass", stats=stats(0.2)))
    runs = load_runs([results_file, rerun])
    assert len(runs.results) == 6 and len(runs.headers) == 1
    assert {(r.case_id, r.backend): r.status for r in runs.results}[WIN.id, "other"] is Status.PASS


def test_report_cli(results_file: Path, tmp_path: Path) -> None:
    assert main(["report", str(results_file), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "report.html").exists() and (tmp_path / "rep" / "report.md").exists()
    assert main(["report", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "rep")]) == 2


def test_shards_of_one_sweep_are_one_run_entry() -> None:
    from conformance.reporting.report import _merge_shards

    def run(shard, cases, out):
        return {
            "suite": "default",
            "started": f"2026-01-01T00:00:0{shard}",
            "argv": f"attnconf run --suite default --shard {shard}/3 --out {out} --device cuda",
            "run": {"device": "cuda", "seed": 0, "shard": [shard, 3], "cases": cases},
            "env": {"gpu": "H200"},
            "backends": {"fa2": "2.8.3"},
        }

    merged = _merge_shards([run(0, 5, "a"), run(1, 4, "b"), run(2, 4, "c")])
    assert len(merged) == 1 and merged[0]["shards"] == "3 of 3 (0, 1, 2)"
    assert merged[0]["started"] == "2026-01-01T00:00:00" and "--shard" not in merged[0]["argv"].split("(")[0]
    other = run(1, 4, "d") | {"backends": {"fa2": "2.8.4"}}
    assert len(_merge_shards([run(0, 5, "a"), other])) == 2


def test_a_pass_past_an_entrys_versions_is_reported_fixed(tmp_path: Path) -> None:
    d = tmp_path / "fixed-ledger"
    d.mkdir()
    # kern 1.2.3 passes PLAIN (causal); the entry claims causal failures only below 1.2
    (d / "kern.toml").write_text(
        '[[failure]]\nreason = "CAUSAL-BUG-UNTIL-1.2"\nversions = "<1.2"\n[failure.when]\ncausal = true\n'
    )
    path = tmp_path / "v.jsonl"
    append_record(path, Header(suite="smoke", backends={"kern": {"name": "kern", "version": "1.2.3"}}, env={}))
    append_record(path, rec(PLAIN, "kern", "pass", version="1.2.3", stats=stats(0.3)))
    md_path, html_path = write_report([path], tmp_path / "out", d)
    for text in (md_path.read_text(), html_path.read_text()):
        assert "fixed (1)" in text and "fixed in 1.2.3" in text and "CAUSAL-BUG-UNTIL-1.2" in text
