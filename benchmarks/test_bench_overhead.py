"""What the harness costs per check beyond the kernel, piece by piece, on CPU (guards issue 30's overheads).

Each benchmark times one piece of the per-record path of ``attnconf run`` on a tiny case, with a backend whose
kernel returns a precomputed output (so nothing here is kernel time):

* ``worker_check``: the worker's ``check`` op for a case whose context it already holds (the second backend of
  a case): support check, input copies, prepare, the no-op kernel, the comparison, the record's encoding, and
  the phase accounting (:class:`conformance.running.worker._Worker`);
* ``record_encode``: a record's JSON line (``CheckResult.to_json`` + ``json.dumps``), as the worker and the
  parent's writer each do once per record;
* ``parent_record``: the parent's work for one reply: the record from the reply, its timings
  (:class:`conformance.running.profile.RunClock`), the line written and handed to the OS (the writer fsyncs at
  most twice a second) and the summary's bookkeeping;
* ``round_trip``: one ``check`` request through a real worker process, pipelined two deep as the pool does;
  ``extra_info`` holds the median IPC (round trip minus the worker's own time).

Run with ``nox -s bench -- -k overhead`` or ``python -m pytest benchmarks/test_bench_overhead.py
--benchmark-enable``; without ``--benchmark-enable`` each runs once (a smoke test).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from attnfast.base import KernelOutput
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from conformance.records import CheckResult
from conformance.results_file import read_records
from conformance.results_writer import Appender
from conformance.running.outcome import RunSummary
from conformance.running.pairs import RunConfig, _account, _Writer, reply_record
from conformance.running.profile import RunClock
from conformance.running.worker import Reply, WorkerClient, _Worker
from tests.conformance.fakes import ExactBackend

CASE = AttentionCase(requests=((4, 8),), num_heads=2, num_kv_heads=1, head_dim=16, dtype="fp16")
SPEC = "benchmarks.test_bench_overhead:PrecomputedBackend"


class PrecomputedBackend(ExactBackend):
    """Exact, with the kernel's output computed once per case: its kernel call only returns it."""

    name: ClassVar[str] = "bench-precomputed"
    _outputs: ClassVar[dict[str, KernelOutput]] = {}

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        if case.id not in self._outputs:
            self._outputs[case.id] = super().prepare(case, inputs)()
        out = self._outputs[case.id]

        def kernel() -> KernelOutput:
            return out

        return kernel


def _request(**extra: Any) -> dict[str, Any]:
    return {"op": "check", "case": CASE.to_json(), "backend": SPEC, "seed": 0, "device": "cpu", "tol": [],
            "tol_file": None, "time": False, **extra}  # fmt: skip


@pytest.fixture(scope="module")
def worker() -> _Worker:
    w = _Worker()
    w.check(_request())  # the context, the backend's import and the first-call warm-ups
    return w


@pytest.fixture(scope="module")
def reply(worker: _Worker) -> dict[str, Any]:
    data = worker.check(_request())
    return {**data, "worker_s": 1e-3, "idle_s": 1e-5}


def test_bench_worker_check(benchmark: BenchmarkFixture, worker: _Worker) -> None:
    data: dict[str, Any] = benchmark(worker.check, _request())
    phases = data["phases"]
    assert "context_s" not in phases and {"prepare_s", "kernel_s", "verdict_s", "encode_s"} <= set(phases)
    benchmark.extra_info.update({k: round(v * 1e3, 4) for k, v in phases.items()})


def test_bench_record_encode(benchmark: BenchmarkFixture, reply: dict[str, Any]) -> None:
    record = CheckResult.from_json(reply["result"])
    line: str = benchmark(lambda: json.dumps(record.to_json(), sort_keys=True, allow_nan=True))
    benchmark.extra_info["bytes"] = len(line)


def test_bench_parent_record(benchmark: BenchmarkFixture, reply: dict[str, Any], tmp_path: Path) -> None:
    config = RunConfig(backends=(SPEC,), device="cpu")
    info = {"name": "bench-precomputed", "family": "fake", "version": "n/a"}
    path = tmp_path / "r.jsonl"
    summary = RunSummary(out=path)
    clock = RunClock(time.perf_counter())
    answer = Reply("ok", data=reply, wall_s=1.2e-3)

    with Appender(path) as appender:  # as the runner does: the writer appends in the file's format
        writer = _Writer(appender)

        def parent() -> None:  # the runner's judge, then deliver, then the batch's sync, for a batch of one
            t0 = time.perf_counter()
            record = reply_record(answer, CASE, SPEC, info, config)
            extra = {**record.extra, "worker": 0}
            clock.judged(extra, answer, time.perf_counter() - t0)
            record = replace(record, extra=extra)
            clock.written(record.extra)
            writer.write(record)
            _account(summary, record, answer)
            writer.sync()

        benchmark(parent)
    _, written = read_records(path)  # every record timed reached the file, as the runner wrote it
    assert summary.written >= 1 and len(written) == summary.written
    assert written[-1].extra["worker"] == 0 and written[-1].status is summary.results[-1].status


def test_bench_round_trip(benchmark: BenchmarkFixture) -> None:
    client = WorkerClient()
    try:
        client.preload = [SPEC]
        client.request(_request(), timeout=120)  # start-up, imports, the context

        def pipelined(n: int = 20) -> list[Reply]:
            replies = []
            client.submit(_request())
            for i in range(n):
                if i + 1 < n:
                    client.submit(_request())
                replies.append(client.collect(60))
            return replies

        replies: list[Reply] = benchmark.pedantic(pipelined, rounds=3, iterations=1)
    finally:
        client.close()
    assert all(r.kind == "ok" and r.data["ok"] for r in replies)
    ipc = statistics.median(r.wall_s - r.data["worker_s"] for r in replies)
    worker = statistics.median(r.data["worker_s"] for r in replies)
    benchmark.extra_info.update(ipc_ms=round(ipc * 1e3, 3), worker_ms=round(worker * 1e3, 3))
    print(f"\nround trip: worker {worker * 1e3:.2f} ms, ipc {ipc * 1e3:.2f} ms per record (medians)")
