"""``attnconf run`` as a CI log reads it: resume refusals, numbered backups, the listing of unexpected and known
problems, the ``--json`` summary, the exit status (``--strict``), and Ctrl-C.

The sweeps run in-process through :func:`conformance.cli.main` (the workers are real subprocesses) on one
or two cases; refusals happen before any worker starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from conformance.suites.registry import get_suite
from conformance.cli import main
from conformance.records import CheckResult, Header, Status
from conformance.results_file import read_records
from conformance.ledger.entries import load_ledger
from conformance.running import runner
from conformance.running.outcome import RunSummary
from conformance.running.outfile import backup_path, check_resume, move_aside
from conformance.exits import UsageError

FAKES = "tests.conformance.fakes"
SMOKE = get_suite("smoke")
IDS = [SMOKE[0].id, SMOKE[1].id]  # bf16 and fp16 prefill, contiguous

# fake-raising's error is a known failure; fake-exact is claimed to fail (its pass is unexpected); fake-lse-sign
# fails with no entry (unexpected).
LEDGER = {
    "fake-raising.toml": '[[failure]]\npattern = "*"\nglob_reason = "test ledger: every case"\n'
    'reason = "planted: the fake kernel raises"\nstatuses = ["error"]\n',
    "fake-exact.toml": '[[failure]]\npattern = "*_bf16_*"\nglob_reason = "test ledger"\n'
    'reason = "claimed, never true"\n',
}


def base_args(out: Path, ledger: Path) -> list[str]:
    return [
        "run",
        "--suite",
        "smoke",
        *[a for i in IDS for a in ("--case", i)],
        "--backend",
        f"{FAKES}:ExactBackend",
        "--backend",
        f"{FAKES}:LseSignBackend",
        "--backend",
        f"{FAKES}:RaisingBackend",
        "--jobs",
        "1",
        "--no-progress",
        "--ledger-dir",
        str(ledger),
        "--out",
        str(out),
    ]


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("ledgers")
    for name, text in LEDGER.items():
        (directory / name).write_text(text)
    return directory


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory, ledger: Path) -> dict:
    """One sweep over an ``--out`` that already has two generations: r.jsonl and r.1.jsonl."""
    tmp = tmp_path_factory.mktemp("sweep")
    out = tmp / "r.jsonl"
    out.write_text("the last sweep\n")
    (tmp / "r.1.jsonl").write_text("an older sweep\n")
    (tmp / "r.prev.jsonl").write_text("a backup of the old scheme\n")
    args = base_args(out, ledger)
    err = io.StringIO()  # a module fixture has no capsys
    with contextlib.redirect_stderr(err):
        code = main([*args, "--json", str(tmp / "summary.json")])
    return {"tmp": tmp, "out": out, "args": args, "code": code, "stderr": err.getvalue(), "ledger": ledger}


def test_the_sweep_keeps_every_earlier_file_under_a_new_number(sweep: dict) -> None:
    tmp = sweep["tmp"]
    assert (tmp / "r.1.jsonl").read_text() == "an older sweep\n"
    assert (tmp / "r.2.jsonl").read_text() == "the last sweep\n"
    assert (tmp / "r.prev.jsonl").read_text() == "a backup of the old scheme\n"
    assert f"moved the existing {sweep['out']} to {tmp / 'r.2.jsonl'}" in sweep["stderr"]


def test_backups_over_three_runs_are_numbered_and_never_overwritten(tmp_path: Path) -> None:
    out = tmp_path / "res.jsonl"
    (tmp_path / "res.x.jsonl").write_text("not a backup\n")  # not a number: ignored
    for n in range(1, 4):
        out.write_text(f"run {n}\n")
        assert move_aside(out) == tmp_path / f"res.{n}.jsonl"
        assert not out.exists()
    assert [(tmp_path / f"res.{n}.jsonl").read_text() for n in range(1, 4)] == ["run 1\n", "run 2\n", "run 3\n"]
    (tmp_path / "res.1.jsonl").unlink()  # a gap is never refilled: the highest number stays the newest
    assert backup_path(out) == tmp_path / "res.4.jsonl"


def test_a_gzipped_results_file_keeps_its_double_suffix_in_one_backup_scheme(tmp_path: Path) -> None:
    import conformance.outputs

    assert move_aside is conformance.outputs.move_aside and backup_path is conformance.outputs.backup_path
    out = tmp_path / "r.jsonl.gz"
    out.write_bytes(b"gzipped sweep")
    assert move_aside(out) == tmp_path / "r.1.jsonl.gz" and (tmp_path / "r.1.jsonl.gz").read_bytes() == b"gzipped sweep"
    assert backup_path(out) == tmp_path / "r.2.jsonl.gz"


def test_the_sweep_lists_unexpected_problems_and_counts_known_ones(sweep: dict) -> None:
    err = sweep["stderr"]
    assert sweep["code"] == 1  # fake-lse-sign is unexpected
    assert "UNEXPECTED: 2 problem(s)" in err
    for case_id in IDS:
        assert f"fail    fake-lse-sign  {case_id}" in err
    assert "repro: attnconf run --backend tests.conformance.fakes:LseSignBackend" in err
    assert "known: 2 problem(s) explained by 1 ledger entr(ies):" in err
    assert re.search(r"  2  fake-raising  \S*fake-raising\.toml\S* \(error 2\): planted: the fake kernel raises", err)
    assert "unexpected passes: 1" in err and IDS[0] in err.split("unexpected passes")[1]
    assert err.rstrip().endswith("exit 1: 2 unexpected problem(s) (2 known, 1 unexpected pass(es))")
    assert "Traceback" not in err


def test_json_summary(sweep: dict) -> None:
    summary = json.loads((sweep["tmp"] / "summary.json").read_text())
    assert summary["exit_status"] == 1 and summary["out"] == str(sweep["out"]) and summary["wall_s"] > 0
    assert summary["counts"] == {"pass": 2, "fail": 2, "unsupported": 0, "error": 2, "crash": 0, "timeout": 0}
    assert summary["pairs"] == summary["written"] == 6 and not summary["interrupted"]
    assert sorted((u["backend"], u["case_id"], u["status"]) for u in summary["unexpected"]) == [
        ("fake-lse-sign", i, "fail") for i in sorted(IDS)
    ]
    assert all(u["repro"].startswith("attnconf run ") and u["reason"] for u in summary["unexpected"])
    [known] = summary["known"]
    assert known["backend"] == "fake-raising" and known["count"] == 2
    assert sorted(known["cases"]) == [[i, "error"] for i in sorted(IDS)]
    assert [(p["backend"], p["case_id"]) for p in summary["unexpected_passes"]] == [("fake-exact", IDS[0])]


def test_the_header_carries_the_sweep_identity(sweep: dict) -> None:
    [header], results = read_records(sweep["out"])
    s = header.sweep
    assert s["suite"] == "smoke" and s["seed"] == 0 and s["device"] == "cpu" and s["tol"] == []
    assert s["selection"]["case"] == IDS and s["selection"]["feature"] == [] and s["selection"]["limit"] is None
    assert s["cases"] == 2 and len(s["case_ids_sha256"]) == 64 and len(results) == 6


def test_the_header_carries_the_selection_the_cli_parsed(sweep: dict) -> None:
    """``Header.selection``: what decides the pairs, as ``attnconf run`` parsed it (the device resolved), from which
    ``attnconf merge`` rebuilds the cases (:meth:`Selection.cases`)."""
    from conformance.running.run_args import selection_from_argv
    from conformance.running.selection import Selection

    [header], results = read_records(sweep["out"])
    chosen = Selection.from_json(header.selection)
    assert chosen.suite == "smoke" and chosen.case_patterns == tuple(IDS) and chosen.device == "cpu"
    assert chosen.backends == tuple(f"{FAKES}:{b}" for b in ("ExactBackend", "LseSignBackend", "RaisingBackend"))
    assert [c.id for c in chosen.cases()] == IDS and {r.case_id for r in results} == set(IDS)
    assert selection_from_argv(header.argv) == dataclasses.replace(chosen, device="auto")  # as typed: no --device


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (["--seed", "1"], "seed="),
        (["--tol", "factor=2"], "tol="),
        (["--tol-file", "TOLFILE"], "tol="),
        (["--exclude", "nothing-matches-*"], "selection.exclude="),
        (["--feature", "prefill"], "selection.feature="),
        (["--limit", "1"], "selection.limit="),
        (["--shard", "0/1"], "selection.shard="),
        (["--case", "*_fp16_*"], "selection.case="),
    ],
)
def test_resume_refuses_another_sweep(sweep: dict, change: list[str], field: str, capsys) -> None:
    out = sweep["out"]
    before = out.read_bytes()
    tol_file = sweep["tmp"] / "tol.toml"
    tol_file.write_text("factor = 4\n")
    change = [str(tol_file) if c == "TOLFILE" else c for c in change]
    assert main([*sweep["args"], "--resume", *change]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "--resume" in ln]
    assert len(lines) == 1 and str(out) in lines[0] and field in lines[0], err
    assert "Traceback" not in err and out.read_bytes() == before


def test_resume_refuses_a_file_of_other_cases(sweep: dict, tmp_path: Path, capsys) -> None:
    case = tmp_path / "case.json"
    case.write_text(json.dumps(SMOKE[0].to_json()))
    args = [a for a in sweep["args"] if a not in ("--suite", "smoke", "--case", *IDS)]
    assert main([*args, "--case-json", f"@{case}", "--resume"]) == 2
    assert "suite=" in capsys.readouterr().err


def test_resume_of_the_same_sweep_runs_nothing_and_strict_counts_known(sweep: dict, tmp_path: Path, capsys) -> None:
    # on a copy: the module's other tests read the sweep's file as the sweep left it, in whatever order they run
    # (pytest-xdist runs them on two workers, each taking the other's pending tests when it runs out)
    out = tmp_path / "r.jsonl"
    shutil.copy(sweep["out"], out)
    args = [str(out) if a == str(sweep["out"]) else a for a in sweep["args"]]
    assert args != sweep["args"]
    assert main([*args, "--resume", "--strict"]) == 1
    err = capsys.readouterr().err
    assert "0 records written" in err and "(6 already there)" in err and "UNEXPECTED: 2" in err
    headers, results = read_records(out)
    assert len(headers) == 2 and len(results) == 6 and headers[1].sweep == headers[0].sweep


def test_check_resume_reads_headers_written_before_the_sweep_field(tmp_path: Path) -> None:
    now = {"suite": "smoke", "seed": 0, "device": "cpu", "selection": {"shard": None}}
    now["tol_args"] = {"tol": [], "tol_file": None}
    legacy = Header(suite="smoke", backends={}, env={"run": {"seed": 3, "device": "cpu", "tol": []}})
    with pytest.raises(UsageError, match="seed=3"):
        check_resume(tmp_path / "old.jsonl", [legacy], now, has_records=True)
    check_resume(tmp_path / "old.jsonl", [Header("smoke", {}, {"run": {"seed": 0, "tol": []}})], now, True)
    with pytest.raises(UsageError, match="no header line"):
        check_resume(tmp_path / "junk.jsonl", [], now, has_records=True)


_NOW = {
    "suite": "smoke",
    "seed": 0,
    "device": "cpu",
    "selection": {"shard": [0, 2]},
    "tol_args": {"tol": ["fp32=1e-5"], "tol_file": None},
}


@pytest.mark.parametrize(
    ("suite", "run", "field"),
    [
        ("smoke", {"seed": 0, "device": "cpu", "shard": [0, 2], "tol": ["fp32=1e-5"]}, None),
        ("default", {}, "suite"),
        ("custom", {}, "suite"),  # a --case-json run recorded suite "custom": its sweep's suite is None
        ("smoke", {"seed": 1}, "seed"),
        ("smoke", {"device": "cuda"}, "device"),
        ("smoke", {"shard": [1, 2]}, "selection.shard"),
        ("smoke", {"tol": []}, "tol_args"),
        ("smoke", {"tol_file": "t.toml"}, "tol_args"),
        ("smoke", {"tol": ["fp32=1e-5"], "tol_file": "t.toml"}, "tol_args"),
    ],
)
def test_a_header_from_before_the_sweep_field_is_compared_on_each_field_it_recorded(
    tmp_path: Path, suite: str, run: dict, field: str | None
) -> None:
    """Suite, seed, device, shard and the --tol/--tol-file arguments of a legacy header each refuse a resume that
    changes them, naming the field; what the header did not record is not compared."""
    legacy = Header(suite=suite, backends={}, env={"run": run})
    if field is None:
        check_resume(tmp_path / "old.jsonl", [legacy], _NOW, has_records=True)
        return
    with pytest.raises(UsageError, match=rf"\(header 1 of 1\) was run with {re.escape(field)}="):
        check_resume(tmp_path / "old.jsonl", [legacy], _NOW, has_records=True)
    custom = {**_NOW, "suite": None}
    if suite == "custom":
        check_resume(tmp_path / "old.jsonl", [legacy], custom, has_records=True)


def _result(backend: str, status: Status, case_id: str = "c_bf16_x-000000") -> CheckResult:
    return CheckResult(case_id=case_id, backend=backend, family="fake", status=status, case={}, reason="why\nmore")


@pytest.mark.parametrize(
    ("results", "strict", "code"),
    [
        ([("fake-raising", Status.ERROR)], False, 0),  # known only
        ([("fake-raising", Status.ERROR)], True, 1),
        ([("fake-raising", Status.ERROR), ("fake-lse-sign", Status.FAIL)], False, 1),
        ([("fake-exact", Status.PASS)], False, 0),  # an unexpected pass alone
        ([("fake-exact", Status.PASS)], True, 1),
        ([("fake-raising", Status.CRASH)], False, 1),  # the entry explains errors, not crashes
        ([("other", Status.PASS)], True, 0),
    ],
)
def test_exit_status(ledger: Path, results: list, strict: bool, code: int) -> None:
    summary = RunSummary(out=Path("r.jsonl"), results=[_result(b, s) for b, s in results])
    summary.finish(load_ledger(ledger), strict=strict)
    assert summary.exit_code == code
    assert summary.listing().splitlines()[-1].startswith(f"exit {code}: ")
    summary.interrupted = True
    assert summary.exit_code == 130


def test_ctrl_c_keeps_the_records_and_says_how_to_resume(tmp_path: Path, monkeypatch, capsys) -> None:
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([c.to_json() for c in SMOKE[:3]]))
    out = tmp_path / "r.jsonl"
    args = ["run", "--case-json", f"@{cases}", "--backend", f"{FAKES}:ExactBackend", "--jobs", "1"]
    args += ["--no-progress", "--out", str(out), "--json", str(tmp_path / "s.json")]
    account = runner._account
    calls = []

    def interrupted(summary, record, reply):  # Ctrl-C arrives while the second record is being counted
        account(summary, record, reply)
        calls.append(record)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(runner, "_account", interrupted)
    assert main(args) == 130
    err = capsys.readouterr().err
    resume = shlex.join(["attnconf", *args, "--resume"])
    assert f"resume with: {resume}" in err and "interrupted (Ctrl-C)" in err and "Traceback" not in err
    _, kept = read_records(out)  # the two counted, and the third if it arrived in the same batch
    assert [r.case_id for r in kept][:2] == [c.id for c in SMOKE[:2]] and len(kept) <= 3
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["exit_status"] == 130 and summary["interrupted"] and summary["resume_command"] == resume
    monkeypatch.setattr(runner, "_account", account)
    assert main([*args, "--resume"]) == 0
    _, results = read_records(out)
    assert sorted(r.case_id for r in results) == sorted(c.id for c in SMOKE[:3])


# ---------------------------------------------------------------- a backend that judged no case: exit 4 (issue 29)
@pytest.mark.slow
def test_a_backend_that_judges_no_case_fails_the_run_with_4_and_allow_unjudged_accepts_it(
    tmp_path: Path, ledger: Path, capsys
) -> None:
    out = tmp_path / "r.jsonl"
    args = ["run", "--suite", "smoke", *[a for i in IDS for a in ("--case", i)], "--jobs", "1", "--no-progress"]
    args += ["--ledger-dir", str(ledger), "--out", str(out), "--backend", f"{FAKES}:ExactBackend"]
    args += ["--backend", f"{FAKES}:RefusesEverythingBackend", "--backend", f"{FAKES}:NotInstalledBackend"]
    assert main([*args, "--json", str(tmp_path / "s.json")]) == 4
    err = capsys.readouterr().err
    unjudged = [ln for ln in err.splitlines() if ln.startswith("UNJUDGED: ")]
    assert unjudged == [
        "UNJUDGED: fake-refuses-everything judged none of its 2 pair(s): unsupported: planted refusal: this fake "
        "supports no case",
        "UNJUDGED: fake-not-installed judged none of its 2 pair(s): not available here: planted: fake_kernel_pkg is "
        "not importable",
    ]
    assert (
        err.rstrip()
        .splitlines()[-1]
        .startswith(
            "exit 4: no evidence: 2 selected backend(s) judged no case (fake-refuses-everything, fake-not-installed)"
        )
    )
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["exit_status"] == 4 and [(u["backend"], u["pairs"]) for u in summary["unjudged"]] == [
        ("fake-refuses-everything", 2),
        ("fake-not-installed", 2),
    ]
    assert all(u["reason"] for u in summary["unjudged"]) and not summary["allow_unjudged"]
    # the resumed sweep (nothing left to run) is judged as a whole; with --strict fake-exact's unexpected pass
    # (the test ledger claims its bf16 case fails) is 1, which takes precedence over 4
    assert main([*args, "--resume"]) == 4
    assert main([*args, "--resume", "--strict"]) == 1
    assert main([*args, "--resume", "--allow-unjudged", "--json", str(tmp_path / "s.json")]) == 0
    err = capsys.readouterr().err
    assert "(accepted: --allow-unjudged)" in err and "2 backend(s) judged no case (accepted" in err
    assert json.loads((tmp_path / "s.json").read_text())["allow_unjudged"] is True


@pytest.mark.slow
def test_a_resumed_sweep_whose_every_pair_is_unsupported_judged_nothing(tmp_path: Path, ledger: Path) -> None:
    out = tmp_path / "r.jsonl"
    args = ["run", "--suite", "smoke", "--case", IDS[0], "--backend", f"{FAKES}:RefusesEverythingBackend"]
    args += ["--jobs", "1", "--no-progress", "--ledger-dir", str(ledger), "--out", str(out)]
    assert main(args) == 4
    assert main([*args, "--resume"]) == 4  # nothing run this time: the file's records still judge nothing
    assert main([*args, "--resume", "--allow-unjudged"]) == 0


def _unsupported(backend: str) -> CheckResult:
    return dataclasses.replace(_result(backend, Status.UNSUPPORTED), reason="planted refusal")


@pytest.mark.parametrize(
    ("results", "strict", "allow", "code"),
    [
        ([_unsupported("fake-exact")], False, False, 4),
        ([_unsupported("fake-exact")], True, False, 4),
        ([_unsupported("fake-exact")], False, True, 0),
        ([_unsupported("fake-exact"), _result("fake-lse-sign", Status.FAIL)], False, False, 1),  # 1 before 4
        ([_unsupported("fake-exact"), _result("fake-raising", Status.ERROR)], True, False, 1),  # --strict: 1
        ([_unsupported("fake-exact"), _result("fake-raising", Status.ERROR)], False, False, 4),  # known, 1 unjudged
        ([_unsupported("fake-exact"), _result("fake-exact", Status.PASS, "c_fp16_x-000000")], False, False, 0),
        ([], False, False, 4),  # nothing recorded at all
    ],
)
def test_exit_status_of_unjudged_backends(ledger: Path, results: list, strict: bool, allow: bool, code: int) -> None:
    summary = RunSummary(out=Path("r.jsonl"), results=list(results), allow_unjudged=allow)
    summary.finish(load_ledger(ledger), strict=strict)
    assert summary.exit_code == code
    assert summary.listing().splitlines()[-1].startswith(f"exit {code}: ")
    summary.interrupted = True
    assert summary.exit_code == 130 and "UNJUDGED" not in summary.listing()


def test_a_selected_backend_without_a_record_and_one_not_available_are_named_with_why() -> None:
    summary = RunSummary(out=Path("r.jsonl"), results=[_unsupported("fa2")])
    summary.backends = {"fa2": "flash-attn 2.x is not importable", "fake-exact": ""}
    assert summary.unjudged() == [
        ("fa2", "not available here: flash-attn 2.x is not importable", 1),
        ("fake-exact", "no pair of it was recorded", 0),
    ]
    mixed = [_unsupported("b"), dataclasses.replace(_unsupported("b"), reason="other"), _unsupported("b")]
    assert RunSummary(out=Path("r.jsonl"), results=mixed).unjudged() == [
        ("b", "unsupported: planted refusal (2 of 3 pairs)", 3)
    ]


def test_check_resume_compares_values_not_their_spelling(tmp_path: Path) -> None:
    """A header's sweep read back from JSON has lists where this run has tuples and its dicts' keys in the order it
    wrote them: the same sweep either way (mutmut survivor of ``_same``: key order was never varied)."""
    tol = {"bf16": {"factor": 2.0, "atol": 0.0039}, "fp16": {"atol": 0.00049, "factor": 2.0}}
    recorded = {"suite": "smoke", "seed": 0, "device": "cpu", "selection": {"shard": [0, 2]}, "tol": tol}
    reordered = {k: dict(reversed(list(v.items()))) for k, v in reversed(list(tol.items()))}
    now = {**_NOW, "selection": {"shard": (0, 2)}, "tol": reordered}  # a tuple where the file has a list
    check_resume(tmp_path / "old.jsonl", [Header("smoke", {}, {}, sweep=recorded)], now, has_records=True)
    changed = {**recorded, "tol": {**tol, "fp16": {"atol": 0.001, "factor": 2.0}}}
    with pytest.raises(UsageError, match="was run with tol="):
        check_resume(tmp_path / "old.jsonl", [Header("smoke", {}, {}, sweep=changed)], now, has_records=True)
