"""Paged KV caches: layouts, the engines' slot-mapping write, and attention through a block table.

Layouts (per K or V cache; ``hk`` kv heads, ``d`` head dim):

* ``"NHD"``: ``(num_blocks, block_size, hk, d)`` (flash-attn, vLLM's default)
* ``"HND"``: ``(num_blocks, hk, block_size, d)`` (vLLM/FlashInfer's alternative stride order)

K and V may be separate tensors or stacked as ``(2, num_blocks, ...)`` (pass the stacked tensor as
``k_cache`` and ``v_cache=None``).  Token ``t`` of sequence ``b`` lives in block
``block_table[b, t // block_size]`` at offset ``t % block_size``.  Any block size works here; the
kernels' own limits (FA2: a multiple of 256) are the adapters' business.
"""

from __future__ import annotations

from typing import Literal

import torch

from .core import attend_sequence
from .options import AttnOptions, Numerics
from .result import AttnResult
from .validate import (
    as_int_list,
    check_alibi,
    check_block_table,
    check_cu_seqlens,
    check_head_vector,
    check_qkv,
    check_qv,
    check_seqlens,
)
from .varlen import sequence_slopes

__all__ = [
    "KVLayout",
    "as_layout",
    "cache_geometry",
    "unstack_kv",
    "write_kv_cache",
    "gather_kv",
    "attention_paged",
    "to_layout",
]

KVLayout = Literal["NHD", "HND"]


def as_layout(layout: str) -> KVLayout:
    """``layout`` as a :data:`KVLayout` (a case's ``kv_layout`` of a paged cache); ``ValueError`` unless it is
    ``"NHD"`` or ``"HND"``."""
    if layout == "NHD":
        return "NHD"
    if layout == "HND":
        return "HND"
    raise ValueError(f"layout must be 'NHD' or 'HND', got {layout!r}")


def _check_layout(layout: str) -> None:
    as_layout(layout)


def cache_geometry(cache: torch.Tensor, layout: KVLayout = "NHD") -> tuple[int, int, int, int]:
    """(num_blocks, block_size, hk, d) of one K or V cache."""
    _check_layout(layout)
    if not isinstance(cache, torch.Tensor) or cache.dim() != 4:
        raise ValueError(
            f"cache must be 4-D (num_blocks, ...) in layout {layout}, got shape {tuple(getattr(cache, 'shape', ()))}"
        )
    n, a, b, d = cache.shape
    return (n, a, b, d) if layout == "NHD" else (n, b, a, d)


def unstack_kv(k_cache: torch.Tensor, v_cache: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Separate K and V caches from either two tensors or one stacked ``(2, ...)`` tensor."""
    if v_cache is not None:
        return k_cache, v_cache
    if k_cache.dim() != 5 or k_cache.shape[0] != 2:
        raise ValueError(f"a stacked kv cache must have shape (2, num_blocks, ...), got {tuple(k_cache.shape)}")
    return k_cache[0], k_cache[1]


def to_layout(cache: torch.Tensor, src: KVLayout, dst: KVLayout) -> torch.Tensor:
    """The same cache in the other layout (a contiguous copy)."""
    _check_layout(src)
    _check_layout(dst)
    return cache if src == dst else cache.transpose(1, 2).contiguous()


def _token_view(cache: torch.Tensor, layout: KVLayout) -> torch.Tensor:
    """(num_blocks, block_size, hk, d) view of the cache whatever its layout."""
    return cache if layout == "NHD" else cache.transpose(1, 2)


def check_kv_write(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    layout: KVLayout,
) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int], list[int]]:
    """The checks of a slot-mapping cache write (this module's and :mod:`attnref.quant`'s), before anything is
    written: returns the K and V cache geometries and the slots as a list."""
    nb, bs, hk, d = cache_geometry(k_cache, layout)
    nbv, bsv, hkv, dv = cache_geometry(v_cache, layout)
    slots = as_int_list("slot_mapping", slot_mapping)
    if not isinstance(key, torch.Tensor) or key.dim() != 3 or tuple(key.shape[1:]) != (hk, d):
        raise ValueError(f"key must have shape (n, {hk}, {d}) to match k_cache, got {tuple(getattr(key, 'shape', ()))}")
    if not isinstance(value, torch.Tensor) or value.dim() != 3 or tuple(value.shape[1:]) != (hkv, dv):
        raise ValueError(
            f"value must have shape (n, {hkv}, {dv}) to match v_cache, got {tuple(getattr(value, 'shape', ()))}"
        )
    if len(slots) != key.shape[0] or value.shape[0] != key.shape[0]:
        raise ValueError(
            f"slot_mapping ({len(slots)}), key ({key.shape[0]}) and value ({value.shape[0]}) "
            "must have one entry per token"
        )
    for t, s in enumerate(slots):
        if s < -1 or s >= nb * bs:
            raise ValueError(f"slot_mapping[{t}] = {s} is outside the cache (-1 or 0 <= slot < {nb * bs})")
    return (nb, bs, hk, d), (nbv, bsv, hkv, dv), slots


@torch.no_grad()
def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor | None,
    slot_mapping: torch.Tensor,
    layout: KVLayout = "NHD",
) -> None:
    """In-place cache write as engines do it (vLLM ``reshape_and_cache_flash``).

    ``key``/``value`` (n, hk, d/dv); token ``t`` goes to slot ``slot_mapping[t]``
    (block ``slot // block_size``, offset ``slot % block_size``); slot ``-1`` is skipped (padding).
    """
    k_cache, v_cache = unstack_kv(k_cache, v_cache)
    (_, bs, _, _), _, slots = check_kv_write(key, value, k_cache, v_cache, slot_mapping, layout)
    keep = torch.tensor([t for t, s in enumerate(slots) if s >= 0], dtype=torch.long, device=key.device)
    if keep.numel() == 0:
        return
    sel = torch.tensor([s for s in slots if s >= 0], dtype=torch.long, device=k_cache.device)
    kt, vt = _token_view(k_cache, layout), _token_view(v_cache, layout)
    kt[sel // bs, sel % bs] = key[keep].to(k_cache.dtype).to(k_cache.device)
    vt[sel // bs, sel % bs] = value[keep].to(v_cache.dtype).to(v_cache.device)


def _gather_one(cache: torch.Tensor, blocks: list[int], n: int, layout: KVLayout) -> torch.Tensor:
    view = _token_view(cache, layout)
    bs = view.shape[1]
    need = -(-n // bs)
    if need == 0:
        return view.new_zeros((0,) + tuple(view.shape[2:]))
    # no mutate: ``blocks`` holds Python ints (block_table.tolist()), which torch.tensor makes int64 anyway, and a
    # CPU index tensor indexes a cache on any device alike: neither keyword changes a result
    idx = torch.tensor(blocks[:need], dtype=torch.long, device=cache.device)  # pragma: no mutate
    return view[idx].reshape(need * bs, *view.shape[2:])[:n]


def gather_kv(
    cache: torch.Tensor, block_table: torch.Tensor, seqlens: torch.Tensor | list[int], layout: KVLayout = "NHD"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Contiguous varlen copy of a paged cache: ``(total, hk, d)`` and ``cu_seqlens`` (int32)."""
    nb, bs, hk, d = cache_geometry(cache, layout)
    lens = as_int_list("seqlens", seqlens)
    check_seqlens("seqlens", lens, len(lens), nb * bs)
    table = check_block_table(block_table, len(lens), nb, bs, lens)
    parts = [_gather_one(cache, table[b], n, layout) for b, n in enumerate(lens)]
    # no mutate: ``lens`` holds Python ints, which torch.tensor makes int64 without being told
    counts = torch.tensor([0] + lens, dtype=torch.int64)  # pragma: no mutate
    cu = counts.cumsum(0).to(torch.int32)
    if not parts:
        return cache.new_zeros((0, hk, d)), cu
    # no mutate: torch.cat's dim defaults to 0
    return torch.cat(parts, 0), cu  # pragma: no mutate


@torch.no_grad()
def attention_paged(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor | None,
    block_table: torch.Tensor,
    seqused_k: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    *,
    layout: KVLayout = "NHD",
    options: AttnOptions = AttnOptions(),
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    qv: torch.Tensor | None = None,
    numerics: Numerics = Numerics(),
) -> AttnResult:
    """Reference attention with keys read through a block table.

    Args:
        q: (total_q, h, d) varlen queries delimited by ``cu_seqlens_q``.
        k_cache, v_cache: caches in ``layout`` (or a stacked cache and ``None``).
        block_table: (b, max_blocks) integer block ids.
        seqused_k: (b,) keys of each sequence (its context, the new tokens included).
        qv: (total_q, h, dv) MLA-absorbed query part scored against V (:mod:`attnref.mla`).

    Returns:
        ``AttnResult(out (total_q, h, dv), lse (h, total_q))``.
    """
    k_cache, v_cache = unstack_kv(k_cache, v_cache)
    nb, bs, hk, d = cache_geometry(k_cache, layout)
    nbv, bsv, hkv, dv = cache_geometry(v_cache, layout)
    if (nb, bs, hk) != (nbv, bsv, hkv):
        raise ValueError(
            f"k_cache and v_cache must agree in blocks, block size and heads, got {(nb, bs, hk)} and {(nbv, bsv, hkv)}"
        )
    if k_cache.device != q.device or v_cache.device != q.device:
        raise ValueError(
            f"q, k_cache, v_cache must be on one device, got {q.device}, {k_cache.device}, {v_cache.device}"
        )
    h, _, _, _ = check_qkv(q, k_cache.new_empty(0, hk, d), v_cache.new_empty(0, hk, dv), token_dims=1)
    cu_q = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0])
    batch = len(cu_q) - 1
    lens = check_seqlens("seqused_k", seqused_k, batch, nb * bs)
    table = check_block_table(block_table, batch, nb, bs, lens)
    check_alibi(alibi_slopes, batch, h, q.device)
    check_head_vector("sinks", sinks, h, q.device)
    check_qv(qv, q, dv)

    out = torch.zeros(q.shape[0], h, dv, dtype=numerics.dtype, device=q.device)
    lse = torch.full((h, q.shape[0]), float("-inf"), dtype=numerics.dtype, device=q.device)
    for b in range(batch):
        q0, q1 = cu_q[b], cu_q[b + 1]
        kb = _gather_one(k_cache, table[b], lens[b], layout)
        vb = _gather_one(v_cache, table[b], lens[b], layout)
        slopes = sequence_slopes(alibi_slopes, b)
        out[q0:q1], lse[:, q0:q1] = attend_sequence(
            q[q0:q1],
            kb,
            vb,
            options,
            alibi_slopes=slopes,
            sinks=sinks,
            qv=None if qv is None else qv[q0:q1],
            numerics=numerics,
        )
    return AttnResult(out, lse)
