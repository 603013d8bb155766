"""Suite ``perf``: the timing cases, long prefill (1k-32k, causal and windowed), paged decode (4k-128k),
d 64/128/256, GQA 8, their fp8 twins and MLA absorbed decode, and training's backward (:func:`perf_backward_cases`);
written out case by case (they are sized for the roofline, not swept).  Registered in
:mod:`conformance.suites.registry`.
"""

from __future__ import annotations

from conformance.cases.case import AttentionCase
from conformance.cases.sweep import MLA_DIMS, MLA_SCALE

__all__ = ["perf_backward_cases", "perf_cases"]


def perf_cases() -> list[AttentionCase]:
    """The cases of suite ``perf``, in a stable order."""
    cases = []
    for d in (64, 128, 256):
        for s in (1024, 4096, 8192, 16384, 32768):
            for causal, window in ((True, (None, None)), (True, (4096, None)), (False, (None, None))):
                if window != (None, None) and s <= 4096:
                    continue
                if not causal and d != 128:
                    continue
                cases.append(_prefill(d, s, causal, window))
        for ctx in (4096, 32768, 131072):
            b = max(1, 16 * 32768 // ctx) if ctx <= 32768 else 2
            for layout, bs in (("contiguous", None), ("NHD", 256), ("NHD", 16)):
                cases.append(
                    AttentionCase(
                        requests=tuple((1, ctx) for _ in range(b)),
                        num_heads=64,
                        num_kv_heads=8,
                        head_dim=d,
                        causal=True,
                        kv_layout=layout,
                        block_size=bs,
                        batch_name=f"dec{b}x{ctx}",
                    )
                )
    # the anchor of SEMANTICS.md section 6: b4 s8192 h16 d128 causal (FA4 679 TFLOP/s on an H200)
    cases.append(
        AttentionCase(
            requests=((8192, 8192),) * 4,
            num_heads=16,
            num_kv_heads=16,
            head_dim=128,
            causal=True,
            batch_name="anchor_b4x8192",
        )
    )
    cases += _perf_quant_mla_cases()
    cases += perf_backward_cases()
    return cases + [_gqa_prefill(s) for s in (4096, 16384)]  # GQA 8 prefill


def _prefill(
    d: int, s: int, causal: bool = True, window: tuple[int | None, int | None] = (None, None)
) -> AttentionCase:
    """Prefill of 32k tokens a batch (``max(1, 32768 // s)`` prompts of ``s``), 16 heads, head dim ``d``."""
    b = max(1, 32768 // s)
    return AttentionCase(
        requests=((s, s),) * b,
        num_heads=16,
        num_kv_heads=16,
        head_dim=d,
        causal=causal,
        window=window,
        batch_name=f"pf{b}x{s}",
    )


def _gqa_prefill(s: int) -> AttentionCase:
    """GQA 8 (64 query heads on 8 kv heads) causal prefill of 32k tokens a batch, head dim 128."""
    return AttentionCase(
        requests=((s, s),) * (32768 // s),
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        causal=True,
        batch_name=f"gqa_pf{32768 // s}x{s}",
    )


def _perf_quant_mla_cases() -> list[AttentionCase]:
    """fp8 prefill and paged decode (beside their bf16 twins above) and MLA absorbed decode (FlashMLA vs FA3 q_v)."""
    cases = []
    for d in (64, 128, 256):
        for s in (4096, 8192, 16384):
            cases.append(
                AttentionCase(
                    requests=((s, s),) * (32768 // s),
                    num_heads=16,
                    num_kv_heads=16,
                    head_dim=d,
                    causal=True,
                    quant="fp8_e4m3",
                    batch_name=f"pf{32768 // s}x{s}",
                )
            )
    for ctx in (4096, 32768):
        for layout, bs in (("contiguous", None), ("NHD", 16), ("NHD", 256)):
            cases.append(
                AttentionCase(
                    requests=((1, ctx),) * (16 * 32768 // ctx),
                    num_heads=64,
                    num_kv_heads=8,
                    head_dim=128,
                    causal=True,
                    kv_layout=layout,
                    block_size=bs,
                    quant="fp8_e4m3",
                    batch_name=f"dec{16 * 32768 // ctx}x{ctx}",
                )
            )
    for b, ctx in ((32, 4096), (128, 4096), (32, 32768), (64, 8192)):
        for h in (16, 128):
            for q_len in (1, 2):
                cases.append(
                    AttentionCase(
                        requests=((q_len, ctx),) * b,
                        num_heads=h,
                        num_kv_heads=1,
                        head_dim=MLA_DIMS[0],
                        head_dim_v=MLA_DIMS[1],
                        qv=True,
                        causal=True,
                        scale=MLA_SCALE,
                        kv_layout="NHD",
                        block_size=64,
                        batch_name=f"mla{'dec' if q_len == 1 else 'spec2'}{b}x{ctx}",
                    )
                )
    return cases


def perf_backward_cases() -> list[AttentionCase]:
    """Backward timing (training shapes, 32k tokens a batch): causal prefill b x 4k/8k/16k at d 64/128/256 (16
    heads), GQA 64/8 at d 128, a 4096-key window at 16k, and FA2's deterministic backward at 8k.  Each is the
    backward twin of a forward case above (same requests, heads, mask and ``batch_name``), so a run of the suite
    times both and the report sets them side by side (:mod:`conformance.reporting.backward_perf`)."""
    cases = [_prefill(d, s) for d in (64, 128, 256) for s in (4096, 8192, 16384)]
    cases += [_gqa_prefill(s) for s in (4096, 16384)]
    cases.append(_prefill(128, 16384, window=(4096, None)))
    deterministic = _prefill(128, 8192).replace(backward=True, deterministic=True)
    return [c.replace(backward=True) for c in cases] + [deterministic]
