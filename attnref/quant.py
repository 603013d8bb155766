"""Quantized q/k/v and quantized KV caches as the engines produce them: the cast, its inverse, the cache writes.

Kernels that take fp8 or int8 inputs are judged against reference attention on the *dequantized*
values (``dequantize(quantize(x, s), s)``, with the descales of ``../shared/SEMANTICS.md`` section 3
steps 1 and 6), so this module adds no attention of its own: it fixes what the quantized tensors and
caches hold, bit for bit, so that the dequantized inputs of both sides are the same numbers.

Formats (:data:`QUANT_FORMATS`): ``"fp8_e4m3"`` (``torch.float8_e4m3fn``, largest magnitude 448, no
infinity), ``"fp8_e5m2"`` (``torch.float8_e5m2``, 57344) and ``"int8"`` (127).  A scale ``s`` is a
*descale*: ``x ~= dequantize(q, s) = q * s`` and ``q = quantize(x, s)`` rounds ``x / s``.

Quantization (:func:`quantize`), always from ``y = x.float() / scale`` computed in fp32:

* fp8: ``y`` is saturated to ``[-max, max]`` first (so ``+-inf`` and any overflow become ``+-max``,
  never inf or NaN), NaN stays NaN, then cast with round-to-nearest-even (ties to the even
  mantissa, subnormals included; ``-0.0`` stays ``-0.0``).  This is vLLM's ``scaled_fp8_quant`` and
  the fp8 branch of ``reshape_and_cache_flash`` (``x / scale`` converted with ``__NV_SATFINITE``).
  The explicit clamp keeps the result independent of how a torch build casts out-of-range values
  (torch 2.13 on CPU saturates e4m3fn itself but turns e5m2 overflow into inf).
* int8: ``torch.round`` (half to even), then clamp to ``[-128, 127]`` (saturation for static
  scales; a dynamic absmax scale never goes below -127).  A NaN or inf in ``x`` is refused, as an
  int8 has no code for it.

Symmetric int8 (:func:`quantize_int8_per_token_head`): one fp32 scale per (token, head),
``scale = absmax over head_dim / 127`` (``1.0`` for an all-zero row), no zero point; the mode-2
``scaled_int8_quant_for_attn`` of the vLLM fork in ``../shared/seeds/001_*.txt`` (its callers were
read, not the kernel).  That fork's cache modes (:func:`write_kv_cache_int8`):

* type 1 ("int8q int8k int8v"): int8 K with the per-(token, head) scale stored in a scale cache
  ``(num_blocks, hk, block_size)`` fp32 at the token's slot; int8 V quantized with a static
  per-channel scale ``(hk, dv)`` fp32 (loaded from a file, never updated): ``reshape_and_cache_flash_int8``;
* type 2 ("int8q int8k fp16v"): K as in type 1, V stored unquantized in a float cache:
  ``reshape_and_cache_flash_mix``.

fp8 caches (:func:`write_kv_cache_fp8`) take per-tensor ``k_scale``/``v_scale`` as vLLM's
``reshape_and_cache_flash`` does with an fp8 ``kv_cache_dtype``; the cache dtype picks the format.
FA3 wants its ``q/k/v_descale`` per (batch, kv_head); vLLM expands its per-tensor scales with
``.expand`` (:func:`expand_descale`).  Cache layouts, slot mapping and their checks are those of
:mod:`attnref.paged`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .paged import KVLayout, cache_geometry, check_kv_write, unstack_kv, write_kv_cache

__all__ = [
    "QuantFormat",
    "QUANT_FORMATS",
    "quant_format",
    "quantize",
    "dequantize",
    "amax_scale",
    "quantize_int8_per_token_head",
    "expand_descale",
    "write_kv_cache_fp8",
    "write_kv_cache_int8",
    "dequantize_cache",
]


@dataclass(frozen=True)
class QuantFormat:
    """A quantized storage format: its name, torch dtype and the largest magnitude a scaled value maps to."""

    name: str
    dtype: torch.dtype
    max: float


QUANT_FORMATS: dict[str, QuantFormat] = {
    "fp8_e4m3": QuantFormat("fp8_e4m3", torch.float8_e4m3fn, 448.0),
    "fp8_e5m2": QuantFormat("fp8_e5m2", torch.float8_e5m2, 57344.0),
    "int8": QuantFormat("int8", torch.int8, 127.0),
}

_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def quant_format(name: str | torch.dtype | QuantFormat) -> QuantFormat:
    """The :class:`QuantFormat` of a name in :data:`QUANT_FORMATS` or of its torch dtype.

    ``"fp8"`` is accepted as vLLM's ``kv_cache_dtype`` spelling of ``"fp8_e4m3"``.
    """
    if isinstance(name, QuantFormat):
        return name
    if isinstance(name, torch.dtype):
        for fmt in QUANT_FORMATS.values():
            if fmt.dtype == name:
                return fmt
    elif isinstance(name, str):
        if name in QUANT_FORMATS:
            return QUANT_FORMATS[name]
        if name == "fp8":
            return QUANT_FORMATS["fp8_e4m3"]
    choices = list(QUANT_FORMATS) + [str(f.dtype) for f in QUANT_FORMATS.values()]
    raise ValueError(f"fmt must be one of {choices}, got {name!r}")


# no mutate: every caller passes ``finite``, so the default is never used
def _check_tensor(name: str, x: object, *, finite: bool = False) -> torch.Tensor:  # pragma: no mutate
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating tensor, got dtype {x.dtype}")
    if finite and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} must be finite (no NaN or inf), got {int((~torch.isfinite(x)).sum())} such values")
    return x


def _scale_tensor(name: str, scale: torch.Tensor | float, like: torch.Tensor, *, positive: bool) -> torch.Tensor:
    """``scale`` as an fp32 tensor on ``like``'s device that broadcasts to ``like``'s shape."""
    if isinstance(scale, bool) or not isinstance(scale, (torch.Tensor, int, float)):
        raise ValueError(f"{name} must be a float tensor or number, got {type(scale).__name__}")
    if isinstance(scale, torch.Tensor):
        if not scale.dtype.is_floating_point:
            raise ValueError(f"{name} must be a floating tensor, got dtype {scale.dtype}")
        s = scale.to(device=like.device, dtype=torch.float32)
    else:
        s = torch.tensor(float(scale), dtype=torch.float32, device=like.device)
    try:
        shape = torch.broadcast_shapes(s.shape, like.shape)
    except RuntimeError:
        # no mutate: any non-shape marks the failure the same (it differs from like.shape); "" for None changes nothing
        shape = None  # pragma: no mutate
    if shape != like.shape:
        raise ValueError(f"{name} of shape {tuple(s.shape)} must broadcast to the data's shape {tuple(like.shape)}")
    if positive and not bool(((s > 0) & torch.isfinite(s)).all()):
        raise ValueError(f"{name} must be positive and finite (as fp32), got {s.flatten()[:8].tolist()}")
    return s


def _quantize(x: torch.Tensor, scale: torch.Tensor | float, fmt: QuantFormat, xname: str, sname: str) -> torch.Tensor:
    _check_tensor(xname, x, finite=fmt.dtype == torch.int8)
    s = _scale_tensor(sname, scale, x, positive=True)
    y = x.float() / s
    if fmt.dtype == torch.int8:
        return torch.round(y).clamp_(-128.0, 127.0).to(torch.int8)
    return y.clamp(-fmt.max, fmt.max).to(fmt.dtype)  # clamp keeps NaN


@torch.no_grad()
def quantize(x: torch.Tensor, scale: torch.Tensor | float, fmt: str | QuantFormat) -> torch.Tensor:
    """``x / scale`` (fp32) in ``fmt``: fp8 saturated and rounded to nearest even, int8 rounded half to even
    and clamped to [-128, 127].

    Args:
        x: floating tensor; for int8 it must be finite.
        scale: positive finite descale, a number or a float tensor broadcasting to ``x``'s shape.
        fmt: a name of :data:`QUANT_FORMATS` (or its dtype, or a :class:`QuantFormat`).

    Returns:
        A tensor of ``x``'s shape and ``fmt.dtype``.
    """
    return _quantize(x, scale, quant_format(fmt), "x", "scale")


@torch.no_grad()
def dequantize(xq: torch.Tensor, scale: torch.Tensor | float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``xq * scale`` in ``dtype``: computed in fp32 (fp64 when ``dtype`` is fp64), rounded once to ``dtype``.

    Every fp8 and int8 value is exact in fp32, so for ``dtype=float32`` this is the product
    ``xq.to(float32) * scale`` rounded once.  Scale values are not checked (scale caches hold whatever
    their unwritten slots contain), only that ``scale`` is floating and broadcasts to ``xq``'s shape.
    """
    if not isinstance(xq, torch.Tensor):
        raise ValueError(f"xq must be a torch.Tensor, got {type(xq).__name__}")
    if xq.dtype == torch.bool or xq.is_complex():
        raise ValueError(f"xq must be a quantized (fp8, int8) or float tensor, got dtype {xq.dtype}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point or dtype in _FP8_DTYPES:
        raise ValueError(f"dtype must be a floating torch dtype wider than fp8, got {dtype!r}")
    s = _scale_tensor("scale", scale, xq, positive=False)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    return (xq.to(work) * s.to(work)).to(dtype)


def _dims_tuple(x: torch.Tensor, dims: int | tuple[int, ...]) -> tuple[int, ...]:
    raw = (dims,) if isinstance(dims, int) else tuple(dims)
    if not raw or not all(isinstance(d, int) and not isinstance(d, bool) for d in raw):
        raise ValueError(f"dims must be None, an int or a non-empty tuple of ints, got {dims!r}")
    out = []
    for d in raw:
        if not -x.dim() <= d < x.dim():
            raise ValueError(
                f"dims entries must lie in [-{x.dim()}, {x.dim()}) for x of shape {tuple(x.shape)}, got {d}"
            )
        out.append(d % x.dim())
    if len(set(out)) != len(out):
        raise ValueError(f"dims must not repeat a dimension, got {dims!r}")
    return tuple(out)


@torch.no_grad()
def amax_scale(x: torch.Tensor, fmt: str | QuantFormat, dims: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Dynamic absmax descale: ``amax(|x|) / fmt.max`` in fp32, ``1.0`` where the absmax is 0.

    ``dims=None`` reduces every dim to a 0-d tensor; otherwise the reduced dims are kept with size 1,
    so the result broadcasts against ``x`` in :func:`quantize`.  ``x`` must be finite.
    """
    f = quant_format(fmt)
    _check_tensor("x", x, finite=True)
    red = tuple(range(x.dim())) if dims is None else _dims_tuple(x, dims)
    if x.numel() == 0:
        shape = [] if dims is None else [1 if i in red else n for i, n in enumerate(x.shape)]
        return torch.ones(shape, dtype=torch.float32, device=x.device)
    ax = x.float().abs()
    amax = ax.amax() if dims is None else ax.amax(dim=red, keepdim=True)
    # a tensor divisor, not a Python number: CUDA divides by a CPU scalar as a multiplication by its reciprocal
    scale = amax / amax.new_tensor(f.max)
    return torch.where(amax == 0, torch.ones_like(scale), scale)


@torch.no_grad()
def quantize_int8_per_token_head(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per (token, head): ``(x (n, h, d) as int8, fp32 scale (n, h))``.

    ``scale = absmax over d / 127`` (``1.0`` for an all-zero row) and the values are
    ``quantize(x, scale[..., None], "int8")``: the fork's ``scaled_int8_quant_for_attn(x, 2)``.
    """
    _check_tensor("x", x, finite=True)
    if x.dim() != 3:
        raise ValueError(f"x must have 3 dims (tokens, heads, head_dim), got shape {tuple(x.shape)}")
    scale = amax_scale(x, "int8", dims=-1)
    return _quantize(x, scale, QUANT_FORMATS["int8"], "x", "scale"), scale.squeeze(-1)


def expand_descale(scale: torch.Tensor, batch: int, num_kv_heads: int, name: str = "descale") -> torch.Tensor:
    """A descale as FA3 takes it, ``(batch, num_kv_heads)``, the way vLLM builds it.

    A per-tensor scale (shape ``()``, ``(1,)`` or ``(1, 1)``) becomes an ``.expand`` view (no copy);
    a ``(batch, num_kv_heads)`` tensor is returned as is.
    """
    for arg, n, low in (("batch", batch, 0), ("num_kv_heads", num_kv_heads, 1)):
        if isinstance(n, bool) or not isinstance(n, int) or n < low:
            raise ValueError(f"{arg} must be an int >= {low}, got {n!r}")
    want = (batch, num_kv_heads)
    if not isinstance(scale, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(scale).__name__}")
    if not scale.dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating tensor, got dtype {scale.dtype}")
    if tuple(scale.shape) == want:
        return scale
    if tuple(scale.shape) in ((), (1,), (1, 1)):
        return scale.expand(want)
    raise ValueError(
        f"{name} must be per-tensor (shape (), (1,) or (1, 1)) or per (batch, kv_head) {want}, got {tuple(scale.shape)}"
    )


def _kept(slots: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token indices with a slot (not -1) and their slots."""
    tokens = [t for t, s in enumerate(slots) if s >= 0]
    targets = [s for s in slots if s >= 0]
    # no mutate: without ``device`` the indices stay on the CPU, and a CPU index tensor indexes a tensor on any device
    # alike (``sel`` is read back as a list by check_kv_write): no result can differ.  (A pragma covers the whole
    # line, so it also hides ``dtype``'s mutants, which an all-padding write would show: an empty list makes float.)
    keep = torch.tensor(tokens, dtype=torch.long, device=device)  # pragma: no mutate
    # no mutate: as above
    sel = torch.tensor(targets, dtype=torch.long, device=device)  # pragma: no mutate
    return keep, sel


def _describe(t: object) -> str:
    return f"shape {tuple(t.shape)}, dtype {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__


def _check_per_tensor(name: str, scale: object) -> None:
    if not isinstance(scale, torch.Tensor) or tuple(scale.shape) not in ((), (1,)) or scale.dtype != torch.float32:
        got = _describe(scale)
        raise ValueError(f"{name} must be a per-tensor fp32 tensor of shape () or (1,), got {got}")


@torch.no_grad()
def write_kv_cache_fp8(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor | None,
    slot_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    layout: KVLayout = "NHD",
) -> None:
    """In-place fp8 cache write: vLLM ``reshape_and_cache_flash`` with an fp8 ``kv_cache_dtype``.

    Token ``t`` goes to slot ``slot_mapping[t]`` (-1 skipped) as ``quantize(key[t], k_scale, fmt)``
    (value likewise), ``fmt`` being the cache's fp8 dtype (e4m3fn or e5m2; K and V may differ).
    ``k_scale``/``v_scale`` are per-tensor fp32 (shape ``()`` or ``(1,)``).  Shapes and slots are
    checked as :func:`attnref.paged.write_kv_cache` checks them; ``v_cache=None`` means a stacked cache.
    """
    k_cache, v_cache = unstack_kv(k_cache, v_cache)
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(cache, torch.Tensor) or cache.dtype not in _FP8_DTYPES:
            got = cache.dtype if isinstance(cache, torch.Tensor) else type(cache).__name__
            raise ValueError(f"{name} must have an fp8 dtype (torch.float8_e4m3fn or torch.float8_e5m2), got {got}")
    _check_per_tensor("k_scale", k_scale)
    _check_per_tensor("v_scale", v_scale)
    _, _, slots = check_kv_write(key, value, k_cache, v_cache, slot_mapping, layout)
    keep, sel = _kept(slots, key.device)
    kq = _quantize(key[keep], k_scale, quant_format(k_cache.dtype), "key", "k_scale")
    vq = _quantize(value[keep], v_scale, quant_format(v_cache.dtype), "value", "v_scale")
    write_kv_cache(kq, vq, k_cache, v_cache, sel, layout)


@torch.no_grad()
def write_kv_cache_int8(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor | None,
    k_scale_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    v_scale: torch.Tensor | None = None,
    layout: KVLayout = "NHD",
) -> None:
    """In-place int8 cache write of the vLLM fork (``reshape_and_cache_flash_int8`` / ``_mix``).

    K (both types): ``key`` quantized per (token, head) (:func:`quantize_int8_per_token_head`) into
    the int8 ``k_cache``; its fp32 scale goes to ``k_scale_cache[block, :, offset]``
    (``k_scale_cache`` is ``(num_blocks, hk, block_size)`` whatever the layout).

    V, type 1 (``v_scale`` given, ``(hk, dv)`` fp32): ``quantize(value, v_scale, "int8")`` into an int8
    ``v_cache`` (static per-channel scale, saturating).  Type 2 (``v_scale=None``): ``value`` cast to
    the float ``v_cache``'s dtype.  Only tokens with a slot (not -1) are quantized, so padding rows
    may hold anything.
    """
    k_cache, v_cache = unstack_kv(k_cache, v_cache)
    if not isinstance(k_cache, torch.Tensor) or k_cache.dtype != torch.int8:
        got = k_cache.dtype if isinstance(k_cache, torch.Tensor) else type(k_cache).__name__
        raise ValueError(f"k_cache must be an int8 tensor, got {got}")
    if not isinstance(v_cache, torch.Tensor):
        raise ValueError(f"v_cache must be a torch.Tensor, got {type(v_cache).__name__}")
    if v_scale is not None and v_cache.dtype != torch.int8:
        raise ValueError(f"v_cache must be int8 when v_scale is given (type 1), got dtype {v_cache.dtype}")
    if v_scale is None and (not v_cache.dtype.is_floating_point or v_cache.dtype in _FP8_DTYPES):
        raise ValueError(
            "v_cache must be an fp16/bf16/fp32 cache when v_scale is None (type 2; an int8 v_cache needs v_scale), "
            f"got dtype {v_cache.dtype}"
        )
    (nb, bs, hk, _), (_, _, hkv, dv), slots = check_kv_write(key, value, k_cache, v_cache, slot_mapping, layout)
    if (
        not isinstance(k_scale_cache, torch.Tensor)
        or tuple(k_scale_cache.shape) != (nb, hk, bs)
        or k_scale_cache.dtype != torch.float32
    ):
        want, described = (nb, hk, bs), _describe(k_scale_cache)
        raise ValueError(f"k_scale_cache must be fp32 of shape (num_blocks, hk, block_size) = {want}, got {described}")
    if k_scale_cache.device != k_cache.device:
        raise ValueError(f"k_scale_cache must be on k_cache's device {k_cache.device}, got {k_scale_cache.device}")
    if v_scale is not None and (
        not isinstance(v_scale, torch.Tensor) or tuple(v_scale.shape) != (hkv, dv) or v_scale.dtype != torch.float32
    ):
        raise ValueError(
            f"v_scale must be fp32 of shape (hk, dv) = {(hkv, dv)} (static per channel), got {_describe(v_scale)}"
        )
    keep, sel = _kept(slots, key.device)
    k_rows = key[keep]
    _check_tensor("key", k_rows, finite=True)
    kq, ks = quantize_int8_per_token_head(k_rows)
    v_rows = value[keep]
    vq = v_rows if v_scale is None else _quantize(v_rows, v_scale, QUANT_FORMATS["int8"], "value", "v_scale")
    write_kv_cache(kq, vq, k_cache, v_cache, sel, layout)
    sel = sel.to(k_scale_cache.device)
    k_scale_cache[sel // bs, :, sel % bs] = ks.to(k_scale_cache.device)


@torch.no_grad()
def dequantize_cache(cache: torch.Tensor, scale: torch.Tensor | float, layout: KVLayout = "NHD") -> torch.Tensor:
    """fp32 copy of a quantized K or V cache (in its own layout).

    ``scale`` is per-tensor (a number, or shape ``()``/``(1,)``), an int8 K scale cache
    ``(num_blocks, hk, block_size)`` (one scale per slot and head), or an int8 V per-channel scale
    ``(hk, d)``.  Computed as ``cache.float() * scale`` in fp32, like :func:`dequantize`.
    """
    nb, bs, hk, d = cache_geometry(cache, layout)
    if not isinstance(scale, torch.Tensor):
        return dequantize(cache, scale)
    if not scale.dtype.is_floating_point:
        raise ValueError(f"scale must be a floating tensor, got dtype {scale.dtype}")
    shape = tuple(scale.shape)
    if shape in ((), (1,)):
        s = scale
    elif shape == (nb, hk, bs):
        s = scale[..., None] if layout == "HND" else scale.transpose(1, 2)[..., None]
    elif shape == (hk, d):
        s = scale if layout == "NHD" else scale[:, None, :]
    else:
        raise ValueError(
            "scale must be per-tensor (shape () or (1,)), a K scale cache (num_blocks, hk, block_size) = "
            f"{(nb, hk, bs)} or a per-channel V scale (hk, d) = {(hk, d)}, got shape {shape}"
        )
    return dequantize(cache, s)
