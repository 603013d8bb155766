"""A path whose name is longer than the file system allows (ENAMETOOLONG), given to any input or output option of
any subcommand: one line naming the option (or the file) and the reason, exit 2 for an input, 3 for an output, no
traceback.  On Python < 3.12 ``Path.exists()`` and ``Path.is_file()`` raise that error instead of answering False,
and ``report``, ``compare``, ``merge``, ``ledger audit``, ``--ledger-dir`` and ``fuzz --db`` printed a traceback
(exit 1, which ``compare`` documents as "regressed"); found while mutation-testing ``results_file.load_results``."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.cli import main

EXACT = "tests.conformance.fakes:ExactBackend"


def _commands(long: str, res: str, tmp: Path) -> list[tuple[list[str], int, str]]:
    run = ["run", "--suite", "smoke", "--limit", "1", "--backend", EXACT, "--jobs", "1", "--no-progress"]
    return [
        (["report", long, "--out", str(tmp / "rep")], 2, long),
        (["report", res, "--out", long], 3, "--out"),
        (["report", res, "--out", str(tmp / "rep2"), "--ledger-dir", long], 2, "--ledger-dir"),
        (["compare", long, res], 2, long),
        (["compare", res, long], 2, long),
        (["merge", long, "--out", str(tmp / "m.jsonl")], 2, long),
        (["ledger", "audit", long], 2, long),
        ([*run, "--out", str(tmp / "a.jsonl"), "--ledger-dir", long], 2, "--ledger-dir"),
        ([*run, "--out", long], 3, "--out"),
        ([*run, "--out", str(tmp / "b.jsonl"), "--json", long], 3, "--json"),
        ([*run, "--out", str(tmp / "c.jsonl"), "--costs", long], 2, "--costs"),
        (["fuzz", "--backend", EXACT, "--budget", "1", "--out", str(tmp / "f.jsonl"), "--db", long], 3, "--db"),
        (["fuzz", "--backend", EXACT, "--budget", "1", "--out", long], 3, "--out"),
    ]


def test_a_name_too_long_is_one_line_and_an_exit_code_for_every_path_option(
    smoke_results_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    long = str(tmp_path / ("x" * 300))
    for argv, code, names in _commands(long, str(smoke_results_file), tmp_path):
        assert main(argv) == code, argv
        err = capsys.readouterr().err.strip()
        assert "Traceback" not in err and len(err.splitlines()) == 1, (argv, err)
        assert names in err and ("too long" in err or "cannot" in err), (argv, err)
