"""The attnconf command line: subcommands, exit statuses, ``python -m conformance``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.cli import main
from conformance.cases.suites import get_suite

REPO = Path(__file__).resolve().parents[2]


def test_cases_lists_ids_summaries_and_feature_counts(capsys: pytest.CaptureFixture) -> None:
    assert main(["cases", "--suite", "smoke", "--case", "*_causal*"]) == 0
    out = capsys.readouterr().out
    wanted = [c for c in get_suite("smoke") if "_causal" in c.id]
    assert all(c.id in out and c.summary() in out for c in wanted)
    assert f"{len(wanted)} cases; per feature:" in out and f"causal {len(wanted)}" in out


def test_cases_json(capsys: pytest.CaptureFixture) -> None:
    assert main(["cases", "--suite", "smoke", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [c["id"] for c in listed] == [c.id for c in get_suite("smoke")]
    assert set(listed[0]) == {"id", "summary", "features", "case"}


def test_backends_json_has_capabilities_and_reasons(capsys: pytest.CaptureFixture) -> None:
    assert main(["backends", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["sdpa-cpu"]["available"] == "yes" and info["sdpa-cpu"]["version"]
    assert "softcap" in info["sdpa-cpu"]["refused"]  # SDPA has no score modifier
    import torch

    if not torch.cuda.is_available():
        assert info["fa2"]["available"] == "no" and info["fa2"]["unavailable_reason"]


def test_backends_table_accepts_import_paths(capsys: pytest.CaptureFixture) -> None:
    assert main(["backends", "--backend", "tests.conformance.fakes:RefusesSinksBackend", "--backend", "no-such"]) == 0
    out = capsys.readouterr().out
    assert "fake-refuses-sinks" in out and "no-such: not available: cannot load" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--suite", "nope", "--backend", "sdpa-cpu"],
        ["run", "--backend", "sdpa-cpu"],  # no --suite, no --case-json
        ["run", "--suite", "smoke", "--backend", "sdpa-cpu", "--shard", "3/3"],
        ["run", "--suite", "smoke", "--backend", "sdpa-cpu", "--case", "matches-nothing"],
        ["run", "--suite", "smoke", "--backend", "no-such-backend"],
        ["run", "--suite", "smoke", "--backend", "sdpa-cpu", "--tol", "factor=abc"],
        ["run", "--suite", "smoke", "--device", "tpu"],  # no installed backend runs on that device
        ["cases"],
        ["frobnicate"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], tmp_path: Path) -> None:
    assert main([*argv, *(["--out", str(tmp_path / "r.jsonl")] if argv[0] == "run" and len(argv) > 1 else [])]) == 2
    assert not (tmp_path / "r.jsonl").exists()


def test_help_exits_0() -> None:
    assert main(["--help"]) == 0


def test_python_dash_m_conformance() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "conformance", "cases", "--suite", "smoke", "--case", "*_sink-*"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "_sink-" in res.stdout and "cases; per feature" in res.stdout


def test_run_without_backend_uses_every_available_backend_of_the_device(tmp_path) -> None:
    import torch

    from conformance.cli import main
    from conformance.records import read_records

    out = tmp_path / "auto.jsonl"
    assert main(["run", "--suite", "smoke", "--limit", "1", "--out", str(out), "--no-progress"]) == 0
    headers, results = read_records(out)
    expected = {"sdpa-cpu", "flex-cpu"} if not torch.cuda.is_available() else None
    if expected is not None:
        assert {r.backend for r in results} == expected and headers[0].env["device"] == "cpu"
