"""The report's backward timing table: backward timings beside their forward twins, out of the forward table."""

from __future__ import annotations

from pathlib import Path

from conformance.cases.case import AttentionCase
from conformance.records import CheckResult, Header, Status, Timing
from conformance.results_writer import append_record
from conformance.reporting.backward_perf import backward_perf_rows
from conformance.reporting.report_render import write_report

FWD = AttentionCase(requests=((512, 512),) * 2, num_heads=4, num_kv_heads=4, head_dim=64, causal=True)
BWD = FWD.replace(backward=True)
DET = FWD.replace(backward=True, deterministic=True)
FLOPS = 1e12  # the forward's


def timing(ms: float, phase: str = "forward", factor: float = 1.0, **kw) -> Timing:
    return Timing(
        median_ms=ms,
        p20_ms=ms * 0.9,
        p80_ms=ms * 1.1,
        reps=10,
        method="cuda-events" + (",backward-only" if phase == "backward" else ""),
        flops=FLOPS * factor,
        tflops=FLOPS * factor / (ms * 1e-3) / 1e12,
        roofline_pct=42.0,
        phase=phase,
        **kw,
    )


def rec(case: AttentionCase, backend: str, t: Timing | None) -> CheckResult:
    return CheckResult(
        case_id=case.id, backend=backend, family=backend, status=Status.PASS, case=case.to_json(), timing=t
    )


RECORDS = [
    rec(FWD, "fa2", timing(2.0)),
    rec(BWD, "fa2", timing(5.0, "backward", 2.5, fwd_bwd_ms=7.0)),
    rec(DET, "fa2", timing(6.0, "backward", 2.5, fwd_bwd_ms=8.0)),
    rec(BWD, "sdpa", timing(10.0, "fwd+bwd", 3.5)),  # no backward_only: the whole call, no twin timed
    rec(BWD, "flex", None),  # untimed records are not rows
]


def test_rows_pair_backward_with_the_forward_twin():
    rows = {(r["case_id"], r["backend"]): r for r in backward_perf_rows(RECORDS)}
    assert set(rows) == {(BWD.id, "fa2"), (DET.id, "fa2"), (BWD.id, "sdpa")}
    r = rows[BWD.id, "fa2"]
    assert (r["bwd_ms"], r["fwd_bwd_ms"], r["fwd_ms"]) == ("5", "7", "2")
    assert r["bwd_tflops"] == "500.0"  # 2.5e12 / 5 ms
    assert r["fwd_bwd_tflops"] == "500.0"  # 3.5e12 / 7 ms
    assert r["fwd_tflops"] == "500.0" and r["bwd_over_fwd"] == "2.50" and r["roofline"] == "42"
    assert rows[DET.id, "fa2"]["fwd_ms"] == "2"  # the deterministic backward's twin is the plain forward
    s = rows[BWD.id, "sdpa"]
    assert s["phase"] == "fwd+bwd" and s["bwd_ms"] == "" and s["bwd_tflops"] == ""
    assert s["fwd_bwd_ms"] == "10" and s["fwd_bwd_tflops"] == "350.0" and s["fwd_ms"] == ""


def test_report_shows_the_table_and_keeps_backward_out_of_the_forward_one(tmp_path: Path):
    path = tmp_path / "r.jsonl"
    append_record(path, Header(suite="perf", backends={}, env={"run": {"device": "cuda"}}, started="2026"))
    for r in RECORDS:
        append_record(path, r)
    md, html, ctx = write_report([path], tmp_path / "out", with_context=True)
    assert [p["case_id"] for p in ctx["perf"]] == [FWD.id]
    assert len(ctx["backward_perf"]) == 3
    text = md.read_text()
    assert "### Backward timing" in text and "| bwd ms |" in text
    assert f"| {BWD.id} | fa2 | pass | 5 |" in text
    assert "Backward timing" in html.read_text()
    # a run without backward timings has no such section
    plain = tmp_path / "p.jsonl"
    append_record(plain, Header(suite="perf", backends={}, env={"run": {"device": "cuda"}}, started="2026"))
    append_record(plain, RECORDS[0])
    md2, _ = write_report([plain], tmp_path / "out2")
    assert "Backward timing" not in md2.read_text()
