"""The compile phase: each distinct JIT kernel compiled once, spread over the workers, before the checks.

The fake :class:`~tests.conformance.fakes.JitBackend` compiles one kernel per head dim on its first call in a
process (a sleep), unless its "disk cache" (a marker file per key) has it, then it loads it (a short sleep); it
logs each compile and load with its pid.  So the log tells how often each kernel was compiled, by which process,
and the records' timings (``extra["t"]``) tell whether a check paid a compile.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from conformance.cases.case import AttentionCase
from conformance.cli import main
from conformance.records import Status
from conformance.results_file import read_records
from conformance.running.compile_phase import plan_compiles
from conformance.running.pairs import _Pair
from conformance.running.runner import RunConfig, run
from conformance.running.schedule import case_size
from tests.conformance.fakes import JIT_CACHE_ENV, JIT_COMPILE_ENV

JIT = "tests.conformance.fakes:JitBackend"
EXACT = "tests.conformance.fakes:ExactBackend"
COMPILE_S = 0.6


def cases(head_dims=(16, 64, 80), per_key: int = 4) -> list[AttentionCase]:
    return [
        AttentionCase(requests=((q, q + 1),), num_heads=2, num_kv_heads=1, head_dim=d, dtype="fp16")
        for d in head_dims
        for q in range(1, per_key + 1)
    ]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    folder = tmp_path / "jit-cache"
    folder.mkdir()
    monkeypatch.setenv(JIT_CACHE_ENV, str(folder))
    monkeypatch.setenv(JIT_COMPILE_ENV, str(COMPILE_S))
    return folder


def log(folder: Path) -> list[tuple[str, int, int]]:
    path = folder / "log"
    if not path.exists():
        return []
    return [(w, int(k), int(p)) for w, k, p in (line.split() for line in path.read_text().splitlines())]


def config(tmp_path: Path, selected: list[AttentionCase], name: str = "r.jsonl", **kw) -> RunConfig:
    path = tmp_path / "cases.json"
    path.write_text(json.dumps([c.to_json() for c in selected]))
    return RunConfig(
        backends=kw.pop("backends", (JIT, EXACT)),
        case_json="@" + str(path),
        out=tmp_path / name,
        progress=False,
        jobs=kw.pop("jobs", 2),
        **kw,
    )


_TIMING_EXTRA = {"t", "worker_s", "roundtrip_s", "worker", "gpu"}


def comparable(record) -> dict:
    """A record without what differs from run to run (times, the worker that ran it)."""
    data = record.to_json()
    for key in ("elapsed_s", "kernel_s", "harness_s"):
        data.pop(key)
    data["extra"] = {k: v for k, v in data["extra"].items() if k not in _TIMING_EXTRA}
    return data


def test_each_kernel_is_compiled_once_across_workers_and_the_checks_pay_no_compile(tmp_path: Path, cache: Path):
    selected = cases()
    summary = run(config(tmp_path, selected))
    assert summary.exit_code == 0 and summary.written == 2 * len(selected)
    events = log(cache)
    compiles = Counter(k for w, k, _ in events if w == "compile")
    assert compiles == {16: 1, 64: 1, 80: 1}  # one compile per kernel, whatever worker met it
    assert len({p for w, _, p in events if w == "compile"}) == 2  # spread over both workers
    stats = summary.compile
    assert stats.keys == 3 and stats.compiled == 3 and not stats.failed and stats.workers == 2
    assert min(stats.compile_s) >= COMPILE_S
    _, records = read_records(tmp_path / "r.jsonl")
    for r in records:
        t = r.extra["t"]
        # a check's kernel call never compiles: a first call of a key in a worker is at most a cache load
        assert t.get("comp", 0) + t.get("kern", 0) < COMPILE_S / 2, (r.case_id, r.backend, t)
    header = read_records(tmp_path / "r.jsonl")[0][0]
    assert header.env["run"]["compile"]["compiled"] == 3
    assert header.env["run"]["checks_at_s"] > stats.wall_s  # the checks began after the phase
    assert "compile phase: 3 kernel(s) by 2 worker(s)" in summary.text()
    assert summary.to_json()["compile"]["compiled"] == 3


@pytest.mark.slow
def test_without_the_phase_the_checks_pay_the_compiles_and_the_records_are_the_same(tmp_path: Path, cache: Path):
    selected = cases()
    without = run(config(tmp_path, selected, "without.jsonl", compile_phase=False))
    assert without.compile is None and without.exit_code == 0
    _, first = read_records(tmp_path / "without.jsonl")
    paid = {r.case["head_dim"] for r in first if r.extra["t"].get("comp", 0) >= COMPILE_S}
    assert paid == {16, 64, 80}  # each kernel's first call compiles in the checks (twice when two workers race)
    for marker in cache.glob("kernel-*"):
        marker.unlink()  # a fresh cache: the second run compiles again
    with_phase = run(config(tmp_path, selected, "with.jsonl"))
    assert with_phase.compile.compiled == 3
    _, second = read_records(tmp_path / "with.jsonl")
    key = lambda r: (r.case_id, r.backend)  # noqa: E731
    assert sorted(map(comparable, first), key=str) == sorted(map(comparable, second), key=str)
    assert sorted(map(key, first)) == sorted(map(key, second))


@pytest.mark.slow
def test_a_kernel_that_fails_or_crashes_to_compile_does_not_stop_the_run(tmp_path: Path, cache: Path):
    selected = cases(head_dims=(16, 32, 48), per_key=2)
    summary = run(config(tmp_path, selected, backends=(JIT,)))
    stats = summary.compile
    assert stats.keys == 3 and stats.compiled == 1 and len(stats.failed) == 2
    reasons = {f["key"]: f["reason"] for f in stats.failed}
    assert "planted compile failure" in reasons["('fake-jit', 32)"]
    assert reasons["('fake-jit', 48)"].startswith("crash:")
    _, records = read_records(tmp_path / "r.jsonl")
    status = {r.case_id: r.status for r in records}
    by_dim = Counter((c.head_dim, status[c.id]) for c in selected)
    # judged in the checks as without the phase: 32 raises (error), 48 kills its worker (crash)
    assert by_dim == {(16, Status.PASS): 2, (32, Status.ERROR): 2, (48, Status.CRASH): 2}
    assert summary.written == len(selected)


@pytest.mark.slow
def test_warmup_compiles_and_writes_no_results_file(tmp_path: Path, cache: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    selected = cases(per_key=2)
    (tmp_path / "cases.json").write_text(json.dumps([c.to_json() for c in selected]))
    argv = ["warmup", "--backend", JIT, "--backend", EXACT, "--device", "cpu", "--case-json", "@cases.json"]
    code = main([*argv, "--jobs", "2", "--no-progress", "--json", "warm.json"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert not (tmp_path / "results.jsonl").exists() and not list(tmp_path.glob("*.jsonl"))
    assert "compile phase: 3 kernel(s)" in err and "no results file written" in err
    assert Counter(w for w, _, _ in log(cache)) == {"compile": 3}
    summary = json.loads((tmp_path / "warm.json").read_text())
    assert summary["compile_only"] and summary["compile"]["compiled"] == 3 and summary["exit_status"] == 0
    # the baked cache serves the next run: no compile at all, only loads
    code = main(["run", *argv[1:], "--jobs", "2", "--no-progress", "--out", "r.jsonl"])
    assert code == 0
    assert Counter(w for w, _, _ in log(cache))["compile"] == 3


def test_warmup_with_one_worker_and_nothing_to_compile(tmp_path: Path, cache: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cases.json").write_text(json.dumps([c.to_json() for c in cases(per_key=1)]))
    base = ["warmup", "--device", "cpu", "--case-json", "@cases.json", "--no-progress", "--jobs", "1"]
    assert main([*base, "--backend", JIT]) == 0
    assert Counter(w for w, _, _ in log(cache)) == {"compile": 3}
    assert main([*base, "--backend", EXACT]) == 0
    assert "nothing to compile" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.jsonl"))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--out", "x.jsonl"], "--out: warmup writes no results file"),
        (["--resume"], "--resume: --compile-only (warmup) writes no results file"),
    ],
)
def test_warmup_refuses_results_file_options(tmp_path: Path, monkeypatch, capsys, extra, message) -> None:
    monkeypatch.chdir(tmp_path)
    code = main(["warmup", "--backend", EXACT, "--device", "cpu", "--suite", "smoke", "--limit", "1", *extra])
    assert code == 2 and message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_plan_takes_the_smallest_plain_case_of_each_key() -> None:
    small = AttentionCase(requests=((2, 2),), num_heads=2, num_kv_heads=1, head_dim=16, dtype="fp16")
    large = AttentionCase(requests=((64, 64),), num_heads=2, num_kv_heads=1, head_dim=16, dtype="fp16")
    graph = AttentionCase(requests=((1, 1),), num_heads=2, num_kv_heads=1, head_dim=16, dtype="fp16", backward=True)
    other = AttentionCase(requests=((8, 8),), num_heads=2, num_kv_heads=1, head_dim=64, dtype="fp16")
    selected = [large, other, graph, small]  # the backward case is smaller, but composed
    units = [[_Pair(c, JIT, {})] for c in selected]
    keys = {c.id: ((JIT, f"('fake-jit', {c.head_dim})"),) for c in selected}
    tasks = plan_compiles(units, keys, case_size)
    assert [(t.key, t.case.id, t.cases) for t in tasks] == [
        ("('fake-jit', 16)", small.id, 3),  # most-shared key first
        ("('fake-jit', 64)", other.id, 1),
    ]


class FakeClient:
    """A worker client answering ``compile`` requests from a script: ``{key: reply}``; records what it was sent."""

    def __init__(self, replies: dict, delay: float = 0.0) -> None:
        self.replies, self.delay, self.sent, self.kills = replies, delay, [], 0

    def request(self, message: dict, timeout: float):
        import time

        from conformance.running.worker import Reply

        time.sleep(self.delay)
        case = AttentionCase.from_json(message["case"])
        self.sent.append(case.head_dim)
        kind, data = self.replies.get(case.head_dim, ("ok", {"ok": True, "compiled": True, "compile_s": 0.1}))
        return Reply(kind, data={**data, "worker_s": 0.2} if kind == "ok" else {}, reason="worker killed by SIGABRT",
                     wall_s=0.3)  # fmt: skip

    def kill(self) -> None:
        self.kills += 1


def _tasks(dims) -> list:
    from conformance.running.compile_phase import CompileTask

    return [CompileTask(JIT, f"k{d}", cases(head_dims=(d,), per_key=1)[0], 1) for d in dims]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_phase_runs_each_task_once_and_replaces_a_worker_that_died_or_may_be_poisoned(device: str) -> None:
    from conformance.running.compile_phase import run_compile_phase

    script = {
        32: ("ok", {"ok": True, "compiled": False, "error": "RuntimeError: refused"}),
        48: ("crash", {}),
        64: ("ok", {"ok": False, "error": "bad request"}),
    }
    clients = [FakeClient(script, delay=0.01) for _ in range(3)]
    done = []
    stats = run_compile_phase(
        clients, _tasks((16, 32, 48, 64, 80, 96)), seed=0, device=device, timeout=5,
        on_done=lambda task, outcome: done.append(task.key),
    )  # fmt: skip
    assert sorted(d for c in clients for d in c.sent) == [16, 32, 48, 64, 80, 96]  # each once
    assert sorted(done) == sorted(f"k{d}" for d in (16, 32, 48, 64, 80, 96))
    assert stats.keys == 6 and stats.compiled == 3 and stats.workers == 3
    assert {f["key"]: f["reason"] for f in stats.failed} == {
        "k32": "RuntimeError: refused",
        "k48": "crash: worker killed by SIGABRT",
        "k64": "bad request",
    }
    kills = sum(c.kills for c in clients)
    assert kills == (1 if device == "cpu" else 3)  # a crash always; an error only where CUDA may be poisoned
    assert stats.worker_s == pytest.approx(5 * 0.2 + 0.3)
    assert set(stats.owner) == {(JIT, "k16"), (JIT, "k80"), (JIT, "k96")}


def test_ctrl_c_in_the_compile_phase_kills_the_workers_and_propagates() -> None:
    import _thread
    import threading

    from conformance.running.compile_phase import run_compile_phase

    clients = [FakeClient({}, delay=0.5) for _ in range(2)]
    threading.Timer(0.2, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt):
        run_compile_phase(clients, _tasks((16, 32, 48, 64)), seed=0, device="cpu", timeout=5)
    assert all(c.kills == 1 for c in clients)
    assert sum(len(c.sent) for c in clients) <= 4


def test_ctrl_c_in_the_compile_phase_leaves_the_caller_what_was_compiled() -> None:
    """The warmup's last line after Ctrl-C: how far the phase got, never 'nothing to compile' (an H100 warmup
    interrupted after 1,230 of 1,313 kernels said exactly that)."""
    import _thread
    import threading

    from conformance.running.compile_phase import CompileStats, run_compile_phase
    from conformance.running.outcome import RunSummary

    clients = [FakeClient({}, delay=0.15) for _ in range(2)]
    stats = CompileStats()
    threading.Timer(0.4, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt):
        run_compile_phase(clients, _tasks((16, 32, 48, 64, 80, 96, 112, 128)), seed=0, device="cpu", timeout=5,
                          stats=stats)  # fmt: skip
    assert stats.interrupted and stats.keys == 8 and 1 <= stats.compiled < 8
    summary = RunSummary(out=None, compile_only=True)
    summary.compile, summary.interrupted = stats, True
    line = summary.text()
    assert "nothing to compile" not in line
    assert f"{stats.compiled} compiled, 0 failed; interrupted after {stats.compiled} of 8, the rest not tried" in line
