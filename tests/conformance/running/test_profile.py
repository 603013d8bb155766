"""Where a sweep's time went: each record's time split (``extra["t"]``), the profile table, its rebuild from a file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.cases.case import AttentionCase
from conformance.cli import main
from conformance.records import CheckResult, Status
from conformance.results_file import read_records
from conformance.results_writer import Appender
from conformance.running.profile import COLUMNS, file_profiles, profile_records, record_times, render_profiles
from conformance.running.runner import RunConfig, run
from conformance.verdict.check import check_backend, prepare_context
from tests.conformance.fakes import JIT_CACHE_ENV, JIT_COMPILE_ENV, ExactBackend

FAKES = "tests.conformance.fakes"
WORKER_KEYS = {"in", "ref", "base", "prep", "comp", "kern", "ver", "bench", "enc"}


def tiny(n: int, head_dim: int = 16) -> list[AttentionCase]:
    return [
        AttentionCase(requests=((q, q + 2),), num_heads=2, num_kv_heads=1, head_dim=head_dim, dtype="fp16")
        for q in range(1, n + 1)
    ]


def config(tmp_path: Path, cases: list[AttentionCase], backends: tuple[str, ...], **kw) -> RunConfig:
    path = tmp_path / "cases.json"
    path.write_text(json.dumps([c.to_json() for c in cases]))
    return RunConfig(
        backends=backends,
        case_json="@" + str(path),
        out=kw.pop("out", tmp_path / "r.jsonl"),
        progress=False,
        jobs=kw.pop("jobs", 1),
        **kw,
    )


def test_every_record_carries_its_time_split_and_the_file_gives_the_same_table(tmp_path: Path) -> None:
    cases = tiny(4)
    summary = run(config(tmp_path, cases, (f"{FAKES}:ExactBackend", f"{FAKES}:StoredExactBackend")))
    headers, records = read_records(tmp_path / "r.jsonl")
    assert summary.exit_code == 0 and len(records) == 8
    ats = []
    for r in records:
        t = r.extra["t"]
        first = r.backend == "fake-exact"  # cases outer, backends inner: the first backend builds the context
        assert ({"in", "ref", "base"} <= set(t)) == first, t
        assert {"kern", "ver", "enc", "prep", "par", "at"} <= set(t) and "comp" not in t  # no JIT here
        phases = sum(v for k, v in t.items() if k in WORKER_KEYS)
        assert 0 < phases <= r.extra["worker_s"] + 1e-4  # (the round trip can be shorter under load: arrival stamps)
        assert abs(t["kern"] - r.kernel_s) < 1e-4
        ats.append(t["at"])
    assert ats == sorted(ats) and 0 < ats[-1] <= summary.wall_s  # one worker: written in order
    assert headers[0].env["run"]["checks_at_s"] <= ats[0]
    live = summary.profile
    rebuilt = file_profiles(tmp_path / "r.jsonl")
    assert len(rebuilt) == 1
    for backend, row in live.backends.items():  # the file holds the same numbers the run added up
        for column in ("pairs", *COLUMNS):
            assert rebuilt[0].backends[backend][column] == pytest.approx(row[column], abs=1e-3), column
    assert rebuilt[0].workers == live.workers == 1 and rebuilt[0].checks_at_s == headers[0].env["run"]["checks_at_s"]
    data = summary.to_json()["profile"]
    assert set(data["backends"]) == {"fake-exact", "fake-stored-exact"} and data["total"]["pairs"] == 8
    assert data["workers"] == 1 and data["capacity_s"] == pytest.approx(summary.wall_s, abs=1e-3)
    assert 0 <= data["idle_capacity_s"] < data["capacity_s"]
    assert data["worker_starts_s"] and data["parent_main_s"] > 0 and data["batches"] >= 1
    assert [s["case_id"] for s in data["slowest"]] and len(data["slowest"]) == 4


def test_the_first_call_of_a_compile_key_in_a_worker_is_compile_the_rest_kernel(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(JIT_CACHE_ENV, str(tmp_path))
    monkeypatch.setenv(JIT_COMPILE_ENV, "0.4")
    cases = tiny(3) + tiny(2, head_dim=64)
    run(config(tmp_path, cases, (f"{FAKES}:JitBackend",)))
    _, records = read_records(tmp_path / "r.jsonl")
    records.sort(key=lambda r: r.extra["t"]["at"])
    first_of_dim = {r.case["head_dim"]: r.case_id for r in reversed(records)}
    compiled = {r.case_id for r in records if "comp" in r.extra["t"]}
    assert compiled == set(first_of_dim.values()) and len(compiled) == 2  # one per head dim, its first call
    for r in records:
        t = r.extra["t"]
        if r.case_id in compiled:
            assert t["comp"] >= 0.4 and "kern" not in t
        else:
            assert t["kern"] < 0.2 and "comp" not in t


@pytest.mark.slow
def test_a_crash_is_lost_time_and_a_harness_error_is_worker_time(tmp_path: Path) -> None:
    summary = run(config(tmp_path, tiny(2), (f"{FAKES}:CrashingBackend", f"{FAKES}:ExactBackend")))
    _, records = read_records(tmp_path / "r.jsonl")
    crashes = [r for r in records if r.status is Status.CRASH]
    assert len(crashes) == 2 and all(r.extra["roundtrip_s"] > 0 and "at" in r.extra["t"] for r in crashes)
    row = summary.profile.backends["fake-crashing"]
    assert row["lost"] > 0 and row["busy"] == 0 and row["pairs"] == 2
    assert summary.profile.backends["fake-exact"]["busy"] > 0


def _rec(case: str, backend: str, t: dict | None, worker_s: float, status: Status = Status.PASS) -> CheckResult:
    extra = {"worker_s": worker_s, "roundtrip_s": worker_s + 0.01}
    if t is not None:
        extra["t"] = t
    return CheckResult(case_id=case, backend=backend, family="f", status=status, case={}, extra=extra)


def test_the_table_adds_up_and_names_the_tail_and_the_slowest_cases() -> None:
    records = [
        _rec(f"c{i}", "a", {"in": 0.1, "ref": 0.2, "kern": 0.5, "ver": 0.1, "par": 0.001, "at": float(i)}, 1.0)
        for i in range(1, 11)
    ]
    records.append(_rec("c10", "b", {"kern": 3.0, "at": 30.0}, 3.5))
    records.append(_rec("old", "b", None, 9.0))  # an older record: no split
    prof = profile_records(records, workers=2, checks_at_s=0.5)
    a, b = prof.backends["a"], prof.backends["b"]
    assert a["pairs"] == 10 and a["reference"] == pytest.approx(2.0) and a["busy"] == pytest.approx(10.0)
    assert a["other"] == pytest.approx(10 * (1.0 - 0.9)) and a["ipc"] == pytest.approx(0.1)
    assert b["pairs"] == 2 and b["busy"] == pytest.approx(3.5) and b["other"] == pytest.approx(0.5)
    assert prof.unsplit == 1 and prof.wall_s == 30.0
    assert prof.done_at_s == {"50%": 6.0, "90%": 10.0, "99%": 30.0, "100%": 30.0}
    assert prof.slowest[0][0] == "c10" and prof.slowest[0][1] == pytest.approx(4.5)
    assert prof.capacity() == (60.0, pytest.approx(60.0 - 13.5))
    text = render_profiles([prof])
    assert text.splitlines()[1].split()[:4] == ["backend", "pairs", "inputs", "reference"]
    assert "the last 10% took 20.0 s" in text and "1 record(s) carry no time split" in text
    assert "c10  (b 3.5, a 1.0)" in text


def test_record_times_keeps_only_what_was_spent() -> None:
    t = record_times({"phases": {"context_s": 9.0, "kernel_s": 0.25, "compile_s": 0.0, "verdict_s": 1e-7}}, 0.002)
    assert t == {"kern": 0.25, "par": 0.002}  # context_s is the sum of in/ref/base, not a key of its own


def test_check_phases_leave_the_record_unchanged() -> None:
    case = tiny(1)[0]
    ctx = prepare_context(case)
    assert set(ctx.phases) == {"inputs_s", "reference_s", "baseline_s"}
    assert sum(ctx.phases.values()) == pytest.approx(ctx.ref_s, abs=1e-6)
    phases: dict[str, float] = {}
    with_split = check_backend(ctx, ExactBackend(), phases=phases).to_json()
    plain = check_backend(ctx, ExactBackend()).to_json()
    assert set(phases) == {"kernel_s", "verdict_s", "bench_s"} and phases["kernel_s"] == with_split["kernel_s"]
    for data in (with_split, plain):
        for key in ("elapsed_s", "kernel_s", "harness_s"):
            data.pop(key)
    assert with_split == plain


def test_run_profile_prints_the_table_and_report_rebuilds_it(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cases.json").write_text(json.dumps([c.to_json() for c in tiny(2)]))
    argv = ["run", "--backend", f"{FAKES}:ExactBackend", "--device", "cpu", "--case-json", "@cases.json"]
    assert main([*argv, "--jobs", "1", "--no-progress", "--out", "plain.jsonl"]) == 0
    assert "Where the time went" not in capsys.readouterr().err
    assert main([*argv, "--jobs", "1", "--no-progress", "--profile", "--json", "s.json"]) == 0
    err = capsys.readouterr().err
    assert "Where the time went" in err and "fake-exact" in err.split("Where the time went")[1]
    assert json.loads((tmp_path / "s.json").read_text())["profile"]["total"]["pairs"] == 2
    assert main(["report", "results.jsonl", "--out", "rep"]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    section = md.split("## Where the time went")[1].split("\n## ")[0]
    assert "fake-exact" in section and "reference" in section
    assert "Where the time went" in (tmp_path / "rep" / "report.html").read_text()
    # a file written before the split: no section
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    old = [json.loads(line) for line in lines]
    for line in old:
        line.get("extra", {}).pop("t", None)
    (tmp_path / "old.jsonl").write_text("".join(json.dumps(line) + "\n" for line in old))
    assert main(["report", "old.jsonl", "--out", "rep-old"]) == 0
    assert "Where the time went" not in (tmp_path / "rep-old" / "report.md").read_text()


def test_a_resumed_file_has_one_profile_per_run(tmp_path: Path) -> None:
    cases = tiny(3)
    run(config(tmp_path, cases, (f"{FAKES}:ExactBackend",), limit=2))
    # the same sweep with a second backend: its pairs are the resumed run's
    run(config(tmp_path, cases, (f"{FAKES}:ExactBackend", f"{FAKES}:StoredExactBackend"), resume=True, limit=2))
    profiles = file_profiles(tmp_path / "r.jsonl")
    assert [p.pairs for p in profiles] == [2, 2]
    assert set(profiles[1].backends) == {"fake-stored-exact"}
    assert "run started" in profiles[0].label


def test_the_writer_hands_every_batch_to_the_os_and_fsyncs_at_most_twice_a_second(tmp_path: Path, monkeypatch):
    from conformance.running import pairs

    synced: list[int] = []
    monkeypatch.setattr(pairs.os, "fsync", lambda fd: synced.append(fd))
    record = CheckResult(case_id="c", backend="b", family="f", status=Status.PASS, case={})
    path = tmp_path / "r.jsonl"
    with Appender(path) as out:  # the results file in its format (conformance.records)
        writer = pairs._Writer(out)
        for n in range(1, 51):
            writer.write(record)
            writer.sync()
            assert path.read_text().count("\n") == n  # a killed parent keeps it: the OS has it
        assert len(synced) <= 1  # 50 batches within far less than SYNC_EVERY_S
        writer.sync(force=True)  # the end of a phase, or Ctrl-C
        assert len(synced) in (1, 2)
        monkeypatch.setattr(pairs._Writer, "SYNC_EVERY_S", 0.0)
        writer.sync()
        assert len(synced) in (2, 3)
