"""``attnconf fuzz`` end to end through the crash-isolated worker: records, resume, determinism, planted bugs found
and shrunk, the Hypothesis example database, the report section and the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.cli import main as cli_main
from conformance.fuzz.campaign import Budget, FuzzConfig, parse_budget, run_fuzz
from conformance.fuzz.draw import DrawLimits, draw
from conformance.fuzz.group import fuzz_role
from conformance.records import Status
from conformance.results_file import read_records
from conformance.reporting.report_render import write_report
from conformance.running.runner import UsageError

REPO = Path(__file__).resolve().parents[3]
LIMITS = DrawLimits(max_tokens=128, max_heads=8)
WINDOW_BUG = "tests.conformance.fakes:WindowOffByOneBackend"


def config(tmp_path: Path, name: str, backend: str, **kw) -> FuzzConfig:
    return FuzzConfig(
        backends=(backend,), device="cpu", out=tmp_path / name, limits=LIMITS, progress=False, timeout=60, **kw
    )


def roles(path: Path, role: str):
    return [r for r in read_records(path)[1] if fuzz_role(r).get("role") == role]


def test_budget_parsing():
    assert parse_budget("200") == Budget(cases=200)
    assert parse_budget("90s") == Budget(seconds=90) and parse_budget("10m") == Budget(seconds=600)
    assert parse_budget("1.5h") == Budget(seconds=5400)
    for bad in ("0", "10x", "-5", "m", "0s"):
        with pytest.raises(UsageError, match="--budget"):
            parse_budget(bad)


@pytest.mark.slow
def test_sdpa_cpu_campaign_writes_run_records_and_resumes_the_same_stream(tmp_path):
    first = run_fuzz(config(tmp_path, "f.jsonl", "sdpa-cpu", budget=Budget(cases=5), seed=7))
    assert first.exit_code == 0 and first.cases_run == 5 and first.worker_starts == 1
    resumed = run_fuzz(config(tmp_path, "f.jsonl", "sdpa-cpu", budget=Budget(cases=9), seed=7, resume=True))
    assert resumed.cases_run == 9 and resumed.written == 4  # the 5 recorded cases are not checked again
    headers, results = read_records(tmp_path / "f.jsonl")
    assert [h.suite for h in headers] == ["fuzz", "fuzz"]
    assert headers[0].env["fuzz"]["seed"] == 7 and headers[0].env["run"]["device"] == "cpu"
    assert headers[1].env["run"]["already_recorded"] == 5
    indices = [fuzz_role(r)["index"] for r in results]
    assert indices == sorted(indices) and len(set(indices)) == 9
    assert all(r.status in (Status.PASS, Status.UNSUPPORTED) and r.backend == "sdpa-cpu" for r in results)
    assert all(r.repro.startswith("attnconf run --backend sdpa-cpu --device cpu --seed 7 --case-json") for r in results)
    # the stream is the seed's: every record is draw(seed, index), and the skipped draws add up
    assert [r.case_id for r in results] == [draw(7, i, LIMITS).case.id for i in indices]
    skipped = sum(sum(fuzz_role(r)["skipped"].values()) for r in results)
    assert skipped == indices[-1] + 1 - len(indices)
    with pytest.raises(UsageError, match="seed=7"):
        run_fuzz(config(tmp_path, "f.jsonl", "sdpa-cpu", budget=Budget(cases=10), seed=8, resume=True))


@pytest.mark.slow
def test_planted_bug_is_found_shrunk_grouped_resumed_replayed_and_reported(tmp_path):
    """A window off-by-one in 12 cases: found, shrunk with too small a step budget (cut), finished by --resume,
    saved to the example database, replayed first by the next campaign, and shown in the report."""
    db = tmp_path / "db"
    cut = run_fuzz(config(tmp_path, "w.jsonl", WINDOW_BUG, budget=Budget(cases=12), seed=2, max_shrink_steps=2, db=db))
    assert cut.exit_code == 1 and cut.failures >= 2
    assert all(not fuzz_role(m)["complete"] for m in roles(tmp_path / "w.jsonl", "minimal"))
    assert not list(db.rglob("*")) or not any(p.is_file() for p in db.rglob("*"))  # nothing complete saved yet
    done = run_fuzz(
        config(
            tmp_path, "w.jsonl", WINDOW_BUG, budget=Budget(cases=12), seed=2, max_shrink_steps=300, db=db, resume=True
        )
    )
    originals = roles(tmp_path / "w.jsonl", "original")
    failures = [r for r in originals if r.status.is_problem]
    assert len(originals) == 12 and done.written == len(failures)  # only the minimal records are new
    finals = {fuzz_role(m)["original_id"]: m for m in roles(tmp_path / "w.jsonl", "minimal")}
    assert set(finals) == {r.case_id for r in failures}
    for m in finals.values():
        info = fuzz_role(m)
        assert info["complete"] and info["tried"] > 2 and info["path"][:1] and m.status is Status.FAIL
        assert info["shrink_steps"] == len(info["path"]) and info["group"]["mask"] != "none"
        case = m.case
        assert len(case["requests"]) == 1 and case.get("num_heads") == 1 and "window" in case
    assert len(done.groups) <= 2 and sum(g.count for g in done.groups) == len(failures)
    assert "failures in" in done.text() and "repro: attnconf run" in done.text()

    replay = run_fuzz(config(tmp_path, "r.jsonl", WINDOW_BUG, budget=Budget(cases=1), seed=99, db=db))
    replays = roles(tmp_path / "r.jsonl", "replay")
    assert replays and all(r.status is Status.FAIL for r in replays)
    assert {r.case_id for r in replays} == {m.case_id for m in finals.values()}
    assert replay.exit_code == 1

    md, html = write_report([tmp_path / "w.jsonl"], tmp_path / "report")
    text = md.read_text()
    assert "## Fuzz findings" in text and done.groups[0].label in text and "shrink path from" in text
    assert "Fuzz findings" in html.read_text()


@pytest.mark.slow
def test_command_line(tmp_path):
    out = tmp_path / "c.jsonl"
    assert cli_main(["fuzz", "--backend", "sdpa-cpu", "--device", "cpu", "--budget", "0", "--out", str(out)]) == 2
    assert cli_main(["fuzz", "--backend", "sdpa-cpu", "--device", "cpu", "--max-tokens", "8", "--out", str(out)]) == 2
    proc = subprocess.run(
        [sys.executable, "-m", "conformance", "fuzz", "--backend", "sdpa-cpu", "--device", "cpu", "--budget", "2",
         "--seed", "3", "--max-tokens", "64", "--out", str(out), "--no-progress"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "2 cases run" in proc.stderr and "no failures" in proc.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [x["type"] for x in lines] == ["header", "result", "result"]
    assert lines[0]["argv"][:2] == ["attnconf", "fuzz"]
