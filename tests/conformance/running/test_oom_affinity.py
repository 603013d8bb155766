"""A pool's own parallelism must not make false records or compile a kernel twice.

* CUDA out of memory under sharing: a fake backend raises ``torch.OutOfMemoryError`` on its first attempt
  at each case (as a kernel would when twelve workers share one GPU); the parent defers those pairs and
  runs them again alone after the parallel phase (the fake sees no other worker alive then).  Tested on
  CPU: ``--device cpu`` workers share the one device, as workers placed on one GPU do.
* Compile affinity: :class:`~conformance.running.pool.WorkFeed` with compile keys, and the worker's
  ``keys`` op that computes them without the parent importing an adapter.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import threading
from collections import Counter
from pathlib import Path

import pytest
import torch

from conformance.cases.case import AttentionCase
from conformance.records import CheckResult, Status
from conformance.results_file import read_records
from conformance.running import runner
from conformance.records import HARNESS_ERROR
from conformance.running.pool import WorkFeed
from conformance.running.runner import RunConfig, is_cuda_oom, run
from conformance.running.worker import WorkerClient
from tests.conformance.fakes import ExactBackend

HERE = "tests.conformance.running.test_oom_affinity"
OOM = "ATTNCONF_TEST_OOM"


def _siblings() -> int:
    """Live worker processes (not zombies) of this run other than this one: children of this one's parent that
    run ``conformance.running.worker`` with this test's ``$ATTNCONF_TEST_OOM``, i.e. the pool's other workers and
    its spares, whether or not they have loaded a backend yet (Linux ``/proc``; the parent's other children, such
    as multiprocessing's resource tracker under pytest-xdist, are not the run's)."""
    me, parent = os.getpid(), os.getppid()
    mark = f"{OOM}={os.environ[OOM]}".encode()
    n = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            if int(ppid) != parent or state in "ZX":
                continue
            ours = b"conformance.running.worker" in (entry / "cmdline").read_bytes()
            ours = ours and mark in (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue  # it exited while being read
        n += ours
    return n


class OomOnceBackend(ExactBackend):
    """Exact, but the first attempt at each case raises ``torch.OutOfMemoryError`` (a marker file per case
    in ``$ATTNCONF_TEST_OOM``), as a kernel would when twelve workers fill one GPU.  A later attempt notes how
    many *other* live processes the parent has (``others_alive``): workers and spare workers, loaded or still
    starting; zero when it ran alone."""

    name = "test-oom-once"

    def __init__(self) -> None:
        Path(os.environ[OOM]).mkdir(parents=True, exist_ok=True)

    def prepare(self, case, inputs):
        folder = Path(os.environ[OOM])
        marker = folder / f"tried-{case.requests[0][0]}"
        if not marker.exists():
            marker.touch()
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.18 GiB of which "
                "1.50 GiB is free. Process 729 has 4.76 GiB memory in use. Process 702 has 8.48 GiB memory in use."
            )
        run = super().prepare(case, inputs)

        def kernel():
            return run()

        kernel.notes = [f"others_alive={_siblings()}"]
        return kernel


class KeyedBackend(ExactBackend):
    """Exact, with a compile key: the head dim (as if it JIT-compiled one kernel per head dim)."""

    name = "test-keyed"

    def compile_key(self, case):
        return ("test", case.head_dim)

    def supports(self, case, device):
        base = super().supports(case, device)
        if base and case.head_dim == 32:
            from attnfast.base import Support

            return Support(False, "planted refusal: no head dim 32")
        return base


def tiny_cases(n: int, head_dim: int = 16) -> list[AttentionCase]:
    return [
        AttentionCase(requests=((q, q),), num_heads=2, num_kv_heads=1, head_dim=head_dim, dtype="fp16")
        for q in range(1, n + 1)
    ]


def case_json(tmp_path: Path, cases: list[AttentionCase]) -> str:
    path = tmp_path / "cases.json"
    path.write_text(json.dumps([c.to_json() for c in cases]))
    return "@" + str(path)


def run_pool(tmp_path: Path, backends: tuple[str, ...], cases: list[AttentionCase], jobs: int = 2):
    """``attnconf run`` of ``cases`` on ``backends`` with ``jobs`` workers on CPU into ``tmp_path/r.jsonl``: the
    summary and the records written."""
    config = RunConfig(
        backends=backends, case_json=case_json(tmp_path, cases), out=tmp_path / "r.jsonl", progress=False, jobs=jobs
    )
    summary = run(config)
    return summary, read_records(tmp_path / "r.jsonl")[1]


def oom_config(tmp_path: Path, **kw) -> RunConfig:
    return RunConfig(
        backends=(f"{HERE}:OomOnceBackend", "tests.conformance.fakes:ExactBackend"),
        case_json=case_json(tmp_path, tiny_cases(3)),
        out=tmp_path / "r.jsonl",
        progress=False,
        jobs=2,
        **kw,
    )


# ---------------------------------------------------------------------------------------- CUDA OOM


def test_cuda_oom_is_recognised_in_its_spellings() -> None:
    def rec(status: Status, reason: str) -> CheckResult:
        return CheckResult(case_id="c", backend="b", family="f", status=status, case={}, reason=reason)

    for reason in [
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",
        "harness error (inputs or reference), not the kernel: OutOfMemoryError: CUDA out of memory.",
        "RuntimeError: CUDA out of memory. Tried to allocate",
        "RuntimeError: CUDA error: out of memory",
        "RuntimeError: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "DSLRuntimeError: CUDA_ERROR_OUT_OF_MEMORY",
        "RuntimeError: Expected mha_graph.execute(handle, variant_pack, workspace_ptr.get()).is_good() to be true, "
        "but got false.  (Could this error message be improved?",
    ]:
        assert is_cuda_oom(rec(Status.ERROR, reason)), reason
    assert not is_cuda_oom(rec(Status.ERROR, "RuntimeError: planted failure"))
    assert not is_cuda_oom(rec(Status.FAIL, "OutOfMemoryError: CUDA out of memory"))  # only errors
    assert not is_cuda_oom(rec(Status.CRASH, "CUDA out of memory"))


@pytest.mark.slow
def test_a_cuda_oom_under_sharing_is_run_again_alone(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(OOM, str(tmp_path / "oom"))
    summary = run(oom_config(tmp_path))
    _, records = read_records(tmp_path / "r.jsonl")
    assert Counter((r.backend, r.status) for r in records) == {
        ("test-oom-once", Status.PASS): 3,
        ("fake-exact", Status.PASS): 3,
    }
    assert Counter((r.case_id, r.backend) for r in records) == Counter(
        {(c.id, b): 1 for c in tiny_cases(3) for b in ("test-oom-once", "fake-exact")}
    )  # one record per pair: the deferred OOM was never written
    for r in records:
        if r.backend == "test-oom-once":
            retry = r.extra["oom_retry"]
            assert retry["workers_sharing"] == 2
            assert retry["first_error"].startswith("OutOfMemoryError: CUDA out of memory")
            assert r.extra["notes"] == ["others_alive=0"]  # the other worker was closed: it ran alone
        else:
            assert "oom_retry" not in r.extra
    assert summary.exit_code == 0 and summary.oom_retries == 3
    assert summary.written == 6 and summary.counts["pass"] == 6 and summary.counts["error"] == 0
    assert "CUDA OOM retried alone: 3" in summary.text()
    assert summary.worker_starts >= 2 + 1  # a worker that ran out of memory is replaced


class BrokenContextOnceBackend(ExactBackend):
    """Exact; loading it makes the worker's context build (inputs, reference, baseline) raise a CUDA error the first
    time each case is built (a marker file per case in ``$ATTNCONF_TEST_OOM``), as a context broken by an earlier
    kernel's fault does.  A later attempt notes the other live worker processes (``others_alive``)."""

    name = "test-broken-context"

    def __init__(self) -> None:
        from conformance.verdict import check

        folder = Path(os.environ[OOM])
        folder.mkdir(parents=True, exist_ok=True)
        build = check.prepare_context

        def broken_once(case, **kw):
            marker = folder / f"built-{case.requests[0][0]}"
            if not marker.exists():
                marker.touch()
                raise RuntimeError("CUDA error: an illegal instruction was encountered")
            return build(case, **kw)

        check.prepare_context = broken_once

    def prepare(self, case, inputs):
        run = super().prepare(case, inputs)

        def kernel():
            return run()

        kernel.notes = [f"others_alive={_siblings()}"]
        return kernel


def test_a_pair_whose_context_was_broken_is_run_again_alone(tmp_path: Path, monkeypatch) -> None:
    # A harness error from a CUDA error (the inputs or reference of a case, before its kernel ran) is the worker's
    # broken context, not the pair's: the pair runs again once, alone, and its record names the first error and the
    # pair its worker ran before.  On the H100 (reports/h100-2026-11-27-warm6, warm6-nospare) FA2's keyless paged case
    # got "harness error ...: an illegal instruction" this way, a verdict lost.
    monkeypatch.setenv(OOM, str(tmp_path / "ctx"))
    backends = (f"{HERE}:BrokenContextOnceBackend", "tests.conformance.fakes:ExactBackend")
    summary, records = run_pool(tmp_path, backends, tiny_cases(4))
    assert Counter((r.backend, r.status) for r in records) == {
        ("test-broken-context", Status.PASS): 4,
        ("fake-exact", Status.PASS): 4,
    }  # one record per pair, every one judged
    retried = [r for r in records if "harness_retry" in r.extra]
    assert {r.backend for r in retried} == {"test-broken-context"} and len(retried) == 4  # each case's first pair
    for r in retried:
        first = r.extra["harness_retry"]
        assert first["first_error"].startswith(HARNESS_ERROR + "RuntimeError: CUDA error")
        assert first["after"] is None or first["after"].endswith(" fake-exact")  # the slot's previous pair, if any
        assert r.extra["notes"] == ["others_alive=0"]  # run again alone
    assert any(r.extra["harness_retry"]["after"] for r in retried)  # a worker that had run a pair names it
    assert summary.exit_code == 0 and summary.harness_retries == 4 and summary.oom_retries == 0
    assert "retried alone after a broken CUDA context: 4" in summary.text()


def test_a_harness_cuda_fault_is_told_from_an_oom_and_a_kernel_error() -> None:
    from conformance.records import is_harness_cuda_fault

    illegal = "AcceleratorError: CUDA error: an illegal instruction"

    def rec(status: Status, reason: str) -> CheckResult:
        return CheckResult(case_id="c", backend="b", family="f", status=status, case={}, reason=reason)

    assert is_harness_cuda_fault(rec(Status.ERROR, HARNESS_ERROR + illegal))
    assert not is_harness_cuda_fault(rec(Status.ERROR, illegal))  # the kernel's own error
    assert not is_harness_cuda_fault(rec(Status.ERROR, HARNESS_ERROR + "OutOfMemoryError: CUDA out of memory."))
    assert not is_harness_cuda_fault(rec(Status.ERROR, HARNESS_ERROR + "ValueError: bad case"))  # a harness bug
    assert not is_harness_cuda_fault(rec(Status.FAIL, HARNESS_ERROR + "CUDA error: x"))
    from conformance.records import is_cuda_fault

    assert is_cuda_fault(rec(Status.ERROR, illegal)) and is_cuda_fault(rec(Status.ERROR, HARNESS_ERROR + illegal))
    assert not is_cuda_fault(rec(Status.ERROR, "OutOfMemoryError: CUDA out of memory."))
    assert not is_cuda_fault(rec(Status.ERROR, "ValueError: bad case"))
    assert not is_cuda_fault(rec(Status.FAIL, illegal))


@pytest.mark.slow
def test_a_run_stopped_before_the_retry_leaves_the_pairs_to_resume(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(OOM, str(tmp_path / "oom"))

    def interrupted(deferred):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "_retry_units", interrupted)
    stopped = run(oom_config(tmp_path))  # Ctrl-C: run() returns what it kept, marked interrupted
    assert stopped.interrupted and stopped.exit_code == 130 and stopped.written == 3
    _, before = read_records(tmp_path / "r.jsonl")
    assert {(r.backend, r.status) for r in before} == {("fake-exact", Status.PASS)} and len(before) == 3
    monkeypatch.undo()
    monkeypatch.setenv(OOM, str(tmp_path / "oom"))  # the markers stay: the resumed attempts pass
    summary = run(oom_config(tmp_path, resume=True))
    _, after = read_records(tmp_path / "r.jsonl")
    assert summary.skipped == 3 and summary.exit_code == 0
    assert Counter((r.case_id, r.backend, r.status) for r in after) == Counter(
        {(c.id, b, Status.PASS): 1 for c in tiny_cases(3) for b in ("test-oom-once", "fake-exact")}
    )


def test_one_worker_writes_its_oom_as_it_is(tmp_path: Path, monkeypatch) -> None:
    """Alone on its device there is no one to blame: the OOM is the record (no retry)."""
    monkeypatch.setenv(OOM, str(tmp_path / "oom"))
    summary = run(
        RunConfig(
            backends=(f"{HERE}:OomOnceBackend",),
            case_json=case_json(tmp_path, tiny_cases(1)),
            out=tmp_path / "r.jsonl",
            progress=False,
            jobs=1,
        )
    )
    _, records = read_records(tmp_path / "r.jsonl")
    assert [r.status for r in records] == [Status.ERROR] and "oom_retry" not in records[0].extra
    assert summary.oom_retries == 0 and summary.exit_code == 1


# ---------------------------------------------------------------------------------------- compile affinity


def test_feed_without_keys_is_fifo() -> None:
    feed = WorkFeed([[1], [], [2], [3]])
    assert len(feed) == 3
    assert [feed.take(0), feed.take(1), feed.take(), feed.take(0)] == [[1], [2], [3], None]


def _drain(feed: WorkFeed, workers: int, order) -> list[tuple[int, list]]:
    """Take until empty, workers in the given order (cycled); returns (worker, unit) in take order."""
    taken = []
    for w in itertools.cycle(order(workers)):
        unit = feed.take(w)
        if unit is None:
            return taken
        taken.append((w, unit))


@pytest.mark.parametrize(("workers", "nkeys"), [(3, 7), (4, 4), (5, 2), (12, 30)])
def test_each_key_is_claimed_by_one_worker_while_others_remain(workers: int, nkeys: int) -> None:
    # units (case ids) with one key each, groups of different sizes, interleaved; some without keys
    units = [[f"u{i}"] for i in range(200)]
    rng = random.Random(nkeys)
    picks = rng.choices(range(nkeys), weights=range(1, nkeys + 1), k=len(units))  # groups of unequal sizes
    key_of = {u[0]: (None if i % 9 == 0 else ("fa4", picks[i])) for i, u in enumerate(units)}
    feed = WorkFeed(units, keys=lambda u: (key_of[u[0]],))
    taken = _drain(feed, workers, lambda n: list(range(n)))
    assert sorted(u[0] for _, u in taken) == sorted(u[0] for u in units)  # every unit exactly once
    first: dict = {}
    all_keys = {k for k in key_of.values() if k is not None}
    for n, (w, unit) in enumerate(taken):
        key = key_of[unit[0]]
        if key is None:
            continue
        unclaimed_left = all_keys - set(first)
        if key in first and first[key] != w:
            # a second worker on a claimed key only once every key has its worker
            assert not unclaimed_left, f"take {n}: worker {w} took {key} of worker {first[key]}"
        first.setdefault(key, w)
    assert set(first) == all_keys and feed.owner == first
    if len(all_keys) >= workers:
        assert len(set(first.values())) == workers  # every worker got a kernel of its own
    # a worker drains its own groups before it takes anything else
    for w in range(workers):
        mine = [key_of[u[0]] for ww, u in taken if ww == w and key_of[u[0]] is not None]
        runs = [k for k, _ in itertools.groupby(mine)]
        assert len(runs) == len(set(runs)) or nkeys < workers


def test_largest_unclaimed_group_first_then_keyless_then_fifo() -> None:
    units = [["a1"], ["b1"], ["b2"], ["n1"], ["b3"], ["a2"], ["c1"], ["n2"]]
    key = {"a": "A", "b": "B", "c": "C", "n": None}
    feed = WorkFeed(units, keys=lambda u: (key[u[0][0]],))
    assert feed.take(0) == ["b1"]  # B is the largest group
    assert feed.take(1) == ["a1"]  # B is held by 0: the next largest unclaimed (first seen on ties)
    assert feed.take(0) == ["b2"] and feed.take(0) == ["b3"]
    assert feed.take(2) == ["c1"]
    assert feed.take(2) == ["n1"]  # no unclaimed key left: units without keys first
    assert feed.take(0) == ["n2"]  # 0's groups are done: keyless
    assert feed.take(0) == ["a2"]  # then FIFO, though A is 1's
    assert feed.take(1) is None and len(feed) == 0


def test_a_unit_with_several_keys_gives_its_worker_all_of_them() -> None:
    units = [["x"], ["y"], ["z"]]
    keys = {"x": ("K1", "K2"), "y": ("K2",), "z": ("K1",)}
    feed = WorkFeed(units, keys=lambda u: keys[u[0]])
    assert feed.take(0) == ["x"] and feed.owner == {"K1": 0, "K2": 0}
    assert feed.take(0) == ["z"] and feed.take(0) == ["y"]


def test_feed_is_thread_safe_and_deterministic() -> None:
    units = [[i] for i in range(3000)]
    feed = WorkFeed(units, keys=lambda u: (u[0] % 17,))
    got: list[list] = [[] for _ in range(8)]

    def worker(w: int) -> None:
        while (unit := feed.take(w)) is not None:
            got[w].append(unit[0])

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(x for g in got for x in g) == list(range(3000))
    one = _drain(WorkFeed(units, keys=lambda u: (u[0] % 17,)), 4, lambda n: list(range(n)))
    two = _drain(WorkFeed(units, keys=lambda u: (u[0] % 17,)), 4, lambda n: list(range(n)))
    assert one == two


def test_worker_computes_compile_keys_for_the_parent(tmp_path: Path) -> None:
    spec, exact = f"{HERE}:KeyedBackend", "tests.conformance.fakes:ExactBackend"
    client = WorkerClient()
    try:
        described = client.request({"op": "describe", "backends": [spec, exact], "device": "cpu"}, timeout=60)
        assert described.data["jit"] == [spec]  # ExactBackend has no compile key
        cases = tiny_cases(2) + tiny_cases(1, head_dim=32) + tiny_cases(1, head_dim=64)
        reply = client.request(
            {"op": "keys", "backends": [spec], "cases": [c.to_json() for c in cases], "device": "cpu"}, timeout=60
        )
        assert reply.data["keys"] == [["('test', 16)"], ["('test', 16)"], [None], ["('test', 64)"]]  # 32: refused
    finally:
        client.close()


class UnavailableKeyedBackend(KeyedBackend):
    """KeyedBackend that is not installed here."""

    name = "test-keyed-absent"

    def is_available(self):
        from attnfast.base import Support

        return Support(False, "planted: not installed")


def test_an_unavailable_jit_backend_gets_no_compile_phase(tmp_path: Path) -> None:
    # On a GPU machine without FA4, `--backend fa4` made the compile phase try its 1,403 keys, each failing and
    # replacing a worker: 7.5 minutes before the first check.  An unavailable backend has no keys to compile.
    absent, keyed = f"{HERE}:UnavailableKeyedBackend", f"{HERE}:KeyedBackend"
    client = WorkerClient()
    try:
        described = client.request({"op": "describe", "backends": [absent, keyed], "device": "cpu"}, timeout=60)
        assert described.data["backends"][absent]["available"] == "no"
        assert described.data["jit"] == [keyed]
    finally:
        client.close()
    cases = tiny_cases(3) + tiny_cases(3, head_dim=64)
    summary, records = run_pool(tmp_path, (absent, "tests.conformance.fakes:ExactBackend"), cases)
    assert summary.compile is None  # no compile phase at all
    assert Counter(r.status for r in records if r.backend == "test-keyed-absent") == Counter({"unsupported": 6})


def test_a_pool_sweep_with_compile_keys_gives_the_records_of_one(tmp_path: Path) -> None:
    cases = tiny_cases(4) + tiny_cases(4, head_dim=64)
    summary, records = run_pool(tmp_path, (f"{HERE}:KeyedBackend", "tests.conformance.fakes:ExactBackend"), cases)
    assert summary.exit_code == 0 and summary.written == 16
    assert Counter((r.case_id, r.backend) for r in records) == Counter(
        {(c.id, b): 1 for c in cases for b in ("test-keyed", "fake-exact")}
    )


class KernelCudaErrorBackend(ExactBackend):
    """Its kernel call raises a CUDA error (not an OOM) on every case, as a sticky error an earlier call left behind
    does at the next call of the process."""

    name = "test-kernel-cuda-error"

    def prepare(self, case, inputs):
        def kernel():
            raise RuntimeError("CUDA error: an illegal instruction was encountered")

        return kernel


def test_a_kernel_cuda_error_names_the_workers_previous_pair(tmp_path: Path) -> None:
    # One worker, cases outer and backends inner: the faulting pair's previous pair is the same case on fake-exact,
    # and that is what the record names (the ledger audit's collateral reads it); no retry for the kernel's own step.
    backends = ("tests.conformance.fakes:ExactBackend", f"{HERE}:KernelCudaErrorBackend")
    summary, records = run_pool(tmp_path, backends, tiny_cases(2), jobs=1)
    errors = [r for r in records if r.backend == "test-kernel-cuda-error"]
    assert [r.status for r in errors] == [Status.ERROR, Status.ERROR]
    assert [r.extra["context_broken_after"] for r in errors] == [f"{r.case_id} fake-exact" for r in errors]
    assert all("harness_retry" not in r.extra for r in errors) and summary.harness_retries == 0
    assert all("context_broken_after" not in r.extra for r in records if r.backend == "fake-exact")
