"""Suite ``limits``: probes of the kernels' own limits, so that every call a kernel rejects is a declared refusal.

Issue 19 item 4: adapter limits measured, not assumed.  The cases sweep each dimension along which the kernels
switch code paths or stop, one small call each (a few short requests), crossed with the features that change a
kernel's limits:

* query heads x kv heads (1 to 256, GQA ratios 1 to 32) x {plain, sinks, a window, a soft-cap, paged};
* head dims (every multiple of 8 from 8 to 256, the odd 20, 36, 100, 200, and past the templates: 264, 288, 320,
  512) x dtype (bf16, fp16, fp32) x {contiguous causal, paged decode};
* d != dv pairs (192/128, 128/64, 256/128, 96/64, 64/128, 64/512 the MLA latent, 128/256, 576/512);
* block sizes (1, 8, 16, 32, 64, 128, 256, 512, 1024) x head dims (64, 128, 256) x layout (NHD, HND);
* quantization (fp8 e4m3 / e5m2, kv-only, per-head descales, int8) x head dims x MLA ``qv``.

Run it on a GPU with every backend (``attnconf run --suite limits --device cuda``): a record ``error`` is a call
the adapter passed and the kernel rejected (the adapter must refuse it with the kernel's message), a ``fail`` a
shape the kernel takes but computes wrong; both are investigated like any failure.  The cases are small (at most 4
requests of at most 70 keys), so the run costs the kernels' compile time more than their run time.
"""

from __future__ import annotations

from conformance.cases.case import AttentionCase

__all__ = ["limits_cases"]

#: (query heads, kv heads): the registry's shapes (32/8, 40/8, 64/8, 128/8, 128/128 MLA-style, 64/4 ratio 16) and
#: the edges (1/1, 256 heads, ratio 32).
HEADS = (
    (1, 1),
    (2, 1),
    (3, 1),
    (12, 4),
    (32, 8),
    (40, 8),
    (48, 8),
    (64, 4),
    (64, 8),
    (96, 8),
    (128, 1),
    (128, 8),
    (128, 128),
    (256, 8),
    (256, 256),
    (64, 2),
)
#: Every multiple of 8 the kernels template between 8 and 256, odd widths, and widths past the templates.
HEAD_DIMS = tuple(range(8, 257, 8)) + (20, 36, 100, 200, 264, 288, 320, 512)
#: d != dv pairs: DeepSeek V2/V3 MLA prefill 192/128, MLA absorbed 64/512 and its 576/512 cache form, and others.
DV_PAIRS = ((192, 128), (128, 64), (256, 128), (96, 64), (64, 128), (64, 512), (128, 256), (576, 512))
BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256, 512, 1024)

PREFILL = ((17, 17), (64, 70), (1, 33))
DECODE = ((1, 70), (1, 9), (1, 40), (1, 1))


def _c(reqs, h, hk, d, dv=None, **kw) -> AttentionCase:
    return AttentionCase(reqs, num_heads=h, num_kv_heads=hk, head_dim=d, head_dim_v=dv, **kw)


def _heads() -> list[AttentionCase]:
    out = []
    variants = (
        dict(causal=True),
        dict(causal=True, sinks=True),
        dict(causal=True, window=(15, 0)),
        dict(causal=True, softcap=30.0),
    )
    for h, hk in HEADS:
        for v in variants:
            out.append(_c(PREFILL, h, hk, 128, **v))
        out.append(_c(DECODE, h, hk, 128, causal=True, kv_layout="NHD", block_size=16))
        out.append(_c(DECODE, h, hk, 128, causal=True, kv_layout="NHD", block_size=256))
    return out


def _head_dims() -> list[AttentionCase]:
    out = []
    for d in HEAD_DIMS:
        for dt in ("bf16", "fp16", "fp32"):
            out.append(_c(PREFILL, 8, 2, d, dtype=dt, causal=True))
        out.append(_c(DECODE, 8, 2, d, causal=True, kv_layout="NHD", block_size=16))
        out.append(_c(DECODE, 8, 2, d, causal=True, kv_layout="NHD", block_size=256))
    for d, dv in DV_PAIRS:
        out.append(_c(PREFILL, 8, 2, d, dv, causal=True))
        out.append(_c(DECODE, 8, 2, d, dv, causal=True, kv_layout="NHD", block_size=64))
    return out


def _blocks() -> list[AttentionCase]:
    out = []
    for bs in BLOCK_SIZES:
        for d in (64, 128, 256):
            for layout in ("NHD", "HND"):
                out.append(_c(DECODE, 8, 2, d, causal=True, kv_layout=layout, block_size=bs))
        out.append(_c(PREFILL, 8, 2, 128, causal=True, kv_layout="NHD", block_size=bs))
    return out


def _quant() -> list[AttentionCase]:
    out = []
    for quant in ("fp8_e4m3", "fp8_e5m2"):
        for d in (64, 96, 128, 192, 256):
            out.append(_c(PREFILL, 8, 2, d, causal=True, quant=quant))
            out.append(_c(DECODE, 8, 2, d, causal=True, quant=quant, kv_layout="NHD", block_size=16))
            out.append(_c(DECODE, 8, 2, d, causal=True, quant=quant, quant_q=False, kv_layout="NHD", block_size=16))
            out.append(_c(DECODE, 8, 2, d, causal=True, quant=quant, descale="head", kv_layout="NHD", block_size=16))
        out.append(_c(DECODE, 16, 1, 64, 512, causal=True, quant=quant, qv=True, kv_layout="NHD", block_size=64))
    for quant in ("int8_t1", "int8_t2"):
        out.append(_c(PREFILL, 8, 2, 128, causal=True, quant=quant))
    for h in (16, 64, 128, 256):
        out.append(_c(DECODE, h, 1, 64, 512, causal=True, qv=True, kv_layout="NHD", block_size=64))
    return out


def limits_cases() -> list[AttentionCase]:
    """Suite ``limits`` (see the module docstring), in a stable order without duplicates."""
    seen: dict[str, AttentionCase] = {}
    for case in _heads() + _head_dims() + _blocks() + _quant():
        seen.setdefault(case.id, case)
    return list(seen.values())
