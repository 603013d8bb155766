"""The timing method: statistics, repetition and warm-up rules on CPU; events, flush and graphs on CUDA."""

from __future__ import annotations

import math
import time

import pytest
import torch

from conformance.cases.case import AttentionCase
from conformance.records import Timing
from conformance.perf.roofline import attention_bytes, attention_flops, match_peak
from conformance.perf import timing as timing_module
from conformance.perf.timing import make_timer, measure, measure_copy_bandwidth, summarize

CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA device (timing with CUDA events)")


def sleeper(ms: float):
    return lambda: time.sleep(ms / 1e3)


class FakeClock:
    """A host clock that only moves when a simulated call says so: exact, load-independent timings."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def call(self, durations_s):
        """A callable taking the next of ``durations_s`` (seconds) each time; records each call."""
        it = iter(durations_s)
        self.calls = 0

        def fn() -> None:
            self.now += next(it)
            self.calls += 1

        return fn


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(timing_module, "_clock", fake)
    return fake


def test_summarize_interpolates_like_numpy():
    med, p20, p80 = summarize([float(x) for x in (10, 1, 9, 2, 8, 3, 7, 4, 6, 5)])
    assert (med, p20, p80) == pytest.approx((5.5, 2.8, 8.2))
    assert summarize([4.0]) == (4.0, 4.0, 4.0)
    with pytest.raises(ValueError):
        summarize([])


def test_cpu_statistics_of_known_durations(clock):
    # warm-up takes the first two calls (warmup_s=0); the ten timed ones are 1..10 ms
    fn = clock.call([0.5, 0.5] + [ms / 1e3 for ms in (10, 1, 9, 2, 8, 3, 7, 4, 6, 5)])
    s = measure(fn, device="cpu", warmup_s=0.0, min_reps=10, max_reps=10)
    assert s.warmup_calls == 2 and s.reps == 10 and clock.calls == 12
    assert (s.median_ms, s.p20_ms, s.p80_ms) == pytest.approx((5.5, 2.8, 8.2))
    assert sorted(s.times_ms) == pytest.approx([float(x) for x in range(1, 11)])
    assert s.method == "perf-counter,warmup-time"


def test_cpu_percentiles_split_a_bimodal_callable(clock):
    fn = clock.call([0.001, 0.008] * 100)  # alternating: any 10 consecutive calls hold five of each
    s = measure(fn, device="cpu", warmup_s=0.0, min_reps=10, max_reps=10)
    assert s.p20_ms == pytest.approx(1.0) and s.p80_ms == pytest.approx(8.0)
    assert s.median_ms == pytest.approx(4.5)  # halfway between the 5th (short) and 6th (long) values


def test_min_reps_honoured_when_target_is_tiny(clock):
    s = measure(clock.call([0.001] * 100), device="cpu", warmup_s=0.0, min_reps=7, max_reps=100, target_s=0.0)
    assert s.reps == 7


def test_max_reps_honoured_when_calls_are_fast(clock):
    s = measure(clock.call([1e-6] * 100), device="cpu", warmup_s=0.0, min_reps=3, max_reps=50, target_s=10.0)
    assert s.reps == 50


def test_reps_chosen_to_fill_target(clock):
    # powers of two keep the fake clock exact: 2^-4 s of 2^-9 s calls is 32 calls
    fn = clock.call([2.0**-9] * 100)
    s = measure(fn, device="cpu", warmup_s=0.0, min_reps=2, max_reps=1000, target_s=2.0**-4)
    assert s.reps == 32
    assert math.fsum(s.times_ms) == pytest.approx(1e3 * 2.0**-4)


def test_warmup_runs_by_time_and_stops_at_the_first_call_past_it(clock):
    # 2^-8 s calls, 2^-5 s of warm-up: the 8th call reaches it exactly, so 8 warm-up calls
    s = measure(clock.call([2.0**-8] * 100), device="cpu", warmup_s=2.0**-5, min_reps=3, max_reps=3)
    assert s.warmup_calls == 8 and clock.calls == 8 + 3


def test_warmup_is_at_least_two_calls(clock):
    s = measure(clock.call([10.0] * 10), device="cpu", warmup_s=0.001, min_reps=1, max_reps=1)
    assert s.warmup_calls == 2  # the first call alone already exceeds warmup_s


def test_slow_first_call_does_not_set_the_rep_count(clock):
    # a JIT-compiling first call of 0.25 s, then 2^-10 s calls: 2^-5 s of target is 32 calls
    fn = clock.call([0.25] + [2.0**-10] * 100)
    s = measure(fn, device="cpu", warmup_s=0.0, min_reps=1, max_reps=1000, target_s=2.0**-5)
    assert s.reps == 32
    assert s.median_ms == pytest.approx(1e3 * 2.0**-10)


def test_real_sleep_is_never_under_its_duration():
    s = measure(sleeper(3.0), device="cpu", warmup_s=0.0, min_reps=5, max_reps=5)
    assert 3.0 <= s.p20_ms <= s.median_ms <= s.p80_ms  # sleep never returns early; overshoot is load


def test_invalid_arguments():
    with pytest.raises(ValueError, match="min_reps"):
        measure(lambda: None, device="cpu", min_reps=5, max_reps=4)
    with pytest.raises(ValueError, match="device"):
        measure(lambda: None, device="meta")
    with pytest.raises(TypeError, match="unknown timer options"):
        make_timer("cpu", flush=True)


def _case() -> AttentionCase:
    return AttentionCase(requests=((64, 64), (1, 200)), num_heads=4, num_kv_heads=2, head_dim=32, causal=True)


def test_make_timer_fills_timing_with_flops_and_rates():
    case = _case()
    timing = make_timer("cpu", warmup_s=0.0, target_s=0.02)(case, sleeper(1.0))
    assert isinstance(timing, Timing)
    assert timing.flops == attention_flops(case)
    assert timing.bytes == attention_bytes(case).total
    assert timing.tflops == pytest.approx(timing.flops / (timing.median_ms * 1e-3) / 1e12)
    assert timing.gbps == pytest.approx(timing.bytes / (timing.median_ms * 1e-3) / 1e9)
    assert timing.roofline_pct is None and timing.bound is None  # no peak for "cpu"
    assert timing.method.startswith("perf-counter")
    assert timing.p20_ms <= timing.median_ms <= timing.p80_ms


def test_make_timer_with_a_named_gpu_computes_roofline():
    case = _case()
    timing = make_timer("cpu", warmup_s=0.0, target_s=0.01, gpu_name="NVIDIA H200")(case, sleeper(1.0))
    assert timing.bound == "memory"
    _, peak = match_peak("NVIDIA H200")
    floor_s = timing.bytes / (peak.hbm_gbps * 1e9)
    assert timing.roofline_pct == pytest.approx(100 * floor_s / (timing.median_ms * 1e-3))


def test_copy_bandwidth_on_cpu_is_positive():
    gbps = measure_copy_bandwidth("cpu", nbytes=2**22)
    assert math.isfinite(gbps) and gbps > 0.1
    with pytest.raises(ValueError):
        measure_copy_bandwidth("cpu", nbytes=0)


# ---------------------------------------------------------------------------- CUDA
@pytest.mark.gpu
@gpu
def test_cuda_events_time_a_sleep_kernel_linearly():
    short = measure(lambda: torch.cuda._sleep(1_000_000), device="cuda", target_s=0.1)
    long = measure(lambda: torch.cuda._sleep(2_000_000), device="cuda", target_s=0.1)
    assert "cuda-events" in short.method and "l2-flush-read" in short.method and "warmup-time" in short.method
    assert short.p20_ms <= short.median_ms <= short.p80_ms
    assert 1.7 < long.median_ms / short.median_ms < 2.3


@pytest.mark.gpu
@gpu
def test_l2_flush_makes_a_cache_sized_read_slower():
    x = torch.randn(8 * 2**20, device="cuda")  # 32 MiB: fits in the L2 of an H100 (50 MB) or H200 (60 MB)
    warm = measure(lambda: x.sum(), device="cuda", flush_l2=False, target_s=0.1)
    cold = measure(lambda: x.sum(), device="cuda", flush_l2=True, target_s=0.1)
    assert "l2-flush" not in warm.method
    assert cold.median_ms > 1.15 * warm.median_ms, (cold, warm)


@pytest.mark.gpu
@gpu
def test_cuda_graph_replay_and_fallback():
    x = torch.randn(1024, 1024, device="cuda")
    graphed = measure(lambda: (x @ x).relu_(), device="cuda", cuda_graph=True, target_s=0.05)
    assert "cuda-graph" in graphed.method and "failed" not in graphed.method and graphed.note == ""
    # .item() synchronises with the host, which a capture cannot hold: eager fallback with a reason.
    # In a subprocess: after a failed capture torch 2.11 leaves the CUDA RNG unusable for the process
    # ("Offset increment outside graph capture encountered unexpectedly", seen on an H200).
    code = (
        "import torch; from conformance.perf.timing import measure\n"
        "x = torch.randn(1024, 1024, device='cuda')\n"
        "f = measure(lambda: x.sum().item(), device='cuda', cuda_graph=True, target_s=0.05)\n"
        "assert 'cuda-graph-failed' in f.method and 'capture failed' in f.note and f.median_ms > 0, f\n"
    )
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.gpu
@gpu
def test_copy_bandwidth_is_below_and_near_spec():
    key, peak = match_peak(torch.cuda.get_device_name())
    if peak.hbm_gbps is None:
        pytest.skip(f"no peak bandwidth for {torch.cuda.get_device_name()}")
    gbps = measure_copy_bandwidth("cuda")
    assert 0.5 * peak.hbm_gbps < gbps < 1.02 * peak.hbm_gbps, (key, gbps)


@pytest.mark.gpu
@gpu
def test_make_timer_on_cuda_fills_roofline():
    case = AttentionCase(requests=((2048, 2048),), num_heads=8, num_kv_heads=8, head_dim=128, causal=True)
    q = torch.randn(1, 8, 2048, 128, device="cuda", dtype=torch.bfloat16)
    fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)  # noqa: E731
    timing = make_timer("cuda", target_s=0.1)(case, fn)
    assert timing.flops == attention_flops(case) and timing.tflops > 1.0
    if match_peak(torch.cuda.get_device_name())[0] != "unknown":
        assert timing.bound == "compute" and 0 < timing.roofline_pct < 100
