"""The names a ledger predicate may test: the case's fields and values derived from them.

Every name maps to a typed getter over an :class:`~conformance.cases.case.AttentionCase`; a ledger condition on a
name not listed here is a load-time error (a typo must not silently match nothing).  ``attnconf ledger fields``
prints the list.  Three kinds:

* the case's own scalar fields (``head_dim``, ``causal``, ``block_size``, ``qv``, ``scale``, ...); tuple fields are
  offered through scalars instead (``window_left`` / ``window_right``, ``max_kv_len``, ...);
* generic derived values (``dv``, ``paged``, ``rows_without_keys``, ...);
* what a kernel makes of the case, computed by the adapter module's own helpers so the ledger and the adapter
  cannot disagree: ``fa4_sm90_tile_n`` / ``fa4_sm90_paged_loader`` (:mod:`attnfast.fa4`), ``fa2_entry`` /
  ``fa2_window_misread`` (:mod:`attnfast.fa2`, :mod:`attnfast._fa_common`), ``fa3_hdim_template``,
  ``fa3_one_mma_wg_switch`` and ``fa3_keyless_m_block`` (vLLM's FA3 fork's kernel choice and tiles, read from its
  source: :mod:`attnfast.decisions`), ``fa3_window_unmasked_rows`` (the fork's window schedule:
  :mod:`attnfast.fa3_vllm_window`).

A value is ``None`` where it does not apply (``block_size`` of a contiguous case, ``scale`` left to the kernel).
A field describing what one kernel call does holds when some call of the case does (an invariance case's variants).

Size: one concept, the ledger's field table: a row and, for a derived value, its getter per field.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from conformance.cases.case import AttentionCase
from conformance.cases.fields import SPEC

__all__ = ["FIELDS", "Field", "CaseView", "case_view"]


@dataclass(frozen=True)
class Field:
    """One testable name: its value type (``int``, ``float``, ``bool``, ``str``), whether it may be None, what it is."""

    kind: str
    help: str
    get: Callable[[AttentionCase], Any]
    nullable: bool = False


@lru_cache(maxsize=4096)  # several derived fields of one record ask for the same request's bounds
def _visible_bounds(case: AttentionCase, b: int) -> tuple[np.ndarray, np.ndarray]:
    """Half-open visible key bounds ``[lo, hi)`` of every query row of request ``b``: the reference's rule
    (:func:`attnref.row_bounds`, SEMANTICS.md section 2) with the case's options and, under context parallelism, the
    per-sequence totals its inputs carry (:func:`conformance.cases.inputs.cp_case_totals`).  Cached: the arrays
    returned are shared, and read-only."""
    import torch

    from attnref import ContextParallel, row_bounds
    from conformance.cases.inputs import cp_case_totals
    from conformance.verdict.reference import case_options

    sq, sk = case.requests[b]
    options = case_options(case)
    if case.cp_world > 1:
        options = options.with_(cp=ContextParallel(case.cp_world, case.cp_rank, cp_case_totals(case)[b]))
    lo, hi = (t.numpy() for t in row_bounds(torch.arange(sq), sq, sk, options))
    lo.flags.writeable = hi.flags.writeable = False
    return lo, hi


def _rows_without_keys(case: AttentionCase) -> int:
    total = 0
    for b in range(case.batch):
        lo, hi = _visible_bounds(case, b)
        total += int(np.count_nonzero(lo >= hi))
    return total


def _fa2_seqlen_k(case: AttentionCase) -> int:
    """The ``seqlen_k`` FA2 normalises the window against: ``max_seqlen_k`` for varlen, the cache width for kvcache
    (as attnfast.fa2 builds the call: attnfast._fa_common.kvcache_caches, with the width the adapter asks for,
    attnfast.fa2.fa2_kvcache_min_width)."""
    from attnfast.fa2 import VARLEN, fa2_entry, fa2_kvcache_min_width

    if fa2_entry(case) == VARLEN:
        return max(case.kv_lens)
    min_width = fa2_kvcache_min_width(case)
    if not case.paged:
        return max(max(case.kv_lens), min_width)  # min_width >= 1: a cache is at least one key wide
    bs = case.block_size
    assert bs is not None  # set exactly when paged
    cols = max(max(1, -(-n // bs)) for n in case.kv_lens)
    cols = max(cols, -(-min_width // bs))
    return cols * bs


def _calls(case: AttentionCase) -> list[AttentionCase]:
    """The kernel calls a case makes: its own, or for an invariance case each of its variants'
    (:func:`conformance.graphs.invariance.variants`: request 0 alone, beside shorter requests, ...), whose requests
    differ from the case's.  A field describing what one call does (rows without keys, say) holds when some call
    does: the verdict judges every call's output (a batch invariance's "beside shorter requests" cuts the
    neighbours' keys, down to none)."""
    if not case.invariance:
        return [case]
    from conformance.graphs.invariance import variants

    return [v.case for v in variants(case)]


def _keyless_query_tile(case: AttentionCase) -> int:
    """The largest T of 128, 64, ..., 1 such that some request of some call (:func:`_calls`) has an aligned tile of T
    query rows (cut at the request's end) in which no row sees a key; 0 when every row sees one."""
    return max(_call_keyless_query_tile(call) for call in _calls(case))


def _call_keyless_query_tile(case: AttentionCase) -> int:
    best = 0
    for b in range(case.batch):
        lo, hi = _visible_bounds(case, b)
        empty = lo >= hi
        keyless = (
            t
            for t in (128, 64, 32, 16, 8, 4, 2, 1)
            if any(empty[i * t : (i + 1) * t].all() for i in range(-(-len(empty) // t)))
        )
        best = max(best, next(keyless, 0))
    return best


def _fa3_keyless_m_block(case: AttentionCase) -> bool:
    """Whether, in some call of the case (:func:`_calls`), some query tile of the FA3 fork's forward sees no key at
    all (:func:`_call_fa3_keyless_m_block`)."""
    return any(_call_fa3_keyless_m_block(call) for call in _calls(case))


def _call_fa3_keyless_m_block(case: AttentionCase) -> bool:
    """Whether some query tile of the FA3 fork's forward sees no key at all: ``kBlockM`` rows of one request (the
    fork's tile for the call, :func:`attnfast.decisions.fa3_vllm_fwd_tile`: 192 at head dims 64 and 96, 64 for a
    one-MMA-warpgroup call, else 128), or with a GQA group of g heads packed into the tile (PackGQA) rows
    ``M t // g .. (M t + M - 1) // g``.  Such a tile's key range is empty (``get_n_block_min_max``), the kernel skips
    it and writes LSE -inf without the sink; a keyless row that shares its tile with rows that see keys gets the
    sink."""
    from attnfast.decisions import fa3_vllm_fwd_tile

    g = case.num_heads // case.num_kv_heads
    block_m = fa3_vllm_fwd_tile(case)[0]
    for b in range(case.batch):
        lo, hi = _visible_bounds(case, b)
        empty = lo >= hi
        for tile in range(-(-len(empty) * g // block_m)):
            start = tile * block_m  # the packed rows start .. start + block_m - 1, cut at the request's end
            if empty[start // g : (start + block_m - 1) // g + 1].all():
                return True
    return False


def _fa3_window_unmasked_rows(case: AttentionCase) -> int:
    """(row, query head) pairs of the FA3 fork's call that see keys outside their window: the key tiles its
    intra-warpgroup-overlap mainloop runs unmasked once the window moves the key pointer
    (:func:`attnfast.fa3_vllm_window.fa3_vllm_window_rows`; 0 without a window or for a call it does not model)."""
    from attnfast.fa3_vllm_window import fa3_vllm_window_rows

    return fa3_vllm_window_rows(case)


def _keys_left_of_window(case: AttentionCase) -> int:
    """The most keys a row's window leaves out on its left (0 without a bounded left side)."""
    if case.window[0] is None:  # context parallelism has no window (AttentionCase refuses one)
        return 0
    most = 0
    for b in range(case.batch):
        lo, hi = _visible_bounds(case, b)
        # no mutate: a row without keys has lo = 0 (its position is below key 0, or the request has no keys), so
        # counting it too (lo <= hi) changes no maximum
        keyed = lo < hi  # pragma: no mutate
        if len(lo):
            most = max(most, int(np.max(np.where(keyed, lo, 0))))
    return most


def _window_misread(case: AttentionCase, seqlen_k: int) -> bool:
    """Whether FA2's window normalisation against ``seqlen_k`` (attnfast._fa_common.fa2_kernel_window: a side >=
    seqlen_k becomes unbounded, then an unbounded side becomes seqlen_k, both ignoring the offset sk - sq;
    flash-attention issue 895) changes the keys some row sees."""
    from attnfast._fa_common import fa2_kernel_window, fa2_window

    if not case.has_window:
        return False
    k_left, k_right = fa2_kernel_window(case.causal, fa2_window(case), seqlen_k)
    window = (None if k_left < 0 else k_left, None if k_right < 0 else k_right)
    # no mutate: the kernel's window as a plain window; keeping the case's causal reads the same bounds (FA2 sets a
    # causal call's right side to 0 already, fa2_kernel_window) and causal=None reads as False
    kernel = case.replace(window=window, causal=False)  # pragma: no mutate
    for b in range(case.batch):
        lo, hi = _visible_bounds(case, b)
        klo, khi = _visible_bounds(kernel, b)
        empty, kempty = lo >= hi, klo >= khi
        if np.any(empty != kempty) or np.any(~empty & ((lo != klo) | (hi != khi))):
            return True
    return False


def _fa2_window_misread(case: AttentionCase) -> bool:
    return _window_misread(case, _fa2_seqlen_k(case))


def _fa2_varlen_window_misread(case: AttentionCase) -> bool:
    return _window_misread(case, max(case.kv_lens))


def _fa2_entry(case: AttentionCase) -> str:
    from attnfast.fa2 import VARLEN, fa2_entry

    return "varlen" if fa2_entry(case) == VARLEN else "kvcache"


def _fa4_tile_n(case: AttentionCase) -> int:
    from attnfast.fa4 import fa4_sm90_tile_n

    return fa4_sm90_tile_n(case.padded_v_call())


def _fa4_paged_loader(case: AttentionCase) -> str:
    if not case.paged:
        return "contiguous"
    return "tma" if case.block_size == _fa4_tile_n(case) else "non_tma"


def _fa3_hdim_template(case: AttentionCase) -> int:
    """FA3's compiled head-dim template for the call: ``round_up_headdim`` of hopper/flash_api.cpp
    (Dao-AILab/flash-attention; vLLM's fork has the same function): 64, 96, 128, 192 or 256."""
    d = case.padded_v_call().head_dim
    return next((t for t in (64, 96, 128, 192) if d <= t), 256)


def _fa3_one_mma_wg(call: AttentionCase) -> bool:
    """Whether FA3's sm_90 forward runs the call on one MMA warpgroup (a 64-row query tile): ``use_one_mma_wg`` of
    vLLM's fork (hopper/heuristics.h): head dim 128 and ``max_seqlen_q`` times the packed GQA group at most 64 (a
    varlen call packs the group whenever it has one)."""
    # no mutate: a case's num_heads is a multiple of num_kv_heads (AttentionCase refuses others), so / gives // exactly
    group = call.num_heads // call.num_kv_heads  # pragma: no mutate
    return call.head_dim == 128 and max(call.q_lens) * group <= 64


def _fa3_one_mma_wg_switch(case: AttentionCase) -> bool:
    """Whether the calls of a batch-invariance case (conformance.graphs.invariance.variants: request 0 alone, in
    its batch, ...) fall on both sides of :func:`_fa3_one_mma_wg`, so FA3 runs two different kernels on request 0."""
    if case.invariance not in ("batch", "neighbour"):
        return False
    from conformance.graphs.invariance import variants

    return len({_fa3_one_mma_wg(v.case) for v in variants(case)}) > 1


def _fa3_group_rows_switch(case: AttentionCase) -> bool:
    """Whether the calls of a batch or neighbour invariance fall on both sides of ``max_seqlen_q x GQA group <= 64``
    (the packed query rows of the longest request fit one 64-row tile), at any head dim: measured to decide FA3's
    d64 batch invariance (a neighbour growing from 9 to 10 query tokens at group 7)."""
    if case.invariance not in ("batch", "neighbour"):
        return False
    from conformance.graphs.invariance import variants

    # no mutate: a case's num_heads is a multiple of num_kv_heads (AttentionCase refuses others), so / gives // exactly
    group = case.num_heads // case.num_kv_heads  # pragma: no mutate
    return len({max(v.case.q_lens) * group <= 64 for v in variants(case)}) > 1


def _invariance_max_q_len_varies(case: AttentionCase) -> bool:
    """Whether the calls of an invariance case (conformance.graphs.invariance.variants) differ in their longest
    q_len (a batch invariance whose request 0 is shorter than the batch's longest query)."""
    if not case.invariance:
        return False
    from conformance.graphs.invariance import variants

    return len({max(v.case.q_lens) for v in variants(case)}) > 1


def _own(name: str, kind: str, help: str, nullable: bool = False) -> Field:
    return Field(kind, help, lambda c: getattr(c, name), nullable)


#: Ledger kind and nullability of each annotation a scalar case field has (a field whose row has ``ledger`` and whose
#: annotation is not here is an error at import: tuple fields are offered through derived scalars instead).
_KIND: dict[str, tuple[str, bool]] = {
    "int": ("int", False),
    "int | None": ("int", True),
    "float | None": ("float", True),
    "bool": ("bool", False),
    "str": ("str", False),
    "str | None": ("str", True),
}
#: The scalars a tuple field is offered through, listed after the named field (where each was added).
_AFTER: dict[str, dict[str, Field]] = {
    "append_lens": {
        "append_uneven": Field(
            "bool", "an append with a count of new keys per request (append_lens)", lambda c: bool(c.append_lens)
        ),
        "min_new_kv_len": Field(
            "int", "fewest new keys a request appends (0 without append)", lambda c: min(c.new_kv_lens)
        ),
        "max_new_kv_len": Field(
            "int", "most new keys a request appends (0 without append)", lambda c: max(c.new_kv_lens)
        ),
    },
    "batch_name": {
        "graph_replays": Field("int", "replay batches of a graph case (0: not a graph case)", lambda c: len(c.graph)),
    },
}


def _case_fields() -> dict[str, Field]:
    """The case's own scalar fields, in the dataclass's order, each with its row's help
    (:data:`~conformance.cases.fields.FIELD_SPECS`), and the scalars of :data:`_AFTER`."""
    out: dict[str, Field] = {}
    for f in dataclasses.fields(AttentionCase):
        if SPEC[f.name].ledger:
            kind, nullable = _KIND[str(f.type)]
            out[f.name] = _own(f.name, kind, SPEC[f.name].help, nullable)
        out.update(_AFTER.get(f.name, {}))
    return out


FIELDS: dict[str, Field] = {
    # the case's own scalar fields (conformance/cases/case.py, conformance/cases/fields.py)
    **_case_fields(),
    # generic derived values
    "dv": _own("dv", "int", "value head dim in force"),
    "paged": _own("paged", "bool", "keys read through a block table"),
    "has_window": _own("has_window", "bool", "a sliding window is set"),
    "quant_family": _own("quant_family", "str", "fp8, int8 (None: not quantized)", True),
    "descale_mode": _own("descale_mode", "str", "descale granularity in force (None: not quantized)", True),
    "batch": _own("batch", "int", "requests in the call"),
    "total_q": _own("total_q", "int", "query rows of all requests"),
    "total_kv": _own("total_kv", "int", "keys of all requests"),
    "max_q_len": Field("int", "longest request's q_len", lambda c: max(c.q_lens)),
    "min_q_len": Field("int", "shortest request's q_len", lambda c: min(c.q_lens)),
    "max_kv_len": Field("int", "longest request's kv_len", lambda c: max(c.kv_lens)),
    "min_kv_len": Field("int", "shortest request's kv_len", lambda c: min(c.kv_lens)),
    "window_left": Field("int", "window's left side (None: unbounded)", lambda c: c.window[0], True),
    "window_right": Field(
        "int", "window's right side, 0 under causal (None: unbounded)", lambda c: 0 if c.causal else c.window[1], True
    ),
    "group_size": Field("int", "query heads per kv head", lambda c: c.num_heads // c.num_kv_heads),
    "kernel_head_dim_v": Field(
        "int", "V width the kernel is called with (head_dim when v_padded)", lambda c: c.padded_v_call().dv
    ),
    "dv_gt_head_dim": Field("bool", "value head dim wider than the qk head dim", lambda c: c.dv > c.head_dim),
    "qk_width": Field(
        "int",
        "width of the q.k product: head_dim, plus dv under qv (MLA absorbed: q_v scored against V)",
        lambda c: c.qk_dim,
    ),
    "max_request_k_elements": Field(
        "int",
        "elements of the largest request's K with kv heads repeated to the query heads: max kv_len x num_heads x "
        "qk_width (what a per-request call such as SDPA's receives)",
        lambda c: max(c.kv_lens) * c.num_heads * c.qk_dim,
    ),
    "keys_left_of_window": Field(
        "int", "the most keys a row's window leaves out on its left (0: no left bound)", _keys_left_of_window
    ),
    "rows_with_keys": Field("int", "query rows that see at least one key", lambda c: c.total_q - _rows_without_keys(c)),
    "keyless_query_tile": Field(
        "int",
        "largest T in 128, 64, ..., 1 with an aligned T-row query tile of one request (cut at its end) seeing no key, "
        "in some call (an invariance case's variants included)",
        _keyless_query_tile,
    ),
    "invariance_max_q_len_varies": Field(
        "bool",
        "the calls of an invariance case differ in their longest q_len (request 0 alone shorter than its batch's "
        "longest query)",
        _invariance_max_q_len_varies,
    ),
    "rows_without_keys": Field(
        "int", "query rows the mask leaves no key (kv_len 0, windows, causal sq > sk)", _rows_without_keys
    ),
    # what a kernel makes of the case (the adapters' own helpers)
    "fa2_entry": Field("str", "FA2's entry point for the case: varlen or kvcache (attnfast.fa2.fa2_entry)", _fa2_entry),
    "fa2_window_misread": Field(
        "bool",
        "FA2's window normalisation against seqlen_k changes the keys some row sees (flash-attention issue 895)",
        _fa2_window_misread,
    ),
    "fa2_varlen_window_misread": Field(
        "bool",
        "the same through a varlen call (max_seqlen_k), as torch's vendored FA2 (aten._flash_attention_forward) is "
        "always called",
        _fa2_varlen_window_misread,
    ),
    "fa3_keyless_m_block": Field(
        "bool",
        "some query tile of the FA3 fork's forward (its kBlockM rows for the call: 192 at head dims 64/96, 64 for "
        "a one-MMA-warpgroup call, else 128; packed GQA rows with a group) sees no key, in some call (an invariance "
        "case's variants included)",
        _fa3_keyless_m_block,
    ),
    "fa3_window_unmasked_rows": Field(
        "int",
        "(row, query head) pairs of the FA3 fork's call that see keys right of their window: key tiles its "
        "intra-warpgroup-overlap mainloop leaves unmasked once the window moves the key pointer (0: none, no window)",
        _fa3_window_unmasked_rows,
    ),
    "fa3_one_mma_wg_switch": Field(
        "bool",
        "batch invariance whose calls (request 0 alone, in its batch) fall on both sides of FA3's one-MMA-warpgroup "
        "rule (head dim 128, max_seqlen_q x GQA group <= 64): two different kernels for request 0",
        _fa3_one_mma_wg_switch,
    ),
    "fa3_group_rows_switch": Field(
        "bool",
        "batch or neighbour invariance whose calls fall on both sides of max_seqlen_q x GQA group <= 64 (the longest "
        "request's packed query rows in one 64-row tile), any head dim",
        _fa3_group_rows_switch,
    ),
    "fa3_hdim_template": Field(
        "int", "FA3's head-dim template: 64, 96, 128, 192 or 256 (round_up_headdim)", _fa3_hdim_template
    ),
    "fa4_sm90_tile_n": Field(
        "int", "FA4's key tile on sm_90 for the kernel call (attnfast.fa4.fa4_sm90_tile_n)", _fa4_tile_n
    ),
    "fa4_sm90_paged_loader": Field(
        "str", "FA4's sm_90 KV loader: contiguous, tma (page = tile_n) or non_tma (any other page)", _fa4_paged_loader
    ),
}


class CaseView:
    """A case with its field values and features computed once, on first use."""

    __slots__ = ("case", "_values", "_features")

    def __init__(self, case: AttentionCase) -> None:
        self.case = case
        self._values: dict[str, Any] = {}
        self._features: frozenset[str] | None = None

    def value(self, name: str) -> Any:
        if name not in self._values:
            self._values[name] = FIELDS[name].get(self.case)
        return self._values[name]

    @property
    def features(self) -> frozenset[str]:
        if self._features is None:
            self._features = self.case.features()
        return self._features


@lru_cache(maxsize=65536)
def _view_of(key: str) -> CaseView | None:
    try:
        return CaseView(AttentionCase.from_json(json.loads(key)))
    except (ValueError, TypeError, KeyError):
        return None


def case_view(case: AttentionCase | dict[str, Any]) -> CaseView | None:
    """The view of a case, or of a record's case JSON (None when it is empty or not a valid case: only globs can
    match such a record)."""
    if isinstance(case, AttentionCase):
        return _view_of(json.dumps(case.to_json(), sort_keys=True))
    if not case:
        return None
    return _view_of(json.dumps(case, sort_keys=True))
