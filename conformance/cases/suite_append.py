"""The appends the sweeps and covering arrays do not draw, added after every other case of ``smoke``, ``default``
and ``full`` (so no earlier id or covering case changes): short appends (``append_len``: fewer new keys than query
tokens, flash-attention's ``seqlen_new < seqlen_q``) and fp8 appends (the new keys given in fp8 with the cache's
descales, FA3's fp8 kvcache append).  The case space keeps ``append`` unquantized and has no ``append_len`` axis,
so these few cases are what the fixed suites run of both (the fuzzer draws short appends itself)."""

from __future__ import annotations

from conformance.cases.case import AttentionCase

__all__ = ["append_cases"]

_HND16 = {"kv_layout": "HND", "block_size": 16}


def _c(requests, h: int, hk: int, d: int, **kw) -> AttentionCase:
    return AttentionCase(tuple(requests), num_heads=h, num_kv_heads=hk, head_dim=d, append=True, **kw)


def append_cases(name: str) -> tuple[AttentionCase, ...]:
    """The append cases of suite ``name`` (``smoke``: two; ``default`` and ``full``: six)."""
    smoke = (
        # FA2's kvcache path: one q_len, 3 of its 4 query rows at keys already cached
        _c([(4, 300), (4, 77)], 8, 2, 128, causal=True, append_len=1),
        # an fp8 append into a paged cache (sdpa-cpu / flex-cpu dequantize; FA3's adapter refuses it, with a reason)
        _c([(2, 40), (2, 9)], 8, 1, 128, causal=True, quant="fp8_e4m3", kv_layout="NHD", block_size=16),
    )
    if name == "smoke":
        return smoke
    if name not in ("default", "full"):
        raise ValueError(f"append_cases: name must be 'smoke', 'default' or 'full', got {name!r}")
    return smoke + (
        # FA2-shaped: paged at 256, a causal window, an empty cache (kv_len < q_len: the top rows see nothing)
        _c([(16, 700), (16, 5)], 6, 3, 64, causal=True, window=(64, 0), append_len=5, kv_layout="NHD", block_size=256),
        # no mask: every query row sees every key, the cache and the 2 new ones
        _c([(3, 20), (3, 3)], 4, 4, 64, dtype="fp16", append_len=2),
        # FA3-shaped: q_lens differ per request (varlen q), one append_len for all
        _c([(5, 40), (3, 9), (8, 8)], 4, 2, 64, causal=True, append_len=3, kv_layout="NHD", block_size=16),
        # an fp8 short append with per-(sequence, kv head) descales
        _c([(4, 33)], 4, 2, 64, causal=True, append_len=2, quant="fp8_e4m3", descale="head", **_HND16),
    )
