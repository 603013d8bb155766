"""Metadata checks run by every public entry point before any computation.

Each failure raises ``ValueError`` whose message starts with the argument's name and states the
constraint and the offending value, so a user can fix a call without reading this code.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "check_qkv",
    "check_cu_seqlens",
    "check_seqlens",
    "check_head_vector",
    "check_alibi",
    "check_alibi_dtype",
    "ALIBI_DTYPES",
    "check_block_table",
    "check_qv",
    "as_int_list",
]


def _fail(msg: str) -> None:
    raise ValueError(msg)


def as_int_list(name: str, t: torch.Tensor | Sequence[int]) -> list[int]:
    """A 1-D integer tensor (or sequence) as a Python list, checked to be integral."""
    if isinstance(t, torch.Tensor):
        if t.dim() != 1:
            _fail(f"{name} must be 1-D, got shape {tuple(t.shape)}")
        if t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex():
            _fail(f"{name} must be an integer tensor, got dtype {t.dtype}")
        return [int(x) for x in t.tolist()]
    values = list(t)
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in values):
        _fail(f"{name} must hold integers, got {values!r}")
    return values


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, token_dims: int) -> tuple[int, int, int, int]:
    """Check ranks, head counts, head dims, dtypes and devices; returns (h, hk, d, dv).

    ``token_dims`` is the number of leading token dimensions (1 for varlen, 2 for padded).
    """
    rank = token_dims + 2
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            _fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != rank:
            _fail(
                f"{name} must have {rank} dims ({'tokens, ' * token_dims}heads, head_dim), got shape {tuple(t.shape)}"
            )
        if not t.dtype.is_floating_point:
            _fail(f"{name} must be a floating tensor, got dtype {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        # Kernels refuse mixed dtypes; silently upcasting here would let such a call "pass".
        _fail(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        _fail(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    h, d = q.shape[-2:]
    hk, dk = k.shape[-2:]
    hv, dv = v.shape[-2:]
    if k.shape[:-1] != v.shape[:-1]:
        _fail(f"k and v must agree in every dim but the last, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if dk != d:
        _fail(f"k head_dim must equal q head_dim ({d}), got {dk}")
    if hk == 0 or h % hk != 0:
        _fail(f"q heads ({h}) must be a multiple of k/v heads ({hk})")
    if d == 0 or dv == 0:
        _fail(f"head dims must be positive, got d={d}, dv={dv}")
    return h, hk, d, dv


def check_qv(qv: torch.Tensor | None, q: torch.Tensor, dv: int) -> None:
    """MLA-absorbed ``qv``: q's shape with the last dim ``dv`` (V's head dim), q's dtype and device."""
    if qv is None:
        return
    if not isinstance(qv, torch.Tensor):
        _fail(f"qv must be a torch.Tensor or None, got {type(qv).__name__}")
    want = tuple(q.shape[:-1]) + (dv,)
    if tuple(qv.shape) != want:
        _fail(f"qv must have shape {want} (q's tokens and heads, V's head dim {dv}), got {tuple(qv.shape)}")
    if qv.dtype != q.dtype:
        _fail(f"qv must have q's dtype {q.dtype}, got {qv.dtype}")
    if qv.device != q.device:
        _fail(f"qv must be on q's device {q.device}, got {qv.device}")


def check_cu_seqlens(name: str, cu: torch.Tensor | Sequence[int], total: int, exact: bool = True) -> list[int]:
    """``cu`` starts at 0, never decreases, and ends at ``total`` (or at most ``total`` if not exact)."""
    values = as_int_list(name, cu)
    if len(values) < 1:
        _fail(f"{name} must have at least one entry (batch + 1), got none")
    if values[0] != 0:
        _fail(f"{name} must start at 0, got {values[0]}")
    for i in range(1, len(values)):
        if values[i] < values[i - 1]:
            _fail(f"{name} must be non-decreasing, got {values[i - 1]} then {values[i]} at index {i}")
    if exact and values[-1] != total:
        _fail(f"{name}[-1] must equal the number of tokens ({total}), got {values[-1]}")
    if not exact and values[-1] > total:
        _fail(f"{name}[-1] must be <= the number of tokens ({total}), got {values[-1]}")
    return values


def check_seqlens(name: str, lens: torch.Tensor | list[int], batch: int, capacity: list[int] | int) -> list[int]:
    """Per-sequence lengths: ``batch`` non-negative entries, entry b at most ``capacity[b]``."""
    values = as_int_list(name, lens)
    if len(values) != batch:
        _fail(f"{name} must have {batch} entries (one per sequence), got {len(values)}")
    caps = [capacity] * batch if isinstance(capacity, int) else capacity
    for b, (n, cap) in enumerate(zip(values, caps)):
        if n < 0:
            _fail(f"{name}[{b}] must be >= 0, got {n}")
        if n > cap:
            _fail(f"{name}[{b}] = {n} exceeds the capacity of sequence {b} ({cap})")
    return values


def check_head_vector(name: str, t: torch.Tensor | None, heads: int, device: torch.device) -> None:
    """Per-head float vector such as sinks: shape (heads,), floating, same device."""
    if t is None:
        return
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != (heads,):
        _fail(f"{name} must have shape ({heads},) (one per query head), got {tuple(getattr(t, 'shape', ()))}")
    if not t.dtype.is_floating_point:
        _fail(f"{name} must be a floating tensor, got dtype {t.dtype}")
    if t.device != device:
        _fail(f"{name} must be on {device}, got {t.device}")
    if not bool(torch.isfinite(t).all()):
        _fail(f"{name} must be finite")


def check_alibi(t: torch.Tensor | None, batch: int, heads: int, device: torch.device) -> None:
    """ALiBi slopes: (heads,) or (batch, heads), floating, same device."""
    if t is None:
        return
    if not isinstance(t, torch.Tensor) or tuple(t.shape) not in ((heads,), (batch, heads)):
        _fail(f"alibi_slopes must have shape ({heads},) or ({batch}, {heads}), got {tuple(getattr(t, 'shape', ()))}")
    if not t.dtype.is_floating_point:
        _fail(f"alibi_slopes must be a floating tensor, got dtype {t.dtype}")
    if t.device != device:
        _fail(f"alibi_slopes must be on {device}, got {t.device}")


#: The dtypes an ALiBi bias may be rounded to (``alibi_dtype``).
ALIBI_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_alibi_dtype(dtype: object) -> None:
    """``alibi_dtype``: None or one of :data:`ALIBI_DTYPES`."""
    if dtype is not None and dtype not in ALIBI_DTYPES:
        _fail(f"alibi_dtype must be one of {ALIBI_DTYPES} or None, got {dtype!r}")


def check_block_table(
    block_table: torch.Tensor, batch: int, num_blocks: int, block_size: int, seqlens: list[int]
) -> list[list[int]]:
    """Block table (batch, max_blocks): the entries each sequence needs exist and lie in the cache."""
    if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2:
        _fail(
            "block_table must be a 2-D (batch, max_blocks) tensor, "
            f"got shape {tuple(getattr(block_table, 'shape', ()))}"
        )
    if block_table.dtype.is_floating_point or block_table.dtype == torch.bool:
        _fail(f"block_table must be an integer tensor, got dtype {block_table.dtype}")
    if block_table.shape[0] != batch:
        _fail(f"block_table must have {batch} rows (one per sequence), got {block_table.shape[0]}")
    table = block_table.tolist()
    width = block_table.shape[1]
    for b, n in enumerate(seqlens):
        need = -(-n // block_size)
        if need > width:
            _fail(f"seqused_k[{b}] = {n} needs {need} blocks of {block_size} but block_table has {width} columns")
        for c in range(need):
            blk = table[b][c]
            if not 0 <= blk < num_blocks:
                _fail(f"block_table[{b}, {c}] = {blk} is outside the cache (0 <= block < {num_blocks})")
    return table
