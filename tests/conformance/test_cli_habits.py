"""The command line as the tools its users live in behave (issue 28 items 3 and 4): ``--help`` and ``--version``
without torch, the suites named and described (``run --help``, ``attnconf suites``), ``cases`` in a terminal's
columns, plain progress lines without a terminal, and the end of a run that opens on its verdict."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.cases.case import AttentionCase
from conformance.suites.descriptions import LINE_MAX, SUITE_DESCRIPTIONS
from conformance.suites.registry import get_suite, suite_names
from conformance.cli import main
from conformance.cli.inventory import case_lines
from conformance.console import LineProgress, progress
from conformance.records import CheckResult, Status
from conformance.running.outcome import STATUS_MEANINGS, RunSummary

REPO = Path(__file__).resolve().parents[2]
FAKES = "tests.conformance.fakes"

#: Runs ``attnconf ARGV`` in a fresh interpreter, then says on its last stderr line which heavy modules it imported.
PROBE = (
    "import sys\n"
    "from conformance.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "heavy = sorted(m for m in ('torch', 'numpy', 'rich', 'conformance.cases.case') if m in sys.modules)\n"
    "print('IMPORTED', ','.join(heavy), len(sys.modules), file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def probe(*argv: str) -> tuple[subprocess.CompletedProcess, list[str], int]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    last = res.stderr.strip().splitlines()[-1].split(" ")
    assert last[0] == "IMPORTED", res.stderr
    return res, [m for m in last[1].split(",") if m], int(last[2])


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--version"],
        ["run", "--help"],
        ["warmup", "--help"],
        ["cases", "--help"],
        ["report", "--help"],
        ["compare", "--help"],
        ["merge", "--help"],
        ["backends", "--help"],
        ["fuzz", "--help"],
        ["ledger", "--help"],
        ["suites"],
        ["suites", "--json"],
    ],
)
def test_help_version_and_suites_import_no_torch(argv: list[str]) -> None:
    # before issue 28: 1,155 modules, torch among them (1.3 s on an idle machine); now about a hundred
    res, heavy, modules = probe(*argv)
    assert res.returncode == 0, res.stderr
    assert heavy == [] and modules < 250, (heavy, modules)
    assert res.stdout.strip()


def test_a_bad_flag_is_still_refused_without_torch() -> None:
    res, heavy, _ = probe("run", "--timeout", "0")
    assert res.returncode == 2 and "argument --timeout: must be" in res.stderr and heavy == []


def test_suites_lists_every_registered_suite_in_the_table_order(capsys: pytest.CaptureFixture) -> None:
    assert list(SUITE_DESCRIPTIONS) == suite_names()  # a new suite needs its line (suites/descriptions.py)
    assert all(0 < len(line) <= LINE_MAX for line in SUITE_DESCRIPTIONS.values())
    assert main(["suites"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == suite_names()
    assert all(ln.endswith(SUITE_DESCRIPTIONS[ln.split()[0]]) and len(ln) <= 120 for ln in lines)
    assert main(["suites", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed == [{"name": n, "description": SUITE_DESCRIPTIONS[n]} for n in suite_names()]


@pytest.mark.parametrize("command", ["run", "warmup", "cases"])
def test_the_help_of_the_commands_taking_suite_lists_them_one_per_line(
    command: str, capsys: pytest.CaptureFixture, monkeypatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "attnconf suites" in out
    for name in suite_names():
        (line,) = [ln for ln in out.splitlines() if ln.startswith(f"  {name} ")]
        assert SUITE_DESCRIPTIONS[name].split()[0] in line
    assert max(map(len, out.splitlines())) <= 100


def test_cases_lines_fit_120_columns_by_default(capsys: pytest.CaptureFixture, monkeypatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # output captured: not a terminal, so 120 columns
    smoke = get_suite("smoke")
    assert main(["cases", "--suite", "smoke"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 120
    assert [ln.split()[0] for ln in lines[: len(smoke)]] == [c.id for c in smoke]
    assert lines[len(smoke)] == "" and lines[len(smoke) + 1].startswith(f"{len(smoke)} cases; per feature: ")
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["cases", "--suite", "smoke"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 80 and [ln.split()[0] for ln in lines[: len(smoke)]] == [c.id for c in smoke]
    # --long: every field, however long (the lines this command printed before, up to 530 characters)
    assert main(["cases", "--suite", "smoke", "--long"]) == 0
    assert all(c.summary() in out for c, out in zip(smoke, capsys.readouterr().out.splitlines()))


def test_an_id_longer_than_the_width_stands_alone_and_whole() -> None:
    short = AttentionCase(((1, 1),), num_heads=2, num_kv_heads=1, head_dim=16)
    many = short.replace(requests=tuple((q, 4 * q) for q in range(1, 60)), batch_name="many")
    long = short.replace(batch_name="x" * 130)
    lines = case_lines([short, many, long], 120)
    assert lines[0].startswith(short.id + " ") and lines[0].endswith("  1 req  q/kv 1/1")
    assert lines[2] == long.id and len(long.id) > 120  # never cut: --case takes it
    assert len(lines[1]) <= 120 and " 59 req  q/kv 1/4 2/8" in lines[1] and lines[1].endswith(" ...")
    assert case_lines([short, many, long], 120, long=True)[1].endswith(many.summary())


def test_line_progress_prints_one_line_per_ten_percent_and_the_end(capsys: pytest.CaptureFixture) -> None:
    with LineProgress(unit="pairs") as bar:
        task = bar.add_task("smoke", total=40, counts="")
        for n in range(1, 41):
            bar.update(task, advance=1, counts=f"[green]pass {n}[/] [red]fail 0[/]")
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err and "[green]" not in err
    lines = err.splitlines()
    assert len(lines) == 10
    assert all(re.fullmatch(rf"smoke: {4 * k}/40 pairs \({10 * k}%\) after \d+ s: pass {4 * k} fail 0", ln)
               for k, ln in enumerate(lines, 1)), lines  # fmt: skip
    with LineProgress(disable=True) as bar:
        bar.update(bar.add_task("x", total=1), advance=1)
    assert capsys.readouterr().err == ""


def test_line_progress_ends_on_the_last_state_once() -> None:
    import io

    buf = io.StringIO()
    with LineProgress(file=buf) as bar:
        task = bar.add_task("fuzz", total=7, cases="")
        bar.update(task, completed=3, cases="3 cases")  # 42 %: four steps crossed, one line
    assert [re.sub(r"after \d+ s", "after T", ln) for ln in buf.getvalue().splitlines()] == [
        "fuzz: 3/7 (43%) after T: 3 cases"
    ]
    buf = io.StringIO()
    with LineProgress(file=buf) as bar:
        task = bar.add_task("fuzz", total=7, cases="")
        bar.update(task, completed=3, cases="3 cases")
        bar.update(task, completed=3, cases="3 cases, 1 failure")  # no new step: printed at the end
    assert len(buf.getvalue().splitlines()) == 2 and buf.getvalue().rstrip().endswith("3 cases, 1 failure")


def test_progress_without_a_terminal_is_line_based() -> None:
    assert not sys.stderr.isatty()  # pytest captures it
    assert isinstance(progress(), LineProgress)


def _record(backend: str, status: Status, case_id: str) -> CheckResult:
    return CheckResult(
        case_id=case_id, backend=backend, family="fake", status=status, case={}, reason="planted", repro="attnconf run"
    )


def test_the_end_of_a_run_opens_on_the_verdict_and_explains_the_counts() -> None:
    summary = RunSummary(out=Path("r.jsonl"), workers=2, worker_starts=2, wall_s=3.0, written=3)
    summary.harness_s = [0.01]
    summary.results = [
        _record("fake-exact", Status.PASS, "a-000001"),
        _record("fake-refuses", Status.UNSUPPORTED, "a-000001"),
        _record("fake-refuses", Status.PASS, "b-000002"),
    ]
    text = summary.terminal()
    lines = text.splitlines()
    assert lines[0] == summary.verdict_line() == "exit 0: no problem"
    assert "3 (case, backend) pair(s): pass 2, fail 0, unsupported 1, error 0, crash 0, timeout 0" in lines
    assert f"  unsupported 1: {STATUS_MEANINGS[Status.UNSUPPORTED]}" in lines and "`attnconf backends` says why" in text
    assert "median per record" not in text and "median per record" in summary.terminal(timings=True)
    assert lines[-1] != lines[0]  # nothing listed: the verdict once
    assert "worker starts" not in text  # one start per worker: nothing to say
    summary.worker_starts = 3
    assert "by 2 worker(s); worker starts: 3 (a crash, a timeout or a CUDA error replaces its worker)" in (
        summary.terminal()
    )
    summary.results.append(_record("fake-lse-sign", Status.FAIL, "c-000003"))
    summary.problems = 1
    lines = summary.terminal().splitlines()
    assert lines[0] == lines[-1] == "exit 1: 1 problem(s)"  # a listing ends on the verdict again
    assert f"  fail 1: {STATUS_MEANINGS[Status.FAIL]}" in lines and "UNEXPECTED: 1 problem(s)" in "\n".join(lines)


def test_a_run_prints_progress_lines_then_the_verdict_first(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cases = [c.to_json() for c in get_suite("smoke")[:3]]
    (tmp_path / "ledgers").mkdir()
    argv = ["run", "--case-json", json.dumps(cases), "--backend", f"{FAKES}:ExactBackend"]
    argv += ["--backend", f"{FAKES}:RefusesEverythingBackend", "--allow-unjudged", "--jobs", "1"]
    argv += ["--ledger-dir", str(tmp_path / "ledgers"), "--out", str(tmp_path / "r.jsonl")]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err
    lines = err.splitlines()
    shown = [ln for ln in lines if re.match(r"cases: \d/6 pairs \(\d+%\) after \d+ s: pass \d fail 0 unsup", ln)]
    assert shown and shown[-1].startswith("cases: 6/6 pairs (100%)") and lines[: len(shown)] == shown
    assert lines[len(shown)] == "exit 0: no unexpected problem (0 known); 1 backend(s) judged no case (accepted " \
        "with --allow-unjudged)"  # fmt: skip
    assert "6 (case, backend) pair(s): pass 3, fail 0, unsupported 3, error 0, crash 0, timeout 0" in lines
    assert lines[-1] == lines[len(shown)]  # the UNJUDGED line is listed, then the verdict again


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["suites", "--bogus"], "attnconf: unrecognized arguments: --bogus"),
        (["suites", "extra"], "attnconf: unrecognized arguments: extra"),
        (["cases", "--suite", "smoke", "--long", "--json"], "--long lists the cases as text: not with --json"),
        (["cases", "--suite", "smoke", "--long", "--coverage"], "not with --json or --coverage"),
        (["cases", "--suite", "nope"], "--suite must be one of"),
    ],
)
def test_bad_suites_and_cases_flags_are_one_line(argv: list[str], says: str, capsys: pytest.CaptureFixture) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert says in captured.err and captured.err.count("\n") == 1 and captured.out == ""


@pytest.mark.parametrize(("columns", "width"), [("abc", 120), ("0", 120), ("5", 40), ("-3", 120), ("90", 90)])
def test_cases_takes_any_columns_value(columns: str, width: int, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    ids = {c.id for c in get_suite("smoke")}
    assert main(["cases", "--suite", "smoke"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(len(ln) <= width or ln in ids for ln in lines)
    assert {ln.split()[0] for ln in lines if ln and not ln.startswith(" ") and "cases; per feature" not in ln} == ids


def test_line_progress_without_a_total_says_the_time_only() -> None:
    import io

    buf = io.StringIO()
    with LineProgress(file=buf) as bar:
        bar.update(bar.add_task("compile", total=0, n=""), advance=1, n="1 kernel")
        bar.update(bar.add_task("other", total=None), advance=1)
    assert [re.sub(r"\d+ s", "T s", ln) for ln in buf.getvalue().splitlines()] == [
        "compile: after T s: 1 kernel",
        "other: after T s",
    ]
