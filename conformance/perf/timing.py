"""The one timing method of the harness (STYLE item 9): every kernel time comes from :func:`measure`.

Method on CUDA, recorded with each number as ``cuda-events,l2-flush-read,warmup-time,launch-cover`` (plus
``cuda-graph`` when the call is replayed from a graph):

* **CUDA events** around each call, on the current stream;
* **warm-up by time**: the callable runs until ``warmup_s`` has passed and at least twice before anything is timed
  (JIT compilation, module loading, handle creation stay out); the first call is left out of the per-call estimate;
* **repetitions** adding up to about ``target_s`` within ``[min_reps, max_reps]``; the **median** with p20/p80;
* **L2 flushed** before every call, outside the timed region, by *reading* a buffer of ``max(4 * L2, 256 MiB)``;
* **launch cover** (``launch-cover``): the stream sleeps :data:`LAUNCH_COVER_US` after the flush and before the start
  event, so the host's launch path is never timed;
* **CUDA graph** (``cuda_graph=True``): the call captured once and ``graph.replay()`` timed; a failed capture times
  the eager call and records why in :attr:`TimingSample.note` and the method string (``cuda-graph-failed``);
* **backward** (a case with ``backward``): the composition's training call; its ``backward_only`` is timed where it
  offers one (phase ``backward``, tag ``backward-only``, the whole call too in
  :attr:`~conformance.records.Timing.fwd_bwd_ms`), else the whole call (phase ``fwd+bwd``;
  :data:`conformance.perf.roofline.PHASES`).

On CPU the same warm-up, repetition and statistics rules apply with ``time.perf_counter`` around each call (method
``perf-counter,warmup-time``); there is no flush.  Why each rule is what it is (a read not a write, four times the
L2, the launch cover's measured effect, the RNG after a failed capture): ``docs/concepts/performance.md`` (*The
timing method, in detail*).
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from conformance.cases.case import AttentionCase
from conformance.records import Timing
from conformance.perf.roofline import roofline

__all__ = ["TimingSample", "measure", "measure_copy_bandwidth", "make_timer", "summarize"]

_MIN_FLUSH_BYTES = 256 * 2**20

#: Host clock of the CPU method and of the warm-up (a module attribute so tests can use a fake clock).
_clock: Callable[[], float] = time.perf_counter


@dataclass(frozen=True)
class TimingSample:
    """Statistics of the timed calls (milliseconds) and how they were taken."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    reps: int
    method: str
    warmup_calls: int = 0
    note: str = ""
    times_ms: tuple[float, ...] = field(default=(), repr=False)


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of sorted values (numpy's default rule)."""
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(times_ms: Sequence[float]) -> tuple[float, float, float]:
    """(median, p20, p80) of ``times_ms``."""
    if not times_ms:
        raise ValueError("times_ms must hold at least one time")
    ordered = sorted(times_ms)
    return _quantile(ordered, 0.5), _quantile(ordered, 0.2), _quantile(ordered, 0.8)


def _warmup(call: Callable[[], object], warmup_s: float, sync: Callable[[], None]) -> list[float]:
    """Run ``call`` until ``warmup_s`` has passed and at least twice; wall seconds of each call."""
    durations: list[float] = []
    start = _clock()
    while len(durations) < 2 or _clock() - start < warmup_s:
        t0 = _clock()
        call()
        sync()
        durations.append(_clock() - t0)
    return durations


def _choose_reps(warmup_durations: list[float], target_s: float, min_reps: int, max_reps: int) -> int:
    # The first warm-up call carries compilation and first-touch costs; later ones estimate a call.
    later = sorted(warmup_durations[1:]) or warmup_durations
    per_call = max(later[len(later) // 2], 1e-9)
    return max(min_reps, min(max_reps, math.ceil(target_s / per_call)))


def _check(warmup_s: float, min_reps: int, max_reps: int, target_s: float) -> None:
    if warmup_s < 0 or target_s < 0:
        raise ValueError(f"warmup_s and target_s must be >= 0, got {warmup_s}, {target_s}")
    if not 1 <= min_reps <= max_reps:
        raise ValueError(f"need 1 <= min_reps <= max_reps, got min_reps={min_reps}, max_reps={max_reps}")


def measure(
    fn: Callable[[], object],
    *,
    device: str | torch.device,
    warmup_s: float = 0.1,
    min_reps: int = 10,
    max_reps: int = 1000,
    target_s: float = 0.5,
    flush_l2: bool = True,
    cuda_graph: bool = False,
) -> TimingSample:
    """Time ``fn`` (a zero-argument callable) on ``device`` by the method of the module docstring.

    Args:
        fn: runs only the work to time; it must be idempotent (it is called many times).
        device: where ``fn`` runs ("cpu", "cuda", "cuda:1").
        warmup_s: warm-up duration; at least two calls are made however small it is.
        min_reps, max_reps: bounds on the number of timed calls.
        target_s: the timed calls add up to about this much.
        flush_l2: read a buffer larger than L2 before each call (CUDA only).
        cuda_graph: time replays of a CUDA graph of ``fn`` (CUDA only; eager fallback on failure).
    """
    _check(warmup_s, min_reps, max_reps, target_s)
    dev = torch.device(device)
    if dev.type == "cuda":
        return _measure_cuda(fn, dev, warmup_s, min_reps, max_reps, target_s, flush_l2, cuda_graph)
    if dev.type == "cpu":
        note = "cuda_graph ignored on cpu" if cuda_graph else ""
        return _measure_cpu(fn, warmup_s, min_reps, max_reps, target_s, note)
    raise ValueError(f"device must be cpu or cuda, got {device!r}")


def _measure_cpu(
    fn: Callable[[], object], warmup_s: float, min_reps: int, max_reps: int, target_s: float, note: str
) -> TimingSample:
    durations = _warmup(fn, warmup_s, lambda: None)
    reps = _choose_reps(durations, target_s, min_reps, max_reps)
    times = []
    for _ in range(reps):
        t0 = _clock()
        fn()
        times.append((_clock() - t0) * 1e3)
    med, p20, p80 = summarize(times)
    return TimingSample(med, p20, p80, reps, "perf-counter,warmup-time", len(durations), note, tuple(times))


def _flush_buffer(dev: torch.device) -> torch.Tensor:
    l2 = int(torch.cuda.get_device_properties(dev).L2_cache_size)
    nbytes = max(4 * l2, _MIN_FLUSH_BYTES)
    # float32 so the reduction reads at full width; ones, not zeros, so nothing can skip the read.
    return torch.ones(nbytes // 4, dtype=torch.float32, device=dev)


def _capture(fn: Callable[[], object]) -> tuple[torch.cuda.CUDAGraph | None, str]:
    """Capture ``fn`` once on a side stream; (graph, "") or (None, reason)."""
    caller = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(caller)
    try:
        # One eager call on the capture stream first: libraries create per-stream handles and
        # workspaces lazily, and creating them inside a capture is illegal.
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            fn()
    except Exception as exc:  # any capture failure falls back to eager timing, with its reason
        # torch.cuda.graph's __exit__ skips restoring the stream when capture_end raises.
        torch.cuda.set_stream(caller)
        torch.cuda.synchronize()
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return None, f"cuda-graph capture failed: {type(exc).__name__}: {first_line}"[:300]
    torch.cuda.synchronize()
    return graph, ""


#: GPU time the stream is held before each timed call, so the host's launch path is never timed.
LAUNCH_COVER_US = 400.0


def _launch_cover_cycles(dev: torch.device) -> int:
    """Cycles of ``torch.cuda._sleep`` for :data:`LAUNCH_COVER_US` (the SM clock, 2 GHz if unknown)."""
    khz = getattr(torch.cuda.get_device_properties(dev), "clock_rate", 0) or 2_000_000
    return int(LAUNCH_COVER_US * khz / 1000)


def _measure_cuda(
    fn: Callable[[], object],
    dev: torch.device,
    warmup_s: float,
    min_reps: int,
    max_reps: int,
    target_s: float,
    flush_l2: bool,
    cuda_graph: bool,
) -> TimingSample:
    with torch.cuda.device(dev):
        sync = torch.cuda.synchronize
        durations = _warmup(fn, warmup_s, sync)
        warmup_calls = len(durations)
        call: Callable[[], object] = fn
        tags = ["cuda-events"]
        note = ""
        if cuda_graph:
            graph, note = _capture(fn)
            if graph is not None:
                call = graph.replay
                durations = _warmup(call, warmup_s, sync)
                warmup_calls += len(durations)
                tags.append("cuda-graph")
            else:
                tags.append("cuda-graph-failed")
        flush = _flush_buffer(dev) if flush_l2 else None
        if flush is not None:
            tags.append("l2-flush-read")
        tags.append("warmup-time")
        reps = _choose_reps(durations, target_s, min_reps, max_reps)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        cover = _launch_cover_cycles(dev)
        tags.append("launch-cover")
        for i in range(reps):
            if flush is not None:
                flush.sum()  # outside the events: evicts the previous call's lines, leaves L2 clean
            torch.cuda._sleep(cover)  # keeps the stream busy while the host launches `call`
            starts[i].record()
            call()
            ends[i].record()
        sync()
        times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
        del flush
    med, p20, p80 = summarize(times)
    return TimingSample(med, p20, p80, reps, ",".join(tags), warmup_calls, note, tuple(times))


def measure_copy_bandwidth(device: str | torch.device, nbytes: int = 2**30) -> float:
    """Achievable memory bandwidth in GB/s: a device-to-device copy of ``nbytes`` timed by :func:`measure`.

    Counts bytes read plus bytes written (2 * nbytes), as METHOD.md asks; measured once per run and
    used as the practical ceiling next to the datasheet one (3.0 TB/s measured on an H100, 4.3 on an
    H200, SEMANTICS section 6).  The source holds random bytes, never zeros.
    """
    if nbytes <= 0:
        raise ValueError(f"nbytes must be positive, got {nbytes}")
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(0)
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=dev, generator=gen)
    dst = torch.empty_like(src)
    sample = measure(lambda: dst.copy_(src), device=dev, warmup_s=0.05, min_reps=5, max_reps=200, target_s=0.2)
    return 2 * nbytes / (sample.median_ms * 1e-3) / 1e9


_MEASURE_OPTS = ("warmup_s", "min_reps", "max_reps", "target_s", "flush_l2", "cuda_graph")
_TIMER_OPTS = ("gpu_name", "copy_gbps", "measure_bandwidth", "lse")


CaseTimer = Callable[[AttentionCase, Callable[[], object]], Timing]


def make_timer(device: str | torch.device, **opts: Any) -> CaseTimer:
    """A ``timer(case, fn) -> Timing`` that measures ``fn`` and adds the roofline figures of ``case``.

    Options: those of :func:`measure` (``warmup_s``, ``min_reps``, ``max_reps``, ``target_s``,
    ``flush_l2``, ``cuda_graph``), plus ``gpu_name`` (default: the device's name, "cpu" on CPU),
    ``copy_gbps`` (a bandwidth measured elsewhere), ``measure_bandwidth`` (default True: on CUDA,
    measure the copy bandwidth at the first call and reuse it for every later one) and ``lse``
    (count the LSE write in the bytes, default False).

    Every field of :class:`~conformance.records.Timing` is filled: the measured statistics and
    method, flops, bytes, tflops, gbps, roofline_pct (percent), bound, pct_of_measured_bw,
    measured_copy_gbps, and the timing's and the roofline's notes.
    """
    unknown = sorted(set(opts) - set(_MEASURE_OPTS) - set(_TIMER_OPTS))
    if unknown:
        raise TypeError(f"unknown timer options {unknown}; known: {sorted(_MEASURE_OPTS + _TIMER_OPTS)}")
    dev = torch.device(device)
    measure_opts = {k: opts[k] for k in _MEASURE_OPTS if k in opts}
    defaults = inspect.signature(measure).parameters
    # fail at creation, not mid-run
    _check(**{k: measure_opts.get(k, defaults[k].default) for k in ("warmup_s", "min_reps", "max_reps", "target_s")})
    gpu_name = opts.get("gpu_name") or (torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type)
    lse = bool(opts.get("lse", False))
    # The bandwidth is a property of the run, not of a case: measured at most once per timer.
    bandwidth: dict[str, float | None] = {"gbps": opts.get("copy_gbps")}
    want_bandwidth = dev.type == "cuda" and bool(opts.get("measure_bandwidth", True))

    def timer(case: AttentionCase, fn: Callable[[], object]) -> Timing:
        phase, fwd_bwd_ms, tag = "forward", None, ""
        backward_only = getattr(fn, "backward_only", None) if case.backward else None
        if backward_only is not None:
            phase, tag = "backward", ",backward-only"
            fwd_bwd_ms = measure(fn, device=dev, **measure_opts).median_ms
            sample = measure(backward_only, device=dev, **measure_opts)
        else:
            phase = "fwd+bwd" if case.backward else "forward"
            sample = measure(fn, device=dev, **measure_opts)
        if want_bandwidth and bandwidth["gbps"] is None:
            bandwidth["gbps"] = _copy_bandwidth_or_none(dev)
        figures = roofline(case, sample.median_ms, gpu_name, bandwidth["gbps"], lse=lse, phase=phase)
        notes = [sample.note, figures["note"]]
        if phase == "fwd+bwd":
            notes.append("the adapter cannot rerun its backward alone: forward + backward timed together")
        return Timing(
            median_ms=sample.median_ms,
            p20_ms=sample.p20_ms,
            p80_ms=sample.p80_ms,
            reps=sample.reps,
            method=sample.method + tag,
            flops=figures["flops"],
            bytes=figures["bytes"],
            tflops=figures["tflops"],
            gbps=figures["gbps"],
            roofline_pct=figures["roofline_pct"],
            bound=figures["bound"],
            pct_of_measured_bw=figures["pct_of_measured_bw"],
            measured_copy_gbps=figures["measured_copy_gbps"],
            note="; ".join(n for n in notes if n),
            phase=phase,
            fwd_bwd_ms=fwd_bwd_ms,
        )

    return timer


def _copy_bandwidth_or_none(dev: torch.device) -> float | None:
    """Copy bandwidth with 1 GiB, or 256 MiB when memory is short; None if even that fails."""
    for nbytes in (2**30, 2**28):
        try:
            return measure_copy_bandwidth(dev, nbytes)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
    return None
