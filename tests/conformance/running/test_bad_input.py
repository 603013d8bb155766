"""Bad input is refused up front with one line naming the option or field and the constraint, exit 2; Ctrl-C at any
moment exits 130 (with the resume command for ``run``); a closed stdout ends quietly (141).  In-process: the
selection and case-model functions, and ``conformance.cli.main`` (issue 29 item 4).

The subprocess side (real signals, real pipes) is tests/conformance/test_cli_torture.py.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.cases.case import AttentionCase
from conformance.cli import main
from conformance.exits import UsageError
from conformance.records import CheckResult, Header, Status
from conformance.results_writer import append_record
from conformance.running import selection, usage
from conformance.running.selection import _json_cases, select_cases
from conformance.running.worker import WorkerClient
from tests.conformance.fakes import ExactBackend

CASE = {"requests": [[1, 1]], "num_heads": 2, "num_kv_heads": 1, "head_dim": 16}
TINY = AttentionCase.from_json(CASE)
HERE = "tests.conformance.running.test_bad_input"


class CudaOnlyBackend(ExactBackend):
    """Exact, declared for CUDA only (as fa2 is): named with ``--device cpu`` it is a command line to fix."""

    name = "test-cuda-only"
    devices = ("cuda",)


def one_line(err: str) -> str:
    """The single stderr line of a refusal (and no traceback)."""
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err


# ------------------------------------------------------------------------------------------- --case-json


def json_refusal(text: str) -> str:
    with pytest.raises(UsageError) as info:
        _json_cases(text)
    message = str(info.value)
    assert "\n" not in message and message.startswith("--case-json"), message
    return message


def test_case_json_numbers_the_case_and_names_the_field() -> None:
    cases = [CASE, CASE, CASE, {**CASE, "softcap": math.nan}]
    assert (
        json_refusal(json.dumps(cases))
        == "--case-json: case 3: softcap must be a finite number > 0 (or unset), got NaN"
    )
    assert "case 1: scale must be a finite number (or unset), got Infinity" in json_refusal(
        json.dumps([CASE, {**CASE, "scale": math.inf}])
    )
    big = json_refusal(json.dumps({**CASE, "requests": [[2**64, 1]]}))
    assert big == "--case-json: requests[0] q_len must fit in a 64-bit integer (|x| < 2**63), got 18446744073709551616"


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe", "not UTF-8 text (byte 0x89 at offset 0)"),
        ('{"requests": [[1, 1]], "batch_name": "caf\xe9"}'.encode("latin-1"), "not UTF-8 text (byte 0xe9 at offset"),
        (b"\x00\x00\x00\x00", "is not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply to be a case"),
        (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "nested too deeply to be a case"),
        (b"[" + b"[" * 500 + b"]" * 500 + b"]", "case 0: a case must be a JSON object, got a list"),
        (b"1" * 5000, "is not JSON: Exceeds the limit"),
        (b"", "is not JSON"),
        (b"[]", "an empty list holds no case"),
        (b"[1, 2]", "case 0: a case must be a JSON object, got a number"),
        (b'"text"', "a case must be a JSON object, got a string"),
        (b"null", "a case must be a JSON object, got null"),
        (b"\xef\xbb\xbf" + json.dumps(CASE).encode(), "is not JSON"),  # a BOM: not JSON text by RFC 8259
        (json.dumps({**CASE, "softcap": -math.inf}).encode(), "softcap must be a finite number > 0 (or unset)"),
        (json.dumps({**CASE, "num_heads": 2.5}).encode(), "num_heads must be an integer, got 2.5"),
        (json.dumps({**CASE, "nope": 1}).encode(), "unknown field 'nope'"),
        (json.dumps({**CASE, "batch_name": "\u2028"}).encode(), "batch_name must be printable text"),
    ],
)
def test_case_json_files_are_read_safely(tmp_path: Path, content: bytes, says: str) -> None:
    path = tmp_path / "cases.json"
    path.write_bytes(content)
    message = json_refusal(f"@{path}")
    assert says in message and message.startswith(f"--case-json @{path}"), message
    assert len(message) < 800


def test_case_json_that_is_not_a_readable_file(tmp_path: Path, monkeypatch) -> None:
    assert "cannot read: No such file" in json_refusal(f"@{tmp_path / 'absent.json'}")
    assert "cannot read: Is a directory" in json_refusal(f"@{tmp_path}")
    monkeypatch.setattr(selection, "CASE_JSON_MAX_BYTES", 10)
    (tmp_path / "big.json").write_text(json.dumps(CASE))
    assert "larger than" in json_refusal(f"@{tmp_path / 'big.json'}")


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
        max_leaves=10,
    )
    | st.lists(st.fixed_dictionaries({}, optional={**{k: st.just(v) for k, v in CASE.items()}, "softcap": st.floats()}))
)
def test_any_json_text_selects_cases_or_is_refused_in_one_line(value) -> None:
    """``--case-json`` given any JSON text (NaN and infinities included): cases, or one :class:`UsageError` line;
    never another exception."""
    text = json.dumps(value)
    try:
        cases = select_cases(None, case_json=text)
    except UsageError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(("--case-json", "no case selected")), str(exc)
        return
    assert cases and all(isinstance(c, AttentionCase) for c in cases)
    json.dumps([c.to_json() for c in cases], allow_nan=False)  # each can be recorded: no NaN, no Infinity


@settings(max_examples=150)
@given(st.binary(max_size=64))
def test_any_bytes_in_a_case_file_select_cases_or_are_refused_in_one_line(tmp_path_factory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("bytes") / "cases.json"
    path.write_bytes(data)
    try:
        _json_cases(f"@{path}")
    except UsageError as exc:
        assert "\n" not in str(exc)


def test_run_with_an_out_of_range_case_exits_2_before_anything_runs(tmp_path: Path, capsys) -> None:
    out = tmp_path / "r.jsonl"
    cases = json.dumps([CASE, {**CASE, "softcap": math.nan}])
    assert main(["run", "--backend", "sdpa-cpu", "--case-json", cases, "--out", str(out), "--no-progress"]) == 2
    err = one_line(capsys.readouterr().err)
    assert err == "attnconf run: --case-json: case 1: softcap must be a finite number > 0 (or unset), got NaN\n"
    assert not out.exists()


# ------------------------------------------------------------------------------------------- --device


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "cuda:-1", "CUDA", "cuda:", "cpu:0", " cuda", "cuda:1:2", "mps"])
@pytest.mark.parametrize("command", ["run", "fuzz"])
def test_a_device_that_is_not_spelled_as_one_exits_2(command: str, device: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "r.jsonl"
    argv = [command, "--device", device, "--backend", "sdpa-cpu", "--out", str(out)]
    assert main([*argv, *(["--suite", "smoke"] if command == "run" else [])]) == 2
    err = one_line(capsys.readouterr().err)
    assert "argument --device: must be auto, cpu, cuda or cuda:N (N >= 0), got" in err and not out.exists()


@pytest.mark.parametrize(
    ("device", "visible", "says"),
    [
        ("cuda", 0, "--device cuda: no CUDA device is visible here"),
        ("cuda:0", 0, "--device cuda:0: no CUDA device is visible here"),
        ("cuda:99", 0, "--device cuda:99: no CUDA device is visible here"),
        ("cuda:2", 2, "--device cuda:2: 2 CUDA device(s) visible here, cuda:0 to cuda:1"),
        ("cuda:99", 1, "--device cuda:99: 1 CUDA device(s) visible here, cuda:0 to cuda:0"),
    ],
)
@pytest.mark.parametrize("command", ["run", "fuzz"])
def test_a_device_this_machine_lacks_exits_2(
    command, device, visible, says, tmp_path: Path, capsys, monkeypatch
) -> None:
    monkeypatch.setattr(usage, "_cuda_devices", lambda: visible)
    out = tmp_path / "r.jsonl"
    argv = [command, "--device", device, "--backend", "sdpa-cpu", "--out", str(out)]
    assert main([*argv, *(["--suite", "smoke"] if command == "run" else [])]) == 2
    assert says in one_line(capsys.readouterr().err) and not out.exists()


def test_a_device_this_machine_has_passes(monkeypatch) -> None:
    monkeypatch.setattr(usage, "_cuda_devices", lambda: 2)
    usage.check_device("cuda:1")
    usage.check_device("cuda")
    assert usage.device_and_backends("run", "cuda:0", ["x"]) == ("cuda:0", ["x"])
    assert usage.device_and_backends("run", "auto", ["x"]) == ("cuda", ["x"])
    monkeypatch.setattr(usage, "_cuda_devices", lambda: 0)
    assert usage.device_and_backends("run", "auto", ["x"]) == ("cpu", ["x"])
    with pytest.raises(UsageError, match="--device must be auto, cpu, cuda or cuda:N"):
        usage.device_and_backends("run", "tpu", ["x"])


@pytest.mark.parametrize(
    ("command", "backends", "says"),
    [
        ("run", ["fa2"], "--backend fa2 runs on cuda only, not on --device cpu"),
        ("run", ["sdpa-cpu", "sdpa-cuda"], "--backend sdpa-cuda runs on cuda only, not on --device cpu"),
        (
            "fuzz",
            [f"{HERE}:CudaOnlyBackend"],
            f"--backend {HERE}:CudaOnlyBackend runs on cuda only, not on --device cpu",
        ),
    ],
)
def test_a_backend_that_does_not_run_on_the_device_exits_2(command, backends, says, tmp_path: Path, capsys) -> None:
    out = tmp_path / "r.jsonl"
    argv = [command, "--device", "cpu", "--out", str(out), "--no-progress"]
    argv += [a for b in backends for a in ("--backend", b)] + (
        ["--case-json", json.dumps(CASE)] if command == "run" else []
    )
    assert main(argv) == 2
    assert says in one_line(capsys.readouterr().err) and not out.exists()


# ------------------------------------------------------------------------------------------- --backend names


def test_backends_with_an_unknown_name_exits_2_listing_the_names(capsys) -> None:
    assert main(["backends", "--backend", "sdpa-cpu", "--backend", "nosuch"]) == 2
    err = one_line(capsys.readouterr().err)
    assert "unknown backend 'nosuch'; --backend must be one of ['sdpa-cpu'" in err and "module:Class" in err


# ------------------------------------------------------------------------------------------- --ledger-dir


def results_file(path: Path) -> Path:
    append_record(path, Header(suite="custom", backends={"kern": {"version": "1.0"}}, env={}))
    append_record(path, CheckResult(TINY.id, "kern", "fam", Status.FAIL, TINY.to_json(), version="1.0", reason="x"))
    return path


BAD_LEDGERS = {
    "absent": (None, "no such directory"),
    "a-file": (b"not a directory", "not a directory"),
    "broken-toml": ({"k.toml": b"[[failure]\nreason = 1"}, "k.toml: "),
    "not-utf8": ({"k.toml": b'[[failure]]\nreason = "caf\xe9"\n'}, "k.toml: not UTF-8 text"),
    "dir-named-toml": ({"k.toml/": b""}, "k.toml: cannot read: Is a directory"),
    "not-tables": ({"k.toml": b"failure = [1, 2]\n"}, "'failure' must be an array of tables"),
    "bad-evidence": (
        {"k.toml": b'[[failure]]\nreason = "r"\nevidence = 3\n[failure.when]\nhead_dim = 16\n'},
        "k.toml failure[0]: malformed entry",
    ),
    "unknown-key": ({"k.toml": b"oops = 1\n"}, "top-level keys must be [[failure]] entries"),
}


def make_ledger_dir(tmp_path: Path, spec) -> Path:
    path = tmp_path / "ledgers"
    if isinstance(spec, bytes):
        path.write_bytes(spec)
    elif isinstance(spec, dict):
        path.mkdir()
        for name, content in spec.items():
            if name.endswith("/"):
                (path / name).mkdir()
            else:
                (path / name).write_bytes(content)
    return path


@pytest.mark.parametrize("bad", sorted(BAD_LEDGERS))
@pytest.mark.parametrize("command", ["report", "ledger audit", "run"])
def test_a_malformed_ledger_dir_exits_2_in_one_line(command: str, bad: str, tmp_path: Path, capsys) -> None:
    spec, says = BAD_LEDGERS[bad]
    ledger = make_ledger_dir(tmp_path, spec)
    results = results_file(tmp_path / "r.jsonl")
    out = tmp_path / "report"
    if command == "report":
        argv = [
            "report",
            str(results),
            "--ledger-dir",
            str(ledger),
            "--out",
            str(out),
            "--json",
            str(tmp_path / "s.json"),
        ]
    elif command == "run":
        argv = ["run", "--case-json", json.dumps(CASE), "--backend", "sdpa-cpu", "--ledger-dir", str(ledger)]
        argv += ["--out", str(out)]
    else:
        argv = ["ledger", "audit", str(results), "--ledger-dir", str(ledger), "--no-suites"]
    assert main(argv) == 2
    err = one_line(capsys.readouterr().err)
    assert f"--ledger-dir {ledger}: " in err and says in err, err
    assert not out.exists()
    if command == "report":
        refusal = json.loads((tmp_path / "s.json").read_text())["refusal"]
        assert refusal["file"] == str(ledger) and says in refusal["reason"]


ANY = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
KEYS = [
    "reason",
    "when",
    "pattern",
    "glob_reason",
    "evidence",
    "statuses",
    "messages",
    "versions",
    "flaky",
    "partial",
    "x",
]


@settings(max_examples=300)
@given(
    st.dictionaries(st.sampled_from(KEYS), ANY | st.sampled_from([">=1.0", "fail", ["fail"], "*d80*"]), max_size=4),
    st.dictionaries(st.sampled_from(["head_dim", "features", "no_features", "paged", "dtype", "nope"]), ANY),
)
def test_any_ledger_entry_loads_or_is_refused_with_a_value_error(tmp_path_factory, changes, when) -> None:
    """Whatever a ``[[failure]]`` table holds (a valid entry with any keys set to any TOML-like value),
    :func:`load_ledger` loads it or raises one ``ValueError`` line, which the commands print with exit 2: never
    another exception."""
    from conformance.ledger import entries as ledger_mod

    entry = {"reason": "r", "when": when or {"head_dim": 16}, **changes}
    directory = tmp_path_factory.mktemp("ledger")
    (directory / "kern.toml").write_text("")
    real = ledger_mod.load_toml_file
    try:
        ledger_mod.load_toml_file = lambda path: {"failure": [entry]}
        try:
            ledger_mod.load_ledger(directory)
        except ValueError as exc:
            assert "\n" not in str(exc) and "kern.toml" in str(exc), str(exc)
    finally:
        ledger_mod.load_toml_file = real


# ------------------------------------------------------------------------------------------- Ctrl-C, pipes


@pytest.mark.parametrize(
    "where",
    [
        "conformance.running.runner.select_run",  # while the cases are selected
        "conformance.running.runner.describe_backends",  # while the worker describes the backends
        "conformance.running.runner._progress",  # right after the header is written
        "conformance.running.outcome.RunSummary.text",  # while the summary is printed
        "conformance.running.outcome.RunSummary.listing",  # while the problems are listed
    ],
)
def test_ctrl_c_at_any_moment_of_run_exits_130_with_the_resume_command(
    where: str, tmp_path, capsys, monkeypatch
) -> None:
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(where, interrupted)
    args = ["run", "--case-json", json.dumps(CASE), "--backend", "sdpa-cpu", "--no-progress"]
    args += ["--jobs", "1", "--out", str(tmp_path / "r.jsonl")]
    assert main(args) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and "interrupted (Ctrl-C)" in err
    assert f"resume with: {shlex.join(['attnconf', *args, '--resume'])}" in err


def test_ctrl_c_during_a_fuzz_campaign_exits_130_with_the_resume_command(tmp_path, capsys, monkeypatch) -> None:
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("conformance.fuzz.campaign._stream_loop", interrupted)
    args = ["fuzz", "--backend", "sdpa-cpu", "--device", "cpu", "--budget", "3", "--no-progress"]
    args += ["--out", str(tmp_path / "f.jsonl")]
    assert main(args) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1
    resume = shlex.join(["attnconf", *args, "--resume"])
    assert f"attnconf fuzz: interrupted (Ctrl-C); records already written are kept: resume with: {resume}" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["cases", "--suite", "smoke"],
        ["backends"],
        ["backends", "--json"],
        ["ledger", "fields"],
        ["cases", "--suite", "smoke", "--json"],
    ],
)
def test_a_closed_stdout_ends_quietly_with_141(argv: list[str], monkeypatch, capsys) -> None:
    """A reader gone before the first write (rich's table included: it used to exit 1) or before the last
    buffered lines were flushed (the flush happened at interpreter exit, after main returned 0)."""

    class Closed:
        """A pipe whose reader went away: writes are buffered, the flush fails."""

        def __init__(self) -> None:
            self.buffered = 0

        def write(self, text: str) -> int:
            self.buffered += len(text)
            if self.buffered > 1 << 16:
                raise BrokenPipeError(32, "Broken pipe")
            return len(text)

        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

        def isatty(self) -> bool:
            return False

        def fileno(self) -> int:
            raise OSError("not a real file")

    monkeypatch.setattr(sys, "stdout", Closed())
    assert main(argv) == 141
    assert capsys.readouterr().err == ""


def test_a_worker_ignores_sigint(tmp_path: Path) -> None:
    """A SIGINT sent to a worker (it has a session of its own: a terminal's Ctrl-C reaches the parent only) does
    not kill it: the parent alone stops its workers, so the pair in flight never becomes a ``crash`` record."""
    client = WorkerClient()
    try:
        client.start()
        assert client.proc is not None
        pid = client.proc.pid
        os.kill(pid, signal.SIGINT)
        time.sleep(0.5)
        assert client.alive, client.stderr_tail()
        reply = client.request({"op": "describe", "backends": ["sdpa-cpu"], "device": "cpu"}, timeout=120)
        assert reply.kind == "ok" and reply.data["ok"], reply.reason
        assert client.proc.pid == pid and client.starts == 1  # the same worker answered
        assert "KeyboardInterrupt" not in client.stderr_tail()
    finally:
        client.close()
