"""Backward timing: the timer times a backward case's ``backward_only`` (and the whole training call beside it), the
roofline counts 2.5 x the forward FLOPs (3.5 x for the whole call) and the backward's own bytes."""

from __future__ import annotations

import json

import pytest
import torch

from conformance.cases.case import AttentionCase
from conformance.suites.perf import perf_backward_cases, perf_cases
from conformance.perf import timing as timing_module
from conformance.perf.roofline import PHASES, attention_bytes, attention_flops, backward_bytes, roofline
from conformance.perf.timing import make_timer
from conformance.records import CheckResult, Status, Timing

BWD = AttentionCase(
    requests=((300, 300), (77, 77)),
    num_heads=8,
    num_kv_heads=2,
    head_dim=64,
    causal=True,
    window=(127, 0),
    backward=True,
)


class Clock:
    """A host clock moved only by the simulated calls (exact, load-independent)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(timing_module, "_clock", fake)
    return fake


class TrainingCall:
    """A stand-in for the backward composition's callable: the whole call takes 3 ms, its backward alone 2 ms."""

    def __init__(self, clock: Clock, backward_only: bool = True) -> None:
        self.clock, self.calls, self.bwd_calls = clock, 0, 0
        if backward_only:
            self.backward_only = self._bwd
        else:
            self.backward_only = None

    def __call__(self):
        self.calls += 1
        self.clock.now += 3e-3

    def _bwd(self):
        self.bwd_calls += 1
        self.clock.now += 2e-3


OPTS = dict(warmup_s=0.0, min_reps=5, max_reps=5, target_s=0.0)


def test_backward_flops_are_phase_multiples_of_the_forward():
    fwd = attention_flops(BWD)
    assert fwd == attention_flops(BWD.replace(backward=False))  # windows and causality counted the same way
    for phase, factor in (("forward", 1.0), ("backward", 2.5), ("fwd+bwd", 3.5)):
        assert PHASES[phase] == factor
        assert roofline(BWD, 1.0, "NVIDIA H100 80GB HBM3", phase=phase)["flops"] == fwd * factor
    with pytest.raises(ValueError, match="phase must be one of"):
        roofline(BWD, 1.0, "cpu", phase="bwd")


def test_backward_bytes_by_hand():
    case = AttentionCase(requests=((10, 10),), num_heads=4, num_kv_heads=2, head_dim=8, causal=True, backward=True)
    item = 2  # bf16
    q = 10 * 4 * 8 * item
    kv = 10 * 2 * (8 + 8) * item  # k and v per kv head
    out = 10 * 4 * 8 * item
    lse = 4 * 10 * 4
    metadata = 2 * 2 * 4
    reads = q + kv + 2 * out + lse  # q, k, v, out, dout, lse
    writes = q + kv  # dq per query head, dk and dv per kv head
    assert backward_bytes(case) == reads + writes + metadata
    fig = roofline(case, 1.0, "cpu", phase="fwd+bwd")
    assert fig["bytes"] == attention_bytes(case, lse=True).total + backward_bytes(case)


def test_timer_times_backward_only_and_the_whole_call(clock):
    fn = TrainingCall(clock)
    t = make_timer("cpu", **OPTS)(BWD, fn)
    assert fn.bwd_calls >= 5 and fn.calls >= 5
    assert t.phase == "backward" and t.method.endswith(",backward-only")
    assert t.median_ms == pytest.approx(2.0) and t.fwd_bwd_ms == pytest.approx(3.0)
    assert t.flops == 2.5 * attention_flops(BWD)
    assert t.tflops == pytest.approx(2.5 * attention_flops(BWD) / 2e-3 / 1e12)
    assert t.bytes == backward_bytes(BWD)


def test_timer_without_backward_only_times_the_whole_call(clock):
    fn = TrainingCall(clock, backward_only=False)
    t = make_timer("cpu", **OPTS)(BWD, fn)
    assert fn.calls >= 5 and fn.bwd_calls == 0
    assert t.phase == "fwd+bwd" and t.fwd_bwd_ms is None and t.median_ms == pytest.approx(3.0)
    assert t.flops == 3.5 * attention_flops(BWD)
    assert "cannot rerun its backward alone" in t.note


def test_forward_case_ignores_backward_only(clock):
    fn = TrainingCall(clock)  # a forward case's callable is timed as it is, whatever it carries
    t = make_timer("cpu", **OPTS)(BWD.replace(backward=False), fn)
    assert fn.bwd_calls == 0 and t.phase == "forward" and t.fwd_bwd_ms is None
    assert t.flops == attention_flops(BWD)


def test_timing_phase_roundtrips_and_old_records_read_as_forward():
    t = Timing(median_ms=2.0, p20_ms=1.9, p80_ms=2.1, reps=5, method="m", phase="backward", fwd_bwd_ms=3.0)
    r = CheckResult(case_id="c", backend="b", family="f", status=Status.PASS, case=BWD.to_json(), timing=t)
    back = CheckResult.from_json(json.loads(json.dumps(r.to_json())))
    assert back.timing == t
    old = r.to_json()
    del old["timing"]["phase"], old["timing"]["fwd_bwd_ms"]  # a record written before backward timing
    assert CheckResult.from_json(old).timing.phase == "forward"


def _timed_check(device: str, backend: str, case: AttentionCase):
    from attnfast.registry import get_backend
    from conformance.verdict.check import check_backend, prepare_context

    timer = make_timer(device, warmup_s=0.0, min_reps=3, max_reps=3, target_s=0.0)
    ctx = prepare_context(case, device=device)
    return check_backend(ctx, get_backend(backend), timer=lambda fn: timer(case, fn))


TINY = AttentionCase(requests=((24, 24), (9, 9)), num_heads=4, num_kv_heads=2, head_dim=16, causal=True, backward=True)


def test_check_backend_times_the_backward_through_the_composition():
    """The real path: the backward composition's callable exposes the adapter's backward_only, and the timer uses it."""
    r = _timed_check("cpu", "sdpa-cpu", TINY)
    assert r.status is Status.PASS, r.reason
    assert r.timing is not None and r.timing.phase == "backward", r.extra.get("timing_error")
    assert r.timing.method.endswith("backward-only") and r.timing.fwd_bwd_ms > 0
    assert r.timing.flops == 2.5 * attention_flops(TINY)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (sdpa-cuda's backward)")
def test_cuda_backward_timing_reports_tflops_and_roofline():
    case = AttentionCase(requests=((2048, 2048),) * 2, num_heads=16, num_kv_heads=16, head_dim=128, causal=True)
    r = _timed_check("cuda", "sdpa-cuda", case.replace(backward=True))
    assert r.status is Status.PASS, r.reason
    t = r.timing
    assert t is not None and t.phase == "backward" and "cuda-events" in t.method
    assert t.tflops > 0 and t.fwd_bwd_ms > t.median_ms * 0.5
    if t.roofline_pct is not None:  # a device of the peak table
        assert 0 < t.roofline_pct <= 100


def test_perf_suite_backward_cases_have_forward_twins():
    cases = perf_cases()
    bwd = [c for c in cases if c.backward]
    assert bwd == perf_backward_cases() and len(bwd) >= 10
    ids = {c.id for c in cases}
    for c in bwd:
        assert c.replace(backward=False, deterministic=False).id in ids, c.id  # the report's fwd columns
    assert {c.head_dim for c in bwd} == {64, 128, 256}
    assert {c.requests[0][0] for c in bwd} == {4096, 8192, 16384}
    assert any(c.num_heads > c.num_kv_heads for c in bwd) and any(c.has_window for c in bwd)
    assert any(c.deterministic for c in bwd)
