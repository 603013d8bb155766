"""Kernel timings of the ``perf`` suite through the adapters, against the roofline (CUDA only).

One benchmark per (perf case, backend).  The kernel call is the adapter's prepared callable, timed
by :func:`conformance.perf.timing.make_timer` (CUDA events, L2 flushed, warm-up by time, median with
p20/p80); the figures land in ``extra_info`` so ``--benchmark-json`` keeps them with each case id.
"""

from __future__ import annotations

import dataclasses
import gc

import pytest
import torch
from pytest_benchmark.fixture import BenchmarkFixture

from conformance.cases.case import AttentionCase
from conformance.cases.inputs import make_inputs
from conformance.suites.registry import get_suite
from conformance.perf.timing import make_timer
from conformance.records import Timing

PERF = get_suite("perf")


@pytest.mark.gpu
@pytest.mark.parametrize("case", PERF, ids=[c.id for c in PERF])
def test_bench_kernel(
    benchmark: BenchmarkFixture,
    backend_name: str | None,
    case: AttentionCase,
    copy_gbps: float | None,
    request: pytest.FixtureRequest,
) -> None:
    if backend_name is None:
        pytest.skip("no backend to benchmark: pass --bench-backend NAME or set ATTNCONF_BENCH_BACKENDS=a,b")
    if not torch.cuda.is_available():
        pytest.skip("kernel benchmarks need a CUDA device; this machine has none")
    from attnfast.registry import get_backend

    backend = get_backend(backend_name)  # an unknown name is a usage error: ValueError lists the names
    available = backend.is_available()
    if not available:
        pytest.skip(f"{backend_name} not available: {available.reason}")
    support = backend.supports(case, "cuda")
    if not support:
        pytest.skip(f"{backend_name} does not support {case.id}: {support.reason}")
    inputs = make_inputs(case, seed=0, device="cuda")
    try:
        fn = backend.prepare(case, inputs)
        graph = request.config.getoption("bench_cuda_graph")
        timer = make_timer("cuda", copy_gbps=copy_gbps, cuda_graph=graph)
        timing: Timing = benchmark.pedantic(timer, args=(case, fn), rounds=1, iterations=1, warmup_rounds=0)
    finally:
        del inputs
        gc.collect()
        torch.cuda.empty_cache()  # the perf cases hold GBs; free them before the next case's inputs
    benchmark.extra_info.update(
        backend=backend_name,
        version=backend.version(),
        case_id=case.id,
        summary=case.summary(),
        gpu=torch.cuda.get_device_name(),
        copy_gbps=copy_gbps,
        **dataclasses.asdict(timing),
    )
    assert timing.median_ms > 0 and timing.tflops is not None and timing.tflops > 0
