"""Which query rows of vLLM's FA3 fork see keys outside their sliding window: its window schedule, block by block.

vLLM 0.24.0's fork (:data:`FA3_VLLM_WINDOW_SOURCE`) moves the key pointer of each query tile to the start of its
window: ``block.h`` computes ``n_offset = max(0, m_idx_min + seqlen_k - seqlen_q - window_left)`` and shrinks
``seqlen_k`` by it; key tiles and masks then work in those shifted coordinates.  The sm_90 forward mainloop
(``mainloop_fwd_sm90_tma_gmma_ws.hpp``) masks the first key tile it visits exactly, then splits the rest at
``A = (m_idx_min + seqlen_k - seqlen_q + window_right) / kBlockN`` and ``B = ceil_div(m_idx_max + seqlen_k -
seqlen_q - window_left, kBlockN)``: tiles ``>= A`` get the window mask, tiles in ``[B, A)`` none, tiles ``< B`` the
window mask again.  Its intra-warpgroup-overlap path (lines 1283-1310) computes A and B with
``seqlen_info.tot_seqlen_k``, the *unshifted* key count, where the other path (lines 1399-1415) uses the shifted one.
Once ``n_offset > 0``, A is too large by about ``n_offset / kBlockN`` tiles, so tiles that straddle a row's right
window edge run unmasked: every key of such a tile *right of* the row's window (under causal: after its diagonal)
enters its softmax, output and LSE.  (B is too large as well, which only masks tiles that needed no mask: no key is
lost and none added on the left.)  Every window call takes that path except head dim 64 in bf16/fp16 (192 x 160,
no overlap: :func:`attnfast.decisions.fa3_vllm_tile_size_sm90`); fp8 d64 (192 x 128) takes it.  The fork's commit
a8937124 ("Fix local attention") fixed the same shift in ``block.h`` only.

:func:`fa3_vllm_window_schedule` reproduces that schedule for the adapter's call of a case: the fork's window
normalisation and tiles (:func:`~attnfast.decisions.fa3_vllm_call_mask`, :func:`~attnfast.decisions.fa3_vllm_fwd_tile`),
GQA packing and the per-request split count of its varlen planner (:func:`fa3_vllm_request_splits`), each split's
share of the key tiles (``get_n_block_min_max``), and which of them run unmasked; :func:`fa3_vllm_window_rows` counts
the (row, query head) pairs whose keys differ from their window (the ledger field ``fa3_window_unmasked_rows``).
Checked against the kernel on an H100 (``reports/h100-2026-11-27-windows/README.md``: 120 cases, the kernel's wrong
rows inside the model's, its LSE within its own rounding of float64 over the model's keys) and against every
committed fa3-vllm record with a window (``reports/h100-2026-11-27-peers/triage.md``).  Pure Python and numpy (the
rows' true windows from :mod:`attnref`'s rule), no kernel import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from attnref import AttnOptions, Window, row_bounds
from conformance.cases.case import AttentionCase

from .decisions import fa3_num_splits_heuristic, fa3_vllm_call_mask, fa3_vllm_fwd_tile

__all__ = [
    "FA3_VLLM_WINDOW_SOURCE",
    "NUM_SMS",
    "RequestSchedule",
    "WindowSchedule",
    "fa3_vllm_request_splits",
    "fa3_vllm_window_rows",
    "fa3_vllm_window_schedule",
    "window_bounds",
]

#: the fork's commit (vLLM 0.24.0's pin) and the files the schedule is read from; unchanged at the fork's head
FA3_VLLM_WINDOW_SOURCE = (
    "vllm-project/flash-attention 803020a8 hopper/block.h, mainloop_fwd_sm90_tma_gmma_ws.hpp (1283-1310 overlap, "
    "1399-1415 other), flash_prepare_scheduler.cu (143-164), flash_api.cpp (468-501, 1034-1040)"
)

#: SMs of the H100 SXM every committed fa3-vllm run used (the H200's count is the same)
NUM_SMS = 132


def _tdiv(a: int, b: int) -> int:
    """C++ integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _cdiv(a: int, b: int) -> int:
    """``cute::ceil_div`` on ints: ``(a + b - 1) / b`` with C++ division."""
    return _tdiv(a + b - 1, b)


def fa3_vllm_request_splits(case: AttentionCase) -> tuple[int, bool, tuple[int, ...]]:
    """``(num_splits, pack_gqa, per-request splits)`` of the fork's call of ``case`` (a varlen call, at most 992
    requests): ``get_num_splits`` (``flash_api.cpp`` 468-501, batch counted as 1;
    :func:`~attnfast.decisions.fa3_num_splits_heuristic`) unless the case pins a count, ``pack_gqa`` (1034-1040 with
    ``FLASHATTENTION_PACKGQA_ONLY``), the planner's per-request count (``prepare_varlen_num_blocks_kernel``:
    ``blocks_per_sm = ceil(total_blocks * 1.1 * heads / num_sm)``, a request gets ``min(ceil(n_blocks /
    blocks_per_sm), num_splits)``).  Checked against every committed record's ``fa3_num_splits`` (the most any
    request got) with a window."""
    call = case.padded_v_call()
    is_causal, is_local, wl, wr = fa3_vllm_call_mask(call)
    bm, bn, _ = fa3_vllm_fwd_tile(call)
    group = call.num_heads // call.num_kv_heads
    max_q, max_k = max(call.q_lens), max(call.kv_lens)
    if call.num_splits:
        static = call.num_splits
    else:
        loaded = max(0, min(max_k, wr + wl + 1 + bm)) if is_local else max_k
        nmb = -(-(max_q * group) // bm)
        kv_bytes = max_k * (call.head_dim + call.dv) * (1 if call.quant == "fp8_e4m3" else 2)
        total_mblocks = call.num_kv_heads * nmb
        static = fa3_num_splits_heuristic(
            total_mblocks, NUM_SMS, -(-loaded // bn), nmb, kv_bytes, is_causal or is_local, 128
        )
    paged_non_tma = call.paged and is_local  # only calls with a window are modelled: never the TMA pager
    pack = paged_non_tma or static > 1 or group > 1 or call.head_dim == call.dv
    if static == 1:
        return static, pack, (1,) * call.batch
    mblocks = [-(-(q * (group if pack else 1)) // bm) for q in call.q_lens]
    nblocks = [-(-k // bn) for k in call.kv_lens]
    total = sum(m * n for m, n in zip(mblocks, nblocks))
    heads = call.num_kv_heads if pack else call.num_heads
    per_sm = math.ceil(float(np.float32(total) * np.float32(1.1) * np.float32(heads) / np.float32(NUM_SMS)))
    return static, pack, tuple(max(min(-(-n // per_sm), static), 1) if per_sm > 0 else 1 for n in nblocks)


def window_bounds(case: AttentionCase, b: int) -> tuple[np.ndarray, np.ndarray]:
    """Half-open keys ``[lo, hi)`` (int64) each row of request ``b`` sees under the case's causal flag and window
    alone, the reference's rule (:func:`attnref.row_bounds`): row i sees key j iff ``i + sk - sq - left <= j <= i +
    sk - sq + right``, right 0 under causal, a missing side unbounded.  No chunk, no context parallelism: the calls
    the schedule models have neither."""
    sq, sk = case.requests[b]
    lo, hi = row_bounds(torch.arange(sq), sq, sk, AttnOptions(causal=case.causal, window=Window(*case.window)))
    return lo.numpy(), hi.numpy()


@dataclass
class RequestSchedule:
    """One request.  ``extra_left`` / ``extra_right`` / ``missing``: per (row, head of the GQA group), the keys the
    kernel adds left and right of the row's window and the window keys it never visits (all 0 on a right row);
    ``unmasked``: each run of key tiles the kernel runs without a mask, ``(first unit, end unit, first key, end
    key)`` (units are packed rows ``row * group + head`` when the schedule is ``packed``, else rows, every head
    alike)."""

    extra_left: np.ndarray
    extra_right: np.ndarray
    missing: np.ndarray
    unmasked: list[tuple[int, int, int, int]] = field(default_factory=list)


@dataclass
class WindowSchedule:
    """The fork's schedule of one call: its tile, path, GQA packing, splits, window, and each request's rows."""

    block_m: int
    block_n: int
    overlap: bool
    packed: bool
    num_splits: int
    request_splits: tuple[int, ...]
    window: tuple[int, int]
    kv_heads: int
    requests: list[RequestSchedule] = field(default_factory=list)

    def wrong(self) -> list[np.ndarray]:
        """Per request, the (q_len, group) rows whose keys differ from their window (the same under every kv
        head)."""
        return [(r.extra_left + r.extra_right + r.missing) > 0 for r in self.requests]

    def totals(self) -> dict[str, int]:
        """Counts of (row, query head) pairs over every kv head, and the most keys a row gains."""
        reqs, kh = self.requests, self.kv_heads
        return {
            "wrong_rows": kh * int(sum(w.sum() for w in self.wrong())),
            "rows_extra_right": kh * int(sum((r.extra_right > 0).sum() for r in reqs)),
            "rows_extra_left": kh * int(sum((r.extra_left > 0).sum() for r in reqs)),
            "rows_missing": kh * int(sum((r.missing > 0).sum() for r in reqs)),
            "max_extra_keys": max([int((r.extra_left + r.extra_right).max(initial=0)) for r in reqs] or [0]),
        }

    def describe(self) -> dict[str, Any]:
        return {
            "tile": f"{self.block_m}x{self.block_n}",
            "intra_wg_overlap": self.overlap,
            "pack_gqa": self.packed,
            "num_splits": self.num_splits,
            "request_splits_max": max(self.request_splits),
            "kernel_window": list(self.window),
            **self.totals(),
        }


def _modelled(case: AttentionCase) -> bool:
    """A plain forward call (not context parallel, chunked, appending, q_v, an engine step, a graph, an invariance
    or a backward): the calls the schedule is read for."""
    if case.cp_world > 1 or case.chunk is not None or case.append or case.qv:
        return False
    return not (case.engine or case.graph or case.invariance or case.backward)


def fa3_vllm_window_schedule(case: AttentionCase, correct_bounds: bool = False) -> WindowSchedule | None:
    """The fork's window schedule for its call of ``case``; None where the call has no window (the fork's
    ``is_local`` is false: nothing to model) or is not a plain forward call.  ``correct_bounds``: A and B from the
    shifted key count on every path, as the fork's other path computes them (the control: it finds no row)."""
    if not _modelled(case):
        return None
    call = case.padded_v_call()
    _, is_local, wl, wr = fa3_vllm_call_mask(call)
    if not is_local:
        return None
    bm, bn, overlap = fa3_vllm_fwd_tile(call)
    static, pack, per_request = fa3_vllm_request_splits(call)
    group = call.num_heads // call.num_kv_heads
    packed = pack and group > 1
    out = WindowSchedule(bm, bn, overlap, packed, static, per_request, (wl, wr), call.num_kv_heads)
    for b in range(call.batch):
        splits = per_request[b] if static > 1 else 1
        out.requests.append(_request(call, b, (bm, bn), (wl, wr), overlap and not correct_bounds, packed, splits))
    return out


def _tdiv_np(a: np.ndarray, b: int) -> np.ndarray:
    """:func:`_tdiv` elementwise (``b > 0``)."""
    return np.sign(a) * (np.abs(a) // b)


def _request(
    call: AttentionCase,
    b: int,
    tile_mn: tuple[int, int],
    window: tuple[int, int],
    unshifted: bool,
    packed: bool,
    splits: int,
) -> RequestSchedule:
    """Request ``b`` of the kernel call, every query tile at once (arrays over query tiles, then over units):
    ``tile_mn`` is ``(kBlockM, kBlockN)``, ``window`` the fork's ``(window_left, window_right)``, ``splits`` the
    request's split count; ``unshifted``: A and B from ``tot_seqlen_k`` (the overlap path), else from the shifted
    key count."""
    (bm, bn), (wl, wr) = tile_mn, window
    sq, sk = call.requests[b]
    group = call.num_heads // call.num_kv_heads
    lo, hi = window_bounds(call, b)
    units = sq * group if packed else sq
    m = np.arange(-(-units // bm), dtype=np.int64)  # query tiles (m_block)
    r0, r1 = m * bm, np.minimum((m + 1) * bm, units)
    m_min = r0 // group if packed else r0
    m_max = ((m + 1) * bm - 1) // group + 1 if packed else (m + 1) * bm
    off = np.maximum(0, m_min + sk - sq - wl)  # block.h: n_offset
    sk_s = sk - off
    nb_end = np.minimum(_tdiv_np(sk_s + bn - 1, bn), _tdiv_np(m_max + sk_s - sq + wr + bn - 1, bn))
    tot = sk if unshifted else sk_s  # the overlap path reads tot_seqlen_k
    u = np.arange(units, dtype=np.int64)
    tile = u // bm
    rows = u // group if packed else u
    tlo, thi = lo[rows], hi[rows]
    seen, xl, xr = (np.zeros(units, dtype=np.int64) for _ in range(3))
    runs = []  # per split: (runs of unmasked tiles exist, first key, end key), arrays over query tiles
    for s in range(splits):
        nb_min, nb_max = np.zeros_like(nb_end), nb_end
        if splits > 1:  # Split: get_n_block_min_max's share of this split
            per = np.where(nb_end <= 0, 0, _tdiv_np(nb_end + splits - 1, splits))
            nb_min, nb_max = s * per, np.minimum(s * per + per, nb_end)
        visits = nb_max > nb_min
        v0, v1 = (off + nb_min * bn)[tile], (off + np.minimum(nb_max * bn, sk_s))[tile]
        seen += np.where(visits[tile], np.clip(np.minimum(thi, v1) - np.maximum(tlo, v0), 0, None), 0)
        # the last tile (visited first) is masked; below it the tiles in [B, A) run unmasked
        a = np.maximum(nb_min, _tdiv_np(m_min + tot - sq + wr, bn))
        b_ = np.maximum(nb_min, _tdiv_np(m_max + tot - sq - wl + bn - 1, bn))
        n1 = np.minimum(a, nb_max - 1)
        k0, k1 = off + b_ * bn, off + np.minimum(n1 * bn, sk_s)
        run = visits & (b_ < n1) & (k0 < k1)
        runs.append((run, k0, k1))
        if run.any():
            ok, u0, u1 = run[tile], k0[tile], k1[tile]
            xl += np.where(ok, np.clip(np.minimum(tlo, u1) - u0, 0, None), 0)
            xr += np.where(ok, np.clip(u1 - np.maximum(thi, u0), 0, None), 0)
    miss = np.clip(thi - tlo, 0, None) - seen
    shape = (sq, group)
    out = RequestSchedule(np.zeros(shape, np.int64), np.zeros(shape, np.int64), np.zeros(shape, np.int64))
    if packed:
        heads = u % group
        out.extra_left[rows, heads], out.extra_right[rows, heads], out.missing[rows, heads] = xl, xr, miss
    else:
        out.extra_left[:], out.extra_right[:], out.missing[:] = xl[:, None], xr[:, None], miss[:, None]
    for t, s in zip(*np.nonzero(np.stack([run for run, _, _ in runs], axis=1))):  # tile-major, as the kernel
        _, k0, k1 = runs[s]
        out.unmasked.append((int(r0[t]), int(r1[t]), int(k0[t]), int(k1[t])))
    return out


def fa3_vllm_window_rows(case: AttentionCase) -> int:
    """The (row, query head) pairs, over every kv head, of the fork's call of ``case`` whose keys differ from their
    window under :func:`fa3_vllm_window_schedule` (keys right of the window, in key tiles the overlap mainloop runs
    unmasked); 0 where the call has no window or is not modelled."""
    sch = fa3_vllm_window_schedule(case)
    return 0 if sch is None else sch.totals()["wrong_rows"]
