"""CPU benchmark of the reference (``attnref`` through :func:`conformance.verdict.reference.reference`).

Runs everywhere, so the ``bench`` session measures something on a CPU-only machine too; the
number tracks the reference's own speed (a slow reference makes the conformance suites slow).
"""

from __future__ import annotations

import dataclasses

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from conformance.cases.case import AttentionCase
from conformance.cases.inputs import make_inputs
from conformance.verdict.reference import reference
from conformance.perf.timing import make_timer
from conformance.records import Timing

CASES = [
    AttentionCase(
        requests=((256, 256), (1, 300), (64, 512)),
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        causal=True,
        batch_name="mix3",
    ),
    AttentionCase(
        requests=((1, 1024),) * 4,
        num_heads=8,
        num_kv_heads=1,
        head_dim=128,
        causal=True,
        kv_layout="NHD",
        block_size=16,
        batch_name="dec4x1k",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.batch_name for c in CASES])
def test_bench_reference_cpu(benchmark: BenchmarkFixture, case: AttentionCase) -> None:
    inputs = make_inputs(case, seed=0, device="cpu")
    timer = make_timer("cpu", warmup_s=0.2, min_reps=3, max_reps=50, target_s=1.0)
    timing: Timing = benchmark.pedantic(timer, args=(case, lambda: reference(case, inputs)), rounds=1, iterations=1)
    benchmark.extra_info.update(case_id=case.id, summary=case.summary(), **dataclasses.asdict(timing))
    assert timing.median_ms > 0 and timing.flops is not None and timing.flops > 0
    assert timing.tflops is not None and timing.tflops > 0
