"""The attnconf command line: subcommands, exit statuses, ``python -m conformance``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.cli import main
from conformance.suites.registry import get_suite

REPO = Path(__file__).resolve().parents[2]


def test_cases_lists_ids_summaries_and_feature_counts(capsys: pytest.CaptureFixture, monkeypatch) -> None:
    # one line per case: its id and its requests' lengths (every field with --long; issue 28 item 4 moved the
    # summary there: it made lines of up to 530 characters); wide enough that no line is cut (the cut itself:
    # test_cli_habits.py), whatever COLUMNS the caller's shell exports
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["cases", "--suite", "smoke", "--case", "*_causal*"]) == 0
    out = capsys.readouterr().out
    wanted = [c for c in get_suite("smoke") if "_causal" in c.id]
    lines = out.splitlines()
    for c in wanted:
        (line,) = [ln for ln in lines if ln.startswith(c.id + " ")]
        assert f"{len(c.requests)} req  q/kv {c.requests[0][0]}/{c.requests[0][1]}" in line and c.summary() not in out
    assert f"{len(wanted)} cases; per feature:" in out and f"causal {len(wanted)}" in out
    assert main(["cases", "--suite", "smoke", "--case", "*_causal*", "--long"]) == 0
    out = capsys.readouterr().out
    assert all(c.id in out and c.summary() in out for c in wanted)


def test_cases_json(capsys: pytest.CaptureFixture) -> None:
    assert main(["cases", "--suite", "smoke", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [c["id"] for c in listed] == [c.id for c in get_suite("smoke")]
    assert set(listed[0]) == {"id", "summary", "features", "case"}


def test_cases_count_prints_the_number_alone(capsys: pytest.CaptureFixture) -> None:
    """``--count``: the one figure docs cite (issue 27: counts come from the command, not prose), with the
    selection options applied, and refused beside the listing options."""
    assert main(["cases", "--suite", "smoke", "--count"]) == 0
    assert capsys.readouterr().out == f"{len(get_suite('smoke'))}\n"
    assert main(["cases", "--suite", "smoke", "--case", "*_causal*", "--count"]) == 0
    assert capsys.readouterr().out == f"{sum('_causal' in c.id for c in get_suite('smoke'))}\n"
    for other in ("--json", "--long", "--coverage"):
        assert main(["cases", "--suite", "smoke", "--count", other]) == 2
        assert "--count prints the number of cases alone" in capsys.readouterr().err


def test_backends_json_has_capabilities_and_reasons(capsys: pytest.CaptureFixture) -> None:
    assert main(["backends", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["sdpa-cpu"]["available"] == "yes" and info["sdpa-cpu"]["version"]
    assert "softcap" in info["sdpa-cpu"]["refused"]  # SDPA has no score modifier
    import torch

    if not torch.cuda.is_available():
        assert info["fa2"]["available"] == "no" and info["fa2"]["unavailable_reason"]


def test_backends_table_accepts_import_paths(capsys: pytest.CaptureFixture) -> None:
    fake, broken = "tests.conformance.fakes:RefusesSinksBackend", "tests.conformance.fakes:NoSuchBackend"
    assert main(["backends", "--backend", fake, "--backend", broken]) == 0
    out = capsys.readouterr().out
    assert "fake-refuses-sinks" in out and f"{broken}: not available: cannot load" in out


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


def test_version(capsys: pytest.CaptureFixture) -> None:
    from importlib.metadata import version

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"attnconf {version('attnconf')}"


CASE = {"requests": [[1, 1]], "num_heads": 2, "num_kv_heads": 1, "head_dim": 16}


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--timeout", "0"], "argument --timeout: must be a finite number of seconds in (0, 604800], got '0'"),
        (["--timeout", "1e12"], "argument --timeout: must be a finite number of seconds in (0, 604800]"),
        (["--timeout", "-5"], "--timeout: must be"),
        (["--timeout", "nan"], "--timeout: must be"),
        (["--timeout", "soon"], "--timeout: must be a finite number of seconds"),
        (["--limit", "0"], "argument --limit: must be an integer >= 1, got '0'"),
        (["--limit", "-2"], "--limit: must be an integer >= 1"),
        (["--seed", "-1"], "argument --seed: must be an integer in [0, 4294967296), got '-1'"),
        (["--seed", str(2**32)], "--seed: must be an integer in"),
        (["--jobs", "0"], "--jobs"),
        (["--shard", "2/2"], "argument --shard: i/n needs 0 <= i < n, got '2/2'"),
        (["--case-json", "@/no/such/cases.json"], "--case-json @/no/such/cases.json: cannot read: No such file"),
        (["--case-json", "{not json"], "--case-json is not JSON"),
        (["--case-json", json.dumps({**CASE, "num_heads": None})], ": num_heads must be an integer, got null"),
        (["--case-json", json.dumps({"requests": [[1, 1]]})], "missing field 'num_heads', 'num_kv_heads', 'head_dim'"),
        (["--case-json", json.dumps({**CASE, "num_head": 2})], "unknown field 'num_head'"),
        (["--case-json", json.dumps([CASE, {**CASE, "head_dim": -1}])], "--case-json: case 1: head dims must be"),
        (["--case-json", json.dumps({**CASE, "requests": [[1]]})], "requests must be a list of [q_len, kv_len]"),
        (["--suite", "smoke", "--feature", "paged,pagd"], "unknown feature 'pagd'; features are prefill, decode"),
        (["--case-json", json.dumps(CASE), "--exclude", "x*"], "filter a suite: give --suite too"),
        (["--suite", "smoke", "--case", "*paged*"], "no case selected"),
        (["--suite", "smoke", "--ledger-dir", "/no/such/ledgers"], "--ledger-dir /no/such/ledgers: no such directory"),
        (["--suite", "smoke", "--out", "FILE/r.jsonl"], "cannot create its directory"),
        (["--suite", "smoke", "--out", "DIR"], "is a directory"),
        (["--suite", "smoke", "--json", "FILE/s.json"], "--json FILE/s.json: cannot create its directory"),
    ],
)
def test_run_usage_errors_are_one_line(extra: list[str], says: str, tmp_path: Path, capsys) -> None:
    (tmp_path / "FILE").write_text("a file, not a directory\n")
    (tmp_path / "DIR").mkdir()
    extra = [str(tmp_path / e) if e.startswith(("FILE", "DIR")) else e for e in extra]
    says = says.replace("FILE", str(tmp_path / "FILE"))
    if "--out" not in extra:
        extra += ["--out", str(tmp_path / "r.jsonl")]
    if "--suite" not in extra and "--case-json" not in extra:
        extra += ["--suite", "smoke"]
    if "--ledger-dir" not in extra:  # an empty ledger: these errors do not depend on the packaged one
        (tmp_path / "ledgers").mkdir()
        extra += ["--ledger-dir", str(tmp_path / "ledgers")]
    assert main(["run", "--backend", "sdpa-cpu", "--no-progress", *extra]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "r.jsonl").exists()


def test_run_read_only_out_is_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    out = tmp_path / "r.jsonl"
    out.write_text("precious\n")
    out.chmod(0o444)
    if os.geteuid() == 0:  # root may write it anyway: let access() answer as it does for everyone else
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == out else real(p, mode))
    # an output that cannot be written is exit 3 (conformance.exits.OutputError), not a usage error
    assert main(["run", "--suite", "smoke", "--backend", "sdpa-cpu", "--out", str(out)]) == 3
    err = capsys.readouterr().err
    assert f"--out {out}: is read-only" in err and "Traceback" not in err and out.read_text() == "precious\n"


def test_cases_by_feature_and_exclusion(capsys: pytest.CaptureFixture) -> None:
    smoke = get_suite("smoke")
    assert main(["cases", "--suite", "smoke", "--case", "*paged*", "--json"]) == 2  # ids do not say "paged"
    assert "select modes with --feature" in capsys.readouterr().err
    assert main(["cases", "--suite", "smoke", "--feature", "paged,hnd", "--feature", "qv", "--json"]) == 0
    listed = [c["id"] for c in json.loads(capsys.readouterr().out)]
    wanted = [c.id for c in smoke if {"paged", "hnd"} <= c.features() or "qv" in c.features()]
    assert listed == wanted and 0 < len(wanted) < len(smoke)
    argv = ["cases", "--suite", "smoke", "--feature", "paged", "--exclude-feature", "gqa", "--exclude", "*_fp8*"]
    assert main([*argv, "--json"]) == 0
    listed = [c["id"] for c in json.loads(capsys.readouterr().out)]
    wanted = [c.id for c in smoke if "paged" in c.features() and "gqa" not in c.features() and "_fp8" not in c.id]
    assert listed == wanted and wanted
    assert main(["cases", "--suite", "smoke", "--feature", "bogus"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown feature 'bogus'" in err and "paged" in err


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
    from conformance.results_file import read_records

    from attnfast.registry import runnable_names

    out = tmp_path / "auto.jsonl"
    assert main(["run", "--suite", "smoke", "--limit", "1", "--out", str(out), "--no-progress"]) == 0
    headers, results = read_records(out)
    if not torch.cuda.is_available():
        # the built-in CPU backends plus whatever entry-point backends this environment has installed
        # (e.g. examples/attnfast_example_backend, which .ci/run installs)
        expected = set(runnable_names("cpu"))
        assert {"sdpa-cpu", "flex-cpu"} <= expected
        assert {r.backend for r in results} == expected and headers[0].env["device"] == "cpu"
