"""Suite ``smoke``'s sweeps: small forward cases (a minute on 2 CPU cores), one or two of every mode and
modifier, for a first run and for CI on CPU; the suite adds backward ones
(:mod:`conformance.suites.backward`).  Assembled into the suite by :mod:`conformance.suites.registry`.
"""

from __future__ import annotations

from conformance.cases.sweep import CONTIG, MLA_DIMS, MLA_PREFILL_DIMS, MLA_SCALE, Sweep

__all__ = ["SMOKE"]

SMALL = ("s_pf", "s_dec", "s_spec", "s_mix")

SMOKE: tuple[Sweep, ...] = (
    Sweep(
        "core",
        {"batch": SMALL, "heads": ((4, 4), (4, 1)), "mask": ("none", "causal"), "dtype": ("bf16", "fp16")},
        {"dims": (64, 64), "heads": (4, 2)},
    ),
    Sweep(
        "shapes",
        {"batch": ("pf1", "pf37", "sqgtsk", "cross", "emptykv"), "mask": ("none", "causal")},
        {"heads": (4, 2), "dims": (32, 32)},
    ),
    Sweep(
        "window",
        {"batch": ("s_pf", "s_mix"), "mask": ("w1-0", "cw127", "w32-32", "winf-16", "chunk64", "cchunk64")},
        {"heads": (4, 2), "dims": (64, 64)},
    ),
    Sweep(
        "mods",
        {"batch": ("s_pf", "s_dec"), "mask": ("causal", "w16-0"), "softcap": (None, 30.0), "sinks": (False, True)},
        {"heads": (4, 2), "dims": (64, 64)},
    ),
    Sweep(
        "alibi",
        {"batch": ("s_pf", "s_mix"), "mask": ("none", "causal")},
        {"alibi": True, "heads": (4, 4), "dims": (64, 64)},
    ),
    Sweep(
        "paged",
        {"batch": ("s_dec", "s_mix"), "kv": (("NHD", 1), ("NHD", 16), ("HND", 16), ("NHD", 256), ("HND", 64))},
        {"mask": "causal", "heads": (4, 2), "dims": (64, 64)},
    ),
    Sweep(
        "append",
        {"batch": ("s_dec", "s_spec"), "kv": (CONTIG, ("NHD", 16), ("NHD", 256))},
        {"append": True, "mask": "causal", "heads": (4, 2), "dims": (64, 64)},
    ),
    Sweep(
        "dims",
        {"dims": ((8, 8), (128, 128), (256, 256), (192, 128), (64, 32), (512, 512))},
        {"batch": "s_pf", "mask": "causal", "heads": (2, 1)},
    ),
    Sweep(
        "misc",
        {"batch": ("s_mix",), "scale": (0.05,), "num_splits": (None, 3)},
        {"mask": "causal", "heads": (4, 2), "dims": (64, 64)},
    ),
    Sweep(
        "quant",
        {
            "batch": ("s_mix", "s_spec"),
            "quant": ("fp8_e4m3", "fp8_e5m2", "int8_t1", "int8_t2"),
            "kv": (CONTIG, ("NHD", 16)),
        },
        {"mask": "causal", "heads": (4, 2), "dims": (64, 64)},
    ),
    Sweep(
        "fp8_opts",
        {"batch": ("s_dec",), "descale": ("tensor", "head"), "quant_q": (True, False)},
        {"quant": "fp8_e4m3", "mask": "causal", "heads": (4, 2), "dims": (64, 64), "kv": ("NHD", 16)},
    ),
    Sweep(
        "sched",
        {"batch": ("s_dec", "s_mix"), "kv": (CONTIG, ("NHD", 16))},
        {"scheduler_metadata": True, "mask": "causal", "heads": (4, 2), "dims": (64, 64)},
    ),
    Sweep(
        "mla",
        {"batch": ("s_dec", "s_spec"), "quant": ("none", "fp8_e4m3")},
        {"dims": MLA_DIMS, "qv": True, "heads": (8, 1), "mask": "causal", "kv": ("NHD", 64), "scale": MLA_SCALE},
    ),
    Sweep("mla_prefill", {"batch": ("s_pf",), "v_padded": (False, True)}, {"dims": MLA_PREFILL_DIMS, "mask": "causal"}),
    Sweep(
        "cp",
        {"batch": ("s_dec", "s_spec"), "cp": ((2, 1), (4, 3)), "kv": (CONTIG, ("NHD", 16))},
        {"mask": "causal", "heads": (4, 2), "dims": (64, 64)},
    ),
    # a short append (append_len < q_len) into a contiguous and an HND cache; fp8 appends (FA3's), one short
    Sweep(
        "append_short",
        {"kv": (CONTIG, ("HND", 16))},
        {"batch": "s_spec", "append": True, "append_len": 1, "mask": "causal", "heads": (4, 2), "dims": (64, 64)},
    ),
    Sweep(
        "append_fp8",
        {"append_len": (None, 2)},
        {
            "batch": "s_spec",
            "append": True,
            "quant": "fp8_e4m3",
            "descale": "head",
            "kv": ("NHD", 16),
            "mask": "causal",
            "heads": (4, 2),
            "dims": (64, 64),
        },
    ),
)
