"""``attnconf run --report DIR``: the main job in one command whose exit status is the run's (issue 28).

The report is written after the run, from the whole results file, as ``attnconf report`` writes it; DIR is checked
before any worker starts; a report that cannot be written after the run says so in one line and exits 3 (2 when
refused) only when the run itself exits 0.  Sweeps run in-process through :func:`conformance.cli.main` on fakes.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from conformance.cli import main
from conformance.exits import OutputError
from conformance.outputs import is_own
from conformance.reporting.report import HTML_KIND, MD_KIND
from conformance.running import runner
from conformance.running.pairs import RunConfig
from tests.conformance.reporting.report_data import write_results
from tests.conformance.running.test_run_cli import FAKES, IDS, base_args


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("no-ledgers")  # no entry: every problem is unexpected


def test_the_run_writes_its_report_and_exits_with_its_own_status(tmp_path: Path, ledger: Path, capsys) -> None:
    out, rep = tmp_path / "r.jsonl", tmp_path / "report"
    args = [*base_args(out, ledger), "--report", str(rep)]
    assert main(args) == 1  # fake-lse-sign fails: the run's 1, not the report's 0
    err = capsys.readouterr().err
    assert f"attnconf run: report: {rep / 'report.html'} and {rep / 'report.md'}" in err
    md = (rep / "report.md").read_text()
    assert md.index("## Verdict: ") < md.index("## Unexpected problems") < md.index("## Environment")
    assert "- `fake-lse-sign` " in md and "fake-lse-sign` fail: failed lse" in md
    assert is_own(rep / "report.md", MD_KIND) and is_own(rep / "report.html", HTML_KIND)
    # resumed, with nothing left to run: the report of the whole file replaces the earlier one (no backup)
    assert main([*args, "--resume"]) == 1
    assert (rep / "report.md").read_text().count("fake-lse-sign` fail") == 1
    assert sorted(p.name for p in rep.iterdir()) == ["error_ratio.png", "report.html", "report.md"]


def test_a_run_without_problems_exits_0_with_its_report(tmp_path: Path, ledger: Path) -> None:
    out, rep = tmp_path / "r.jsonl", tmp_path / "rep"
    args = ["run", "--suite", "smoke", "--case", IDS[0], "--backend", f"{FAKES}:ExactBackend", "--jobs", "1"]
    args += ["--no-progress", "--ledger-dir", str(ledger), "--out", str(out), "--report", str(rep)]
    assert main(args) == 0
    assert "## Verdict: No unexpected problem (0 known)" in (rep / "report.md").read_text()


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("a-file", "--report {rep}: exists and is not a directory"),
        ("the-out", "--out {out}: is also --report (the report directory); give it a file path"),
        ("json-inside", "--json {rep}/report.md: is also --report"),
        ("under-a-file", "--report {rep}: cannot create it: a part of the path is a file"),
    ],
)
def test_a_report_dir_is_refused_before_any_worker_starts(
    tmp_path: Path, ledger: Path, capsys, where: str, message: str
) -> None:
    out, rep = tmp_path / "r.jsonl", tmp_path / "rep"
    extra: list[str] = []
    if where == "a-file":
        rep.write_text("mine\n")
    elif where == "the-out":
        rep = out
    elif where == "json-inside":
        extra = ["--json", str(rep / "report.md")]
    elif where == "under-a-file":
        (tmp_path / "f").write_text("mine\n")
        rep = tmp_path / "f" / "rep"
    assert main([*base_args(out, ledger), "--report", str(rep), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "Traceback" not in err, err
    assert err.startswith("attnconf run: " + message.format(rep=rep, out=out)), err
    assert not out.exists()  # refused before the run: no results file
    if where == "a-file":
        assert rep.read_text() == "mine\n"


def test_a_report_without_its_libraries_is_refused_before_the_run(
    tmp_path: Path, ledger: Path, capsys, monkeypatch
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "jinja2" else real(name, *a))
    out = tmp_path / "r.jsonl"
    assert main([*base_args(out, ledger), "--report", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert "attnconf run: --report: a report needs jinja2, not installed here: pip install 'attnconf[report]'" in err
    assert not out.exists()


def test_warmup_refuses_a_report(tmp_path: Path, capsys) -> None:
    args = ["warmup", "--suite", "smoke", "--case", IDS[0], "--backend", f"{FAKES}:ExactBackend"]
    assert main([*args, "--report", str(tmp_path / "rep")]) == 2
    assert "--report: --compile-only (warmup) writes no results file" in capsys.readouterr().err


@pytest.mark.parametrize(("run_status", "status"), [(0, 3), (1, 1), (4, 4)])
def test_a_report_that_cannot_be_written_after_the_run(
    tmp_path: Path, capsys, monkeypatch, run_status: int, status: int
) -> None:
    """The disk fills between the check and the writing: one line, the run's status when it is not 0, else 3."""
    from conformance.reporting import report_render

    def full(outs, quiet=False):
        raise OutputError(f"--report {outs[0].path}: cannot write: No space left on device")

    monkeypatch.setattr(report_render, "write_many", full)
    out = write_results(tmp_path / "r.jsonl")
    config = RunConfig(backends=("kern",), out=out, report=tmp_path / "rep")
    assert runner._write_report(config, run_status) == status
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err], err
    assert err.startswith(f"attnconf run: --report {tmp_path / 'rep'}: not written: --report ")
    assert "No space left on device" in err and f"retry: attnconf report {out} --out {tmp_path / 'rep'}" in err
    assert (f"the run's exit status {run_status} stands" in err) == bool(run_status)
    assert not (tmp_path / "rep" / "report.md").exists()
