"""The runner: crash isolation, timeouts, kill + resume, selection, and the worker protocol.

The sweeps here run ``python -m conformance run`` as a real subprocess on tiny cases given with
``--case-json``, so the whole path (CLI, worker process, JSONL file) is exercised.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from conformance.cases.case import AttentionCase
from conformance.records import Status
from conformance.results_file import read_records
from conformance.running.runner import UsageError, parse_shard, repair_tail, select_cases
from conformance.running.worker import WorkerClient
from tests.conformance.fakes import ExactBackend

REPO = Path(__file__).resolve().parents[3]
FAKES = "tests.conformance.fakes"
HERE = "tests.conformance.running.test_runner"


class SlowExactBackend(ExactBackend):
    """Exact, but each kernel call takes 0.15 s: a sweep long enough to be killed in the middle."""

    name = "test-slow-exact"

    def prepare(self, case, inputs):
        run = super().prepare(case, inputs)

        def slow():
            time.sleep(0.15)
            return run()

        return slow


class PrintingBackend(ExactBackend):
    """Exact, but writes to stdout from Python and from fd 1 directly, as chatty kernels do."""

    name = "test-printing"

    def prepare(self, case, inputs):
        print("stray print from a kernel adapter")
        os.write(1, b"stray write to fd 1\n")
        return super().prepare(case, inputs)


def tiny_cases(n: int) -> list[AttentionCase]:
    return [
        AttentionCase(requests=((q, q),), num_heads=2, num_kv_heads=1, head_dim=16, dtype="fp16")
        for q in range(1, n + 1)
    ]


def case_file(tmp_path: Path, cases: list[AttentionCase]) -> str:
    path = tmp_path / "cases.json"
    path.write_text(json.dumps([c.to_json() for c in cases]))
    return "@" + str(path)


def attnconf(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "conformance", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


@pytest.mark.slow
def test_kill_mid_sweep_then_resume_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    cases = tiny_cases(10)
    out = tmp_path / "r.jsonl"
    backends = ["--backend", f"{HERE}:SlowExactBackend", "--backend", f"{FAKES}:ExactBackend"]
    args = ["run", "--case-json", case_file(tmp_path, cases), *backends, "--out", str(out), "--no-progress"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "conformance", *args],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if out.exists() and out.read_text().count('"type": "result"') >= 3:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the sweep finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    _, before = read_records(out)
    assert 3 <= len(before) < 20
    with open(out, "a") as fh:
        fh.write('{"type": "result", "case_id": "cut-short-by-the-ki')  # a write torn by the kill
    done = attnconf(*args, "--resume")
    assert done.returncode == 0, done.stderr
    headers, results = read_records(out)
    pairs = Counter((r.case_id, r.backend) for r in results)
    expected = {(c.id, b) for c in cases for b in ("test-slow-exact", "fake-exact")}
    assert set(pairs) == expected
    assert max(pairs.values()) == 1
    assert [h.env["run"]["resume"] for h in headers] == [False, True]
    assert headers[1].env["run"]["already_recorded"] == len(before)
    assert "cut-short" not in out.read_text()
    assert all(r.status is Status.PASS for r in results)


@pytest.mark.slow
def test_ctrl_c_mid_sweep_exits_130_and_says_how_to_resume(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    args = ["run", "--case-json", case_file(tmp_path, tiny_cases(8)), "--backend", f"{HERE}:SlowExactBackend"]
    args += ["--out", str(out), "--no-progress", "--jobs", "2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "conformance", *args],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (out.exists() and out.read_text().count('"type": "result"') >= 2):
        time.sleep(0.02)
    assert proc.poll() is None, "the sweep finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)  # what a terminal's Ctrl-C sends the parent (the workers have their own session)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted (Ctrl-C)" in err
    assert f"resume with: attnconf {' '.join(args)} --resume" in err
    _, kept = read_records(out)
    assert 2 <= len(kept) < 8 and out.read_text().endswith("\n")
    assert all(r.status is Status.PASS for r in kept)


@pytest.mark.slow
def test_crash_timeout_and_error_are_recorded_and_the_sweep_goes_on(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    out.write_text("an earlier sweep\n")  # a fresh run keeps it as r.1.jsonl
    t0 = time.monotonic()
    res = attnconf(
        "run",
        "--case-json",
        case_file(tmp_path, tiny_cases(1)),
        "--backend",
        f"{FAKES}:CrashingBackend",
        "--backend",
        f"{FAKES}:HangingBackend",
        "--backend",
        f"{FAKES}:RaisingBackend",
        "--backend",
        f"{FAKES}:ExactBackend",
        "--timeout",
        "5",
        "--tol",
        "factor=3",
        "--out",
        str(out),
        "--no-progress",
    )
    assert res.returncode == 1, res.stderr
    _, results = read_records(out)
    assert [(r.backend, r.status) for r in results] == [
        ("fake-crashing", Status.CRASH),
        ("fake-hanging", Status.TIMEOUT),
        ("fake-raising", Status.ERROR),
        ("fake-exact", Status.PASS),
    ]
    crash, hang, error, exact = results
    assert "SIGABRT" in crash.reason and "fakes.py" in crash.reason  # exit signal + faulthandler's stack
    assert crash.family == "fake" and crash.repro.startswith(
        "attnconf run --backend tests.conformance.fakes:CrashingBackend"
    )
    assert "no reply within 5 s" in hang.reason and "fakes.py" in hang.reason  # stack dumped before the kill
    assert "planted failure" in error.reason
    assert exact.extra["tolerance"]["factor"] == 3 and exact.repro.endswith("--tol factor=3")  # override applied
    assert "crash 1" in res.stderr and "worker starts: 3" in res.stderr
    # the end of the run names each unexpected problem with its repro (no ledger entry covers these fakes)
    assert "UNEXPECTED: 3 problem(s)" in res.stderr and "exit 1: 3 unexpected problem(s)" in res.stderr
    for status, backend in [("crash", "fake-crashing"), ("timeout", "fake-hanging"), ("error", "fake-raising")]:
        assert f"{status:<7} {backend}  {results[0].case_id}" in res.stderr
    assert "repro: attnconf run --backend tests.conformance.fakes:HangingBackend" in res.stderr
    assert (tmp_path / "r.1.jsonl").read_text() == "an earlier sweep\n"
    assert time.monotonic() - t0 < 60


def test_stray_output_does_not_break_the_protocol() -> None:
    client = WorkerClient()
    try:
        case = tiny_cases(1)[0]
        reply = client.request(
            {"op": "check", "case": case.to_json(), "backend": f"{HERE}:PrintingBackend"}, timeout=60
        )
        assert reply.kind == "ok" and reply.data["ok"], reply
        assert reply.data["result"]["status"] == "pass"
        # stderr is read by its own thread: the lines may land a moment after the reply on stdout
        deadline = time.monotonic() + 10
        while "stray write to fd 1" not in client.stderr_tail() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "stray print" in client.stderr_tail() and "stray write to fd 1" in client.stderr_tail()
        described = client.request({"op": "describe", "backends": ["nonexistent-kernel"], "device": "cpu"}, timeout=60)
        assert "nonexistent-kernel" in described.data["errors"] and described.data["env"]["torch"]
    finally:
        client.close()
    assert not client.alive


def test_usage_errors_exit_2_before_touching_the_output(tmp_path: Path) -> None:
    out = tmp_path / "keep.jsonl"
    out.write_text("precious\n")
    res = attnconf(
        "run",
        "--case-json",
        case_file(tmp_path, tiny_cases(1)),
        "--backend",
        "no-such-backend",
        "--out",
        str(out),
    )
    assert res.returncode == 2 and "no-such-backend" in res.stderr
    assert out.read_text() == "precious\n"


def test_shards_partition_the_suite() -> None:
    everything = [c.id for c in select_cases("smoke")]
    shards = [[c.id for c in select_cases("smoke", shard=(i, 3))] for i in range(3)]
    joined = [case_id for shard in shards for case_id in shard]
    assert sorted(joined) == sorted(everything)
    assert len(set(joined)) == len(everything)
    assert shards[1] == [c.id for c in select_cases("smoke", shard=(1, 3))]  # deterministic


def test_selection_filters_json_cases_and_limit() -> None:
    smoke = select_cases("smoke")
    wanted = smoke[3].id
    assert [c.id for c in select_cases("smoke", (wanted,))] == [wanted]
    globbed = select_cases("smoke", ("*_causal*",))
    assert globbed and all("_causal" in c.id for c in globbed)
    extra = tiny_cases(1)[0]
    mixed = select_cases("smoke", (wanted,), json.dumps(extra.to_json()))
    assert [c.id for c in mixed] == [wanted, extra.id]
    assert len(select_cases("smoke", limit=4)) == 4
    for bad in [
        {"suite": "nope"},
        {"suite": None, "patterns": ("x*",)},
        {"suite": None},
        {"suite": "smoke", "patterns": ("no-match",)},
    ]:
        with pytest.raises(UsageError):
            select_cases(**bad)
    with pytest.raises(UsageError):
        select_cases(None, case_json='{"num_heads": 2}')


@pytest.mark.parametrize("text", ["1/0", "3/3", "-1/2", "a/b", "2"])
def test_bad_shards_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError):
        parse_shard(text)
    assert parse_shard("2/3") == (2, 3)


def test_repair_tail(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n{"b": ')
    repair_tail(path)
    assert path.read_text() == '{"a": 1}\n'
    path.write_text('{"a": 1}\n{"b": 2}')  # complete, only the newline is missing: keep it
    repair_tail(path)
    assert path.read_text() == '{"a": 1}\n{"b": 2}\n'
    repair_tail(path)
    assert path.read_text() == '{"a": 1}\n{"b": 2}\n'
