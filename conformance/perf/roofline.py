"""Analytic work models of an attention case and the roofline they give with a measured time.

FLOPs: the two matrix products only, counted over the *visible* (query, key) pairs, i.e. the pairs
the mask rule of ``../shared/SEMANTICS.md`` section 2 lets through::

    flops = sum over requests of visible_pairs * num_heads * 2 * (d + dv)

(``2 d`` for the q.k multiply-adds of one pair, ``2 dv`` for its p.v ones; with an MLA-absorbed
``qv`` the score is ``q.k + qv.v``, so the first product is ``2 (d + dv)`` per pair).  Softmax, soft-cap,
ALiBi, sinks and masking are not counted: they are O(pairs) scalar work next to O(pairs * d)
matrix work, and no vendor counts them either.  Pairs are counted exactly, per request, in closed
form (or with one vectorised pass over the query rows for chunked local attention): never with a
``sq x sk`` mask, since the perf suite holds 32k x 32k prefills and 128k contexts.  Work the
kernels really do on masked-out parts of diagonal tiles is not useful work and is not counted.

Bytes: the fewest bytes a kernel must move through device memory, assuming ideal reuse: q (and ``qv``) read and
out written in their stored dtype (1 byte for fp8/int8), K and V read once per *kv* head over the union of the key
ranges each request's rows can see, an ``append``'s cache write, the metadata (lengths, block-table entries, ALiBi
slopes, sinks) and optionally the fp32 LSE write.  Backward (:data:`PHASES`): phase ``backward`` (the backward
alone) or ``fwd+bwd`` (the whole training call), at 2.5 and 3.5 times the forward FLOPs (flash-attn's convention);
its bytes are :func:`backward_bytes`.  Each term, the exact-count note against SEMANTICS section 6 and the
convention's source: ``docs/concepts/performance.md`` (*The work model*).

Peaks (:data:`PEAKS`) are datasheet numbers (dense, no sparsity) for 16-bit inputs, and for 8-bit
ones (fp8 q/k/v: both products run on fp8 tensor cores, 1979 TFLOP/s on an H100/H200 SXM); METHOD.md
calls them leads, so :func:`roofline` also reports the fraction of a *measured* copy bandwidth
(``conformance.perf.timing.measure_copy_bandwidth``) next to the spec one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from attnref import AttnOptions, Window, row_bounds

from conformance.cases.case import AttentionCase
from conformance.verdict.reference import case_options

__all__ = [
    "ByteModel",
    "PHASES",
    "backward_bytes",
    "Peak",
    "PEAKS",
    "attention_bytes",
    "attention_flops",
    "case_visible_pairs",
    "match_peak",
    "roofline",
    "union_span",
    "visible_pairs",
]


# ---------------------------------------------------------------------------- pair counting
def _clamped_prefix(x: int, n: int) -> int:
    """``sum(clamp(v, 0, n) for v in range(x))`` for x >= 0 (0 for x <= 0), in O(1)."""
    if x <= 0:
        return 0
    if x <= n + 1:
        return x * (x - 1) // 2
    return n * (n + 1) // 2 + (x - n - 1) * n


def _clamped_sum(a: int, m: int, n: int) -> int:
    """``sum(clamp(a + i, 0, n) for i in range(m))``: negative terms clamp to 0, so two prefixes."""
    return _clamped_prefix(a + m, n) - _clamped_prefix(a, n)


def _chunk_bounds(
    sq: int, sk: int, left: int | None, right: int | None, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Half-open per-row key bounds with a chunk (the one case without a closed form used here)."""
    return row_bounds(torch.arange(sq), sq, sk, AttnOptions(window=Window(left, right), chunk=chunk))


def visible_pairs(sq: int, sk: int, left: int | None = None, right: int | None = None, chunk: int | None = None) -> int:
    """Number of (row, key) pairs one request of ``sq`` queries over ``sk`` keys may see.

    Row ``i`` (diagonal position ``p = i + sk - sq``) sees ``[p - left, p + right]`` intersected
    with ``[0, sk)`` and, with a chunk, with ``[p - p mod chunk, p - p mod chunk + chunk)``;
    ``None`` means unbounded.  O(1) without a chunk, one vectorised O(sq) pass with one.
    """
    if sq <= 0 or sk <= 0:
        return 0
    if chunk is not None:
        lo, hi = _chunk_bounds(sq, sk, left, right, chunk)
        return int((hi - lo).clamp_min(0).sum())
    # Both clamped bounds are nondecreasing in i and p - left <= p + right + 1, so clamping keeps
    # hi_i >= lo_i and the count is sum(hi) - sum(lo), each a sum of a clamped arithmetic run.
    p0 = sk - sq
    hi_sum = sq * sk if right is None else _clamped_sum(p0 + right + 1, sq, sk)
    lo_sum = 0 if left is None else _clamped_sum(p0 - left, sq, sk)
    return hi_sum - lo_sum


def union_span(
    sq: int, sk: int, left: int | None = None, right: int | None = None, chunk: int | None = None
) -> tuple[int, int]:
    """Half-open range ``[lo, hi)`` of the keys that at least one row may see (``(0, 0)`` if none).

    Every non-empty row's range holds its own diagonal position or, for rows above the diagonal,
    key 0, and the bounds are nondecreasing in the row: so the union is one contiguous range from
    the first non-empty row's ``lo`` to the last row's ``hi``.
    """
    if sq <= 0 or sk <= 0:
        return 0, 0
    # Rows with p < 0 (sq > sk) see keys only when the right extent reaches key 0, never with a
    # chunk (their chunk ends at or before 0).
    if chunk is not None:
        first = max(0, sq - sk)
    elif right is None:
        first = 0
    else:
        first = max(0, sq - sk - right)
    if first >= sq:
        return 0, 0
    if chunk is None:
        p_first, p_last = first + sk - sq, sk - 1
        lo = 0 if left is None else min(max(p_first - left, 0), sk)
        hi = sk if right is None else min(max(p_last + right + 1, 0), sk)
        return lo, hi
    lo_t, hi_t = _chunk_bounds(sq, sk, left, right, chunk)
    return int(lo_t[first]), int(hi_t[-1])


def case_visible_pairs(case: AttentionCase) -> int:
    """Visible pairs summed over the requests of ``case`` (per head)."""
    opts = case_options(case)
    return sum(visible_pairs(sq, sk, opts.left, opts.right, opts.chunk) for sq, sk in case.requests)


#: What a timing measured -> its FLOPs per forward FLOP (see the module docstring).
PHASES: dict[str, float] = {"forward": 1.0, "backward": 2.5, "fwd+bwd": 3.5}


def attention_flops(case: AttentionCase) -> int:
    """Matrix-product FLOPs of the forward pass: visible pairs * h * 2 * (d + dv) (+ 2 dv with ``qv``)."""
    return case_visible_pairs(case) * case.num_heads * 2 * (case.qk_dim + case.dv)


def _itemsizes(case: AttentionCase) -> tuple[int, int, int]:
    """Bytes per element of the stored q (and qv), k and v of ``case``."""
    act = case.torch_dtype.itemsize
    if case.quant == "none":
        return act, act, act
    q = 1 if case.quant_q else act
    v = act if case.quant == "int8_t2" else 1
    return q, 1, v


# ---------------------------------------------------------------------------- bytes
@dataclass(frozen=True)
class ByteModel:
    """Minimum device-memory traffic of one call, by component (bytes)."""

    q: int
    out: int
    kv: int
    kv_append: int
    metadata: int
    lse: int

    @property
    def total(self) -> int:
        return self.q + self.out + self.kv + self.kv_append + self.metadata + self.lse


def attention_bytes(case: AttentionCase, *, lse: bool = False) -> ByteModel:
    """Bytes the kernel must move (see the module docstring for what is counted and why)."""
    item = case.torch_dtype.itemsize
    q_item, k_item, v_item = _itemsizes(case)
    h, hk, d, dv = case.num_heads, case.num_kv_heads, case.head_dim, case.dv
    opts = case_options(case)
    keys = 0
    table_entries = 0
    for sq, sk in case.requests:
        lo, hi = union_span(sq, sk, opts.left, opts.right, opts.chunk)
        keys += hi - lo
        if case.paged and hi > lo:
            bs = case.block_size or 1
            table_entries += (hi - 1) // bs - lo // bs + 1
    metadata = 2 * (case.batch + 1) * 4 + table_entries * 4
    metadata += h * 4 * (int(case.alibi) + int(case.sinks))
    return ByteModel(
        q=case.total_q * h * (d + (dv if case.qv else 0)) * q_item,
        out=case.total_q * h * dv * item,
        kv=keys * hk * (d * k_item + dv * v_item),
        kv_append=case.total_q * hk * (d + dv) * item if case.append else 0,
        metadata=metadata,
        lse=h * case.total_q * 4 if lse else 0,
    )


def backward_bytes(case: AttentionCase) -> int:
    """Bytes the backward kernel must move: q, k, v, out, dout and the fp32 LSE read; dq, dk, dv written (k, v,
    dk, dv over the keys' union, per kv head); the forward's metadata."""
    fwd = attention_bytes(case)
    item = case.torch_dtype.itemsize
    reads = fwd.q + fwd.kv + 2 * fwd.out + case.num_heads * case.total_q * 4
    writes = case.total_q * case.num_heads * case.head_dim * item + fwd.kv
    return reads + writes + fwd.metadata


def _phase_bytes(case: AttentionCase, phase: str, lse: bool) -> int:
    if phase == "forward":
        return attention_bytes(case, lse=lse).total
    if phase == "backward":
        return backward_bytes(case)
    return attention_bytes(case, lse=True).total + backward_bytes(case)


# ---------------------------------------------------------------------------- peaks and roofline
@dataclass(frozen=True)
class Peak:
    """Datasheet ceilings of one GPU: dense 16-bit (and 8-bit) tensor-core FLOP/s and HBM bandwidth."""

    tflops_16bit: float | None
    hbm_gbps: float | None
    source: str
    tflops_8bit: float | None = None


#: GPU name substring -> peaks, first match wins (specific names before general ones).  Names are
#: what ``torch.cuda.get_device_name`` reports ("NVIDIA H100 80GB HBM3", "NVIDIA H200").
PEAKS: dict[str, Peak] = {
    "H100 PCIe": Peak(756.0, 2000.0, "NVIDIA H100 datasheet, PCIe: 1513 TFLOP/s bf16 sparse, 2.0 TB/s", 1513.0),
    "H100 NVL": Peak(835.0, 3900.0, "NVIDIA H100 datasheet, NVL: 1671 TFLOP/s bf16 sparse, 3.9 TB/s", 1671.0),
    "H100 80GB HBM3": Peak(
        989.0, 3350.0, "NVIDIA H100 datasheet, SXM: 989 (fp8 1979) TFLOP/s dense, 3.35 TB/s", 1979.0
    ),
    "H100 SXM": Peak(989.0, 3350.0, "NVIDIA H100 datasheet, SXM: 989 (fp8 1979) TFLOP/s dense, 3.35 TB/s", 1979.0),
    "H200 NVL": Peak(835.0, 4800.0, "NVIDIA H200 datasheet, NVL: 1671 TFLOP/s bf16 sparse, 4.8 TB/s", 1671.0),
    "H200": Peak(989.0, 4800.0, "NVIDIA H200 datasheet, SXM: 989 (fp8 1979) TFLOP/s dense, 4.8 TB/s", 1979.0),
    "unknown": Peak(None, None, "no peak table entry for this device: roofline_pct disabled"),
}


def match_peak(gpu_name: str) -> tuple[str, Peak]:
    """The :data:`PEAKS` entry whose key occurs in ``gpu_name`` (first in table order), else ``unknown``."""
    for key, peak in PEAKS.items():
        if key != "unknown" and key.lower() in gpu_name.lower():
            return key, peak
    return "unknown", PEAKS["unknown"]


def roofline(
    case: AttentionCase,
    time_ms: float,
    gpu_name: str,
    measured_copy_gbps: float | None = None,
    *,
    lse: bool = False,
    phase: str = "forward",
) -> dict[str, Any]:
    """Achieved rates of ``case`` run in ``time_ms`` and their distance to the roofline.

    Returns a dict with ``flops``, ``bytes``, ``tflops``, ``gbps`` (achieved), ``bound``
    (``"compute"`` or ``"memory"``: the larger of the two floor times), ``roofline_pct`` (percent,
    0-100: the floor ``max(flops / peak_flops, bytes / peak_bw)`` over ``time_ms``), and
    ``pct_of_measured_bw`` (percent of ``measured_copy_gbps``, the achievable bandwidth), plus the
    peaks used (``gpu``, ``peak_tflops``, ``peak_gbps``, ``measured_copy_gbps``) and ``note`` saying
    why a figure is None.  fp32 cases get no compute peak: whether a kernel runs them on TF32
    tensor cores or on plain FP32 units changes the ceiling eightfold.

    ``phase`` (:data:`PHASES`): what ``time_ms`` measured, the forward (default), the backward alone or the whole
    training call; it scales the FLOPs and picks the byte model (:func:`backward_bytes`).
    """
    if not time_ms > 0:
        raise ValueError(f"time_ms must be positive, got {time_ms}")
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {list(PHASES)}, got {phase!r}")
    flops = attention_flops(case) * PHASES[phase]
    nbytes = _phase_bytes(case, phase, lse)
    seconds = time_ms * 1e-3
    key, peak = match_peak(gpu_name)
    notes = []
    peak_tflops = peak.tflops_16bit if case.dtype in ("bf16", "fp16") else None
    if case.quant_family == "fp8" and case.quant_q:  # both products on fp8 tensor cores
        peak_tflops = peak.tflops_8bit
    elif case.quant_family is not None:  # int8, or fp8 k/v with 16-bit q: the units depend on the kernel
        peak_tflops = None
    if key == "unknown":
        notes.append(f"no peak for device {gpu_name!r}")
    elif peak_tflops is None:
        notes.append(f"no {case.dtype}/{case.quant} compute peak (the units depend on the kernel)")
    bound = pct = None
    if peak_tflops is not None and peak.hbm_gbps is not None:
        t_compute = flops / (peak_tflops * 1e12)
        t_memory = nbytes / (peak.hbm_gbps * 1e9)
        bound = "compute" if t_compute >= t_memory else "memory"
        pct = 100.0 * max(t_compute, t_memory) / seconds
    gbps = nbytes / seconds / 1e9
    pct_bw = None
    if measured_copy_gbps:
        pct_bw = 100.0 * gbps / measured_copy_gbps
    else:
        notes.append("no measured copy bandwidth")
    return {
        "flops": float(flops),
        "bytes": float(nbytes),
        "tflops": flops / seconds / 1e12,
        "gbps": gbps,
        "bound": bound,
        "roofline_pct": pct,
        "pct_of_measured_bw": pct_bw,
        "gpu": key,
        "peak_tflops": peak_tflops,
        "peak_gbps": peak.hbm_gbps,
        "measured_copy_gbps": measured_copy_gbps,
        "note": "; ".join(notes),
        "phase": phase,
    }
