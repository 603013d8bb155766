"""Suite ``full``'s sweeps: ``default``'s and, beyond them, the cross products over more batches, dims, masks,
modifiers, quantizations, MLA shapes and long contexts up to 32k (the suite adds covering
cases of its own, :mod:`conformance.suites.registry`).
"""

from __future__ import annotations

from conformance.suites.default import DEFAULT, DIMS, HEADS, MAIN
from conformance.cases.sweep import CONTIG, MASKS, MLA_DIMS, MLA_PREFILL_DIMS, MLA_SCALE, PAGED, Sweep

__all__ = ["FULL"]

FULL: tuple[Sweep, ...] = DEFAULT + (
    Sweep(
        "core_x",
        {
            "batch": MAIN + ("pf257", "cross"),
            "heads": HEADS + ((16, 2),),
            "dims": DIMS + ((80, 80), (160, 160)),
            "dtype": ("bf16", "fp16"),
            "mask": ("none", "causal", "cw128", "w32-32"),
            "sinks": (False, True),
        },
    ),
    Sweep(
        "paged_x",
        {
            "batch": MAIN,
            "kv": PAGED,
            "mask": ("none", "causal", "cw127"),
            "dims": ((64, 64), (128, 128), (256, 256)),
            "softcap": (None, 30.0),
            "dtype": ("bf16", "fp16"),
        },
        {"heads": (8, 2)},
    ),
    Sweep(
        "mods_x",
        {"batch": MAIN, "mask": tuple(MASKS), "softcap": (None, 30.0), "alibi": (False, True), "sinks": (False, True)},
        {"heads": (8, 2), "dims": (128, 128)},
    ),
    Sweep(
        "window_x",
        {
            "batch": MAIN,
            "mask": tuple(MASKS),
            "dims": ((64, 64), (128, 128), (256, 256)),
            "dtype": ("bf16", "fp16"),
            "heads": ((8, 2), (8, 8), (16, 2)),
            "sinks": (False, True),
        },
    ),
    Sweep(
        "quant_x",
        {
            "batch": MAIN + ("sqgtsk", "emptykv"),
            "quant": ("fp8_e4m3", "fp8_e5m2", "int8_t1", "int8_t2"),
            "mask": ("none", "causal", "cw128", "w32-32"),
            "dims": ((64, 64), (128, 128), (256, 256), MLA_PREFILL_DIMS),
            "kv": (CONTIG, ("NHD", 16), ("HND", 64), ("NHD", 256)),
        },
        {"heads": (8, 2)},
    ),
    Sweep(
        "mla_x",
        {
            "batch": ("dec", "spec4", "mixdf", "sqgtsk"),
            "heads": ((16, 1), (32, 1), (128, 1)),
            "kv": (("NHD", 64), ("HND", 64), ("NHD", 1), CONTIG),
            "quant": ("none", "fp8_e4m3"),
            "mask": ("causal", "none", "cw128"),
        },
        {"dims": MLA_DIMS, "qv": True, "scale": MLA_SCALE},
    ),
    Sweep(
        "long_x",
        {
            "batch": ("pf16k", "pf32k", "dec32k", "chunk32k", "pf4k", "dec16k"),
            "mask": ("causal", "cw4096", "cw128"),
            "kv": (CONTIG, ("NHD", 256), ("NHD", 16)),
            "dims": ((64, 64), (128, 128)),
        },
        {"heads": (8, 1)},
    ),
)
