"""Classification: any :class:`~conformance.cases.case.AttentionCase` bucketed to the nearest level of every axis
of the case space (:mod:`conformance.cases.space` re-exports these names), so coverage can be measured on any
suite and fuzz failures grouped by axis values.  ``classify(build(p)) == p`` for every valid full point ``p``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from functools import lru_cache
from typing import Any

from conformance.cases.case import AttentionCase
from conformance.cases.fields import SPEC
from conformance.cases.space_axes import _BLOCK_SIZES, _DV_GT_D, _DV_LT_D, AXES, EQUAL_DIMS, HEADS
from conformance.cases.space_axes import Point

__all__ = [
    "classify",
    "classify_append",
    "classify_batch",
    "classify_dims",
    "classify_heads",
    "classify_mask",
    "describe",
]


def classify_batch(requests: tuple[tuple[int, int], ...]) -> str:
    """Batch-shape level of a request list (rules in order; the first that matches wins):
    any kv_len 0 -> empty-kv; all (1, 1) -> single-token; some q_len > kv_len -> cross if another request has
    q_len < kv_len else sq>sk; all q_len == kv_len -> prefill (several) / prefill-single; all q_len 1 ->
    decode; decodes with longer queries -> mixed-decode-first when the decodes come first (or the first request
    is one), else mixed-decode-last; one q_len 2..16 for all -> spec-decode; else chunked."""
    reqs = tuple(requests)
    if any(k == 0 for _, k in reqs):
        return "empty-kv"
    if all(r == (1, 1) for r in reqs):
        return "single-token"
    if any(q > k for q, k in reqs):
        return "cross" if any(q < k for q, k in reqs) else "sq>sk"
    if all(q == k for q, k in reqs):
        return "prefill" if len(reqs) > 1 else "prefill-single"
    if all(q == 1 for q, _ in reqs):
        return "decode"
    if any(q == 1 for q, _ in reqs):
        is_dec = [q == 1 for q, _ in reqs]
        decodes_first = is_dec == sorted(is_dec, reverse=True)
        decodes_last = is_dec == sorted(is_dec)
        if decodes_first or (not decodes_last and is_dec[0]):
            return "mixed-decode-first"
        return "mixed-decode-last"
    qs = {q for q, _ in reqs}
    if len(qs) == 1 and 2 <= next(iter(qs)) <= 16:
        return "spec-decode"
    return "chunked"


#: Head-count bands of the GQA levels: a count belongs to the nearest anchor on a log scale (ties to the smaller),
#: so 8-22 q heads are narrow, 23-45 the 32 band (Llama 4's 40 included), 46-90 the 64 band, 91 and up 128.
_BANDS = (16, 32, 64, 128)


def _log_distance(a: int, b: int) -> float:
    return abs(math.log2(a) - math.log2(b))


def _band(h: int) -> int:
    return min(_BANDS, key=lambda anchor: (_log_distance(h, anchor), anchor))


def _kind(h: int, hk: int) -> str:
    return "mha" if h == hk else ("mqa" if hk == 1 else "gqa")


def _pow2(x: int) -> bool:
    return x & (x - 1) == 0


@lru_cache(maxsize=4096)  # pure: a suite asks about the same few values again and again
def classify_heads(num_heads: int, num_kv_heads: int) -> str:
    """Heads level.  MHA (equal counts) and MQA (one kv head): the level of that kind with the nearest q head
    count (log scale, ties to the smaller: mha 8, h32-mha, h128-mha; mqa 8, h128-mqa).  GQA: among the GQA
    levels of the count's band (:data:`_BANDS`), the one of the same ratio kind (a power of two or not) with the
    nearest ratio (log scale, ties to the smaller): narrow counts give gqa2 / gqa4 / gqa8 (8 and above) and gqa3
    (any ratio that is not a power of two), the 64 band h64-gqa8 / h64-gqa16, and so on."""
    h, hk = num_heads, num_kv_heads
    kind = _kind(h, hk)
    levels = {name: hh for name, hh in HEADS.items() if _kind(*hh) == kind}
    if kind != "gqa":
        return min(levels, key=lambda n: (_log_distance(levels[n][0], h), levels[n][0]))
    band = _band(h)
    in_band = {n: hh for n, hh in levels.items() if _band(hh[0]) == band}
    ratio = h // hk

    def key(name: str) -> tuple[bool, float, int]:
        r = in_band[name][0] // in_band[name][1]
        return _pow2(r) != _pow2(ratio), _log_distance(r, ratio), r

    return min(in_band, key=key)


@lru_cache(maxsize=4096)  # pure: a suite asks about the same few values again and again
def classify_dims(head_dim: int, head_dim_v: int) -> tuple[int, int]:
    """Dims level: equal dims -> the nearest equal-dims level (ties to the smaller); head_dim_v < head_dim -> the
    nearer of 192/128 and 576/512 (summed log distance of both dims, ties to the first); head_dim_v > head_dim ->
    64/512."""
    if head_dim_v == head_dim:
        d = min(EQUAL_DIMS, key=lambda x: (abs(x - head_dim), x))
        return (d, d)
    levels = _DV_LT_D if head_dim_v < head_dim else _DV_GT_D
    return min(levels, key=lambda lv: _log_distance(lv[0], head_dim) + _log_distance(lv[1], head_dim_v))


def classify_mask(causal: bool, window: tuple[int | None, int | None], chunk: int | None) -> str:
    """Mask level: chunk -> cchunk64 / chunk64 (with causal or not); causal with a left window -> cw128,
    otherwise causal; without causal: no window -> none, (0, 0) -> w0-0, (l, 0) -> w16-0, left and right
    bounded -> w32-32, left only -> w64-inf, right only -> winf-16."""
    left, right = window
    if chunk is not None:
        return "cchunk64" if causal else "chunk64"
    if causal:
        return "cw128" if left is not None else "causal"
    if left is None and right is None:
        return "none"
    if left is None:
        return "winf-16"
    if right is None:
        return "w64-inf"
    if left == 0 and right == 0:
        return "w0-0"
    if right == 0:
        return "w16-0"
    return "w32-32"


def classify_append(case: AttentionCase) -> bool | str:
    """Append level: no append -> False; a short append (``append_len`` set) -> short, whatever its quantization, and
    so is an uneven one (``append_lens``: the axis has no level of its own for it, bucketed with the appends of other
    than ``q_len`` new keys); an append of every query token -> fp8 with a quantized cache (the case model allows fp8
    only), else True."""
    if not case.append:
        return False
    if case.append_len is not None or case.append_lens:
        return "short"
    return True if case.quant == "none" else "fp8"


@lru_cache(maxsize=4096)  # pure: a suite asks about the same few values again and again
def _nearest_block(bs: int) -> int:
    return min(_BLOCK_SIZES, key=lambda x: (abs(math.log2(x) - math.log2(bs)), x))


def classify(case: AttentionCase) -> dict[str, Hashable]:
    """The level of every axis for any AttentionCase (bucketed to the nearest level; see the classify_* rules), in
    :data:`AXES` order.  An axis named after a case field (:func:`~conformance.cases.space_axes.field_axis`) takes
    the level its row's ``level`` gives (:data:`~conformance.cases.fields.SPEC`).

    Engine fields are not an axis; the call an engine replay makes is classified by its other fields."""
    special: dict[str, Hashable] = {
        "batch": classify_batch(case.requests),
        "heads": classify_heads(case.num_heads, case.num_kv_heads),
        "dims": classify_dims(case.head_dim, case.dv),
        "layout": case.kv_layout,
        "block_size": None if case.block_size is None else _nearest_block(case.block_size),
        "mask": classify_mask(case.causal, case.window, case.chunk),
        "append": classify_append(case),
        "cp": (1, 0) if case.cp_world == 1 else (2, 1),
    }
    return {name: special[name] if name in special else SPEC[name].level_of(case) for name in AXES}


def describe(point: Point) -> str:
    """``axis=value`` pairs, for messages and groupings."""
    return ", ".join(f"{a}={_fmt(v)}" for a, v in point.items())


def _fmt(value: Any) -> str:
    if isinstance(value, tuple):
        return "/".join(str(x) for x in value)
    return str(value)
