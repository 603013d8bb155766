"""Per-record cost of ``attnconf run`` end to end, and what of it is not the worker's own work.

Each benchmark runs one fixed sweep through :func:`conformance.running.runner.run` while a thread
watches the results file grow, so the steady state is timed without what a run pays once (imports,
worker start, describe, shutdown)::

    per_record_ms  = (time the last record landed - time the first landed) / (records - 1)
    check_ms       = mean of elapsed_s over the records but each worker's first (check_backend: the kernel,
                     the comparison, and for a case's first backend its inputs, reference and baseline;
                     the first pays the process's first-call warm-ups)
    overhead_ms    = per worker, (time its last record landed - time its first landed) minus the check
                     time of its records after the first, summed over the workers, per such record: what
                     a record costs a worker beyond the check (IPC, JSON, fsync, the parent's bookkeeping,
                     a worker idle between requests)

and, per record (medians): ``roundtrip`` (the parent's wall time for a request), ``rt_minus_check``
(``roundtrip - elapsed_s``) and, where the records carry ``extra["worker_s"]`` (the worker's whole time
for the request, parsing and encoding included), ``rt_minus_worker``.  Every figure is defined the same
way for any version of the runner, so the numbers before and after a change compare.

Sweeps: ``tiny`` (40 one-request cases x two exact fakes: a worker's own time is a few milliseconds,
so the overhead is most of a record) and ``smoke24`` (the first 24 ``smoke`` cases on ``sdpa-cpu``: a
real harness).  Run with ``nox -s bench -- -k runner`` or::

    python -m pytest benchmarks/test_bench_runner.py --benchmark-enable -s

The figures land in ``extra_info`` (``--benchmark-json``) and are printed with ``-s``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from conformance.cases.case import AttentionCase
from conformance.results_file import read_records
from conformance.running.runner import RunConfig, run, select_cases

FAKES = "tests.conformance.fakes"


def _tiny() -> list[AttentionCase]:
    return [
        AttentionCase(requests=((q, q + 3),), num_heads=2, num_kv_heads=1, head_dim=16, dtype="fp16")
        for q in range(1, 41)
    ]


SWEEPS = {
    "tiny": (_tiny, (f"{FAKES}:ExactBackend", f"{FAKES}:StoredExactBackend")),
    "smoke24": (lambda: select_cases("smoke", limit=24), ("sdpa-cpu",)),
}


class _Watch(threading.Thread):
    """Polls the results file's size; ``landed()`` maps it to the times the result lines appeared."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.stop, self.seen = path, threading.Event(), [(0.0, 0)]

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                size = os.stat(self.path).st_size
            except OSError:
                size = 0
            if size != self.seen[-1][1]:
                self.seen.append((time.perf_counter(), size))
            time.sleep(0.002)

    def landed(self) -> list[float]:
        times, end = [], 0
        with open(self.path, "rb") as fh:
            for line in fh:
                end += len(line)
                if b'"type": "result"' in line:
                    times.append(next(t for t, size in self.seen if size >= end))
        return times


def _sweep(tmp: Path, cases: list[AttentionCase], backends: tuple[str, ...], jobs: int) -> dict[str, Any]:
    path = tmp / "cases.json"
    path.write_text(json.dumps([c.to_json() for c in cases]))
    out = tmp / "out.jsonl"
    # jobs is set only where the runner has the option, so the benchmark still runs on a runner from before it
    has_jobs = "jobs" in {f.name for f in dataclasses.fields(RunConfig)}
    if jobs != 1 and not has_jobs:
        pytest.skip("this runner has no jobs option")
    config = RunConfig(backends=backends, case_json="@" + str(path), out=out, progress=False)
    if has_jobs:
        config = dataclasses.replace(config, jobs=jobs)
    watch = _Watch(out)
    watch.start()
    t0 = time.perf_counter()
    try:
        summary = run(config)
    finally:
        watch.stop.set()
        watch.join()
    wall = time.perf_counter() - t0
    _, results = read_records(out)
    assert summary.written == len(results) == len(cases) * len(backends)
    assert summary.exit_code == 0
    landed = watch.landed()
    # Per worker: the time between its first and its last record landing, against the check time of the
    # records after its first (which pays the process's first-call warm-ups and is left out).
    mine: dict[Any, list[tuple[float, Any]]] = {}
    for t, r in zip(landed, results):
        mine.setdefault(r.extra.get("worker", 0), []).append((t, r))
    spans = [(w[-1][0] - w[0][0], [r.elapsed_s for _, r in w[1:]]) for w in mine.values() if len(w) > 1]
    steady = [c for _, checks in spans for c in checks]
    worker = [r.extra["roundtrip_s"] - r.extra["worker_s"] for r in results if "worker_s" in r.extra]
    return {
        "records": len(results),
        "workers": len(mine),
        "wall_s": wall,
        "first_record_s": landed[0] - t0,
        "per_record_s": (landed[-1] - landed[0]) / (len(landed) - 1),
        "check_mean_s": statistics.fmean(steady),
        "overhead_s": sum(span - sum(checks) for span, checks in spans) / len(steady),
        "roundtrip_s": statistics.median(r.extra["roundtrip_s"] for r in results),
        "rt_minus_check_s": statistics.median(r.extra["roundtrip_s"] - r.elapsed_s for r in results),
        "rt_minus_worker_s": statistics.median(worker) if worker else None,
    }


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("sweep", list(SWEEPS))
def test_bench_runner_per_record(benchmark: BenchmarkFixture, tmp_path: Path, sweep: str, jobs: int) -> None:
    make, backends = SWEEPS[sweep]
    cases = make()
    m: dict[str, Any] = benchmark.pedantic(_sweep, args=(tmp_path, cases, backends, jobs), rounds=1, iterations=1)
    ms = lambda seconds: None if seconds is None else round(seconds * 1e3, 2)  # noqa: E731
    figures = {
        "records": m["records"],
        "workers": m["workers"],
        "wall_s": round(m["wall_s"], 2),
        "first_record_s": round(m["first_record_s"], 2),
        "per_record_ms": ms(m["per_record_s"]),
        "check_ms": ms(m["check_mean_s"]),
        "overhead_ms": ms(m["overhead_s"]),
        "roundtrip_ms": ms(m["roundtrip_s"]),
        "rt_minus_check_ms": ms(m["rt_minus_check_s"]),
        "rt_minus_worker_ms": ms(m["rt_minus_worker_s"]),
    }
    benchmark.extra_info.update(sweep=sweep, jobs=jobs, **figures)
    print(f"\n{sweep} jobs={jobs}: " + ", ".join(f"{k} {v}" for k, v in figures.items()))
    assert m["per_record_s"] > 0 and m["check_mean_s"] > 0
