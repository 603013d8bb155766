"""Suite ``default``'s sweeps (hand-picked cases; the suite adds its covering-array cases and the fuzzer's
findings, :mod:`conformance.suites.registry`): every mode and modifier over the head dims, dtypes, masks and cache
layouts the kernels ship, and the quantization, MLA and FA3-call sweeps (:data:`QUANT_MLA`).  :data:`MAIN`,
:data:`HEADS` and :data:`DIMS` are shared with ``full`` (:mod:`conformance.suites.full`).
"""

from __future__ import annotations

from conformance.cases.sweep import (
    CONTIG,
    MLA_DIMS,
    MLA_PREFILL_DIMS,
    MLA_SCALE,
    PAGED,
    Sweep,
)

__all__ = ["APPEND", "DEFAULT", "DIMS", "HEADS", "MAIN", "QUANT_MLA"]

MAIN = ("pfvar", "dec", "spec4", "chunk", "mixdf", "mixdl")
HEADS = ((8, 8), (8, 2), (8, 1), (32, 8))
DIMS = ((32, 32), (64, 64), (96, 96), (128, 128), (256, 256))

#: Quantization, MLA and FA3-call sweeps of ``default`` (issue 8): fp8 formats x descale granularity x head
#: dims (192/128 included), fp8 with masks and modifiers, fp8 paged caches over every layout and block size,
#: fp8 k/v with a 16-bit q, seed 001's int8 types, MLA absorbed decode and spec decode (64 + 512, plain and
#: fp8), seed 004's MLA prefill (192/128, V padded or not), FA3 scheduler metadata, FA3's context-parallel call
#: (``cp_world_size`` / ``cp_rank``: one rank's key shard).
QUANT_MLA: tuple[Sweep, ...] = (
    Sweep(
        "fp8",
        {
            "batch": ("pfvar", "dec", "spec4", "mixdf", "chunk", "emptykv"),
            "quant": ("fp8_e4m3", "fp8_e5m2"),
            "descale": ("tensor", "head"),
            "dims": ((64, 64), (128, 128), (256, 256), MLA_PREFILL_DIMS),
        },
        {"heads": (8, 2), "mask": "causal"},
    ),
    Sweep(
        "fp8_mods",
        {
            "batch": ("pfvar", "dec"),
            "mask": ("none", "cw128", "w32-32"),
            "softcap": (None, 30.0),
            "sinks": (False, True),
        },
        {"quant": "fp8_e4m3", "descale": "head", "heads": (8, 2), "dims": (128, 128)},
    ),
    Sweep(
        "fp8_paged",
        {"batch": ("dec", "mixdf", "spec4"), "kv": PAGED, "descale": ("tensor", "head")},
        {"quant": "fp8_e4m3", "mask": "causal", "heads": (8, 2), "dims": (128, 128)},
    ),
    Sweep(
        "fp8_heads",
        {"batch": ("dec", "pfvar"), "heads": ((8, 8), (8, 1), (32, 8), (16, 2)), "quant_q": (True, False)},
        {"quant": "fp8_e4m3", "mask": "causal", "dims": (128, 128)},
    ),
    Sweep(
        "int8",
        {
            "batch": ("pfvar", "dec", "spec4", "mixdf"),
            "quant": ("int8_t1", "int8_t2"),
            "kv": (CONTIG, ("NHD", 16), ("HND", 64)),
            "dims": ((64, 64), (128, 128)),
        },
        {"mask": "causal", "heads": (8, 2)},
    ),
    Sweep(
        "mla",
        {
            "batch": ("dec", "spec4", "mixdf"),
            "heads": ((16, 1), (128, 1)),
            "kv": (("NHD", 64), ("NHD", 16), CONTIG),
            "scale": (None, MLA_SCALE),
        },
        {"dims": MLA_DIMS, "qv": True, "mask": "causal"},
    ),
    Sweep(
        "mla_decode",
        {
            "batch": ("mla32", "mlaspec2", "dec", "spec4"),
            "heads": ((16, 1), (32, 1), (64, 1), (128, 1)),
            "dtype": ("bf16", "fp16"),
            "mask": ("causal", "none"),
        },
        {"dims": MLA_DIMS, "qv": True, "kv": ("NHD", 64), "scale": MLA_SCALE},
    ),
    Sweep(
        "mla_fp8",
        {"batch": ("dec", "spec4"), "kv": (("NHD", 64), CONTIG), "descale": ("tensor", "head")},
        {"dims": MLA_DIMS, "qv": True, "mask": "causal", "heads": (16, 1), "quant": "fp8_e4m3", "scale": MLA_SCALE},
    ),
    Sweep(
        "mla_prefill",
        {
            "batch": ("pfvar", "chunk", "mixdf", "cross"),
            "v_padded": (False, True),
            "mask": ("causal", "none"),
            "dtype": ("bf16", "fp16"),
        },
        {"dims": MLA_PREFILL_DIMS, "heads": (16, 16)},
    ),
    Sweep(
        "sched",
        {
            "batch": ("dec", "spec4", "mixdf", "pfvar"),
            "kv": (CONTIG, ("NHD", 16), ("NHD", 256)),
            "num_splits": (None, 3),
        },
        {"scheduler_metadata": True, "mask": "causal", "heads": (8, 2), "dims": (128, 128)},
    ),
    Sweep(
        "cp",
        {
            "batch": ("dec", "spec4", "chunk", "mixdf"),
            "cp": ((2, 0), (2, 1), (3, 2), (8, 5)),
            "kv": (CONTIG, ("NHD", 16), ("HND", 64)),
        },
        {"mask": "causal", "heads": (8, 2), "dims": (128, 128)},
    ),
)

#: Appends as flash-attention's kvcache tests make them (issue 31; the covering arrays add more, on the space's
#: canonical batches): short appends (``append_len`` < q_len, the peers' ``seqlen_new_eq_seqlen_q=False``) where FA2
#: runs them (one q_len for the batch: spec4, pf37; a block size of 256) and FA3 (varlen q too: chunk), and fp8
#: appends (FA3's fp8 kvcache append: the new keys given in e4m3 with the cache's descales, per tensor or per
#: (sequence, kv head)), of every query token and short.
APPEND: tuple[Sweep, ...] = (
    Sweep(
        "append_short",
        {"batch": ("spec4", "pf37", "chunk"), "kv": (CONTIG, ("NHD", 16), ("NHD", 256)), "append_len": (1, 3)},
        {"append": True, "mask": "causal", "heads": (8, 2), "dims": (128, 128)},
    ),
    Sweep(
        "append_fp8",
        {"batch": ("dec", "spec4"), "descale": ("tensor", "head"), "append_len": (None, 1)},
        {"append": True, "quant": "fp8_e4m3", "mask": "causal", "heads": (8, 1), "dims": (128, 128), "kv": ("NHD", 16)},
        where=lambda p: p["batch"] != "dec" or p["append_len"] is None,  # every q_len 1: no short append
    ),
)


DEFAULT: tuple[Sweep, ...] = (
    Sweep(
        "core",
        {
            "batch": MAIN + ("pf1", "pf37", "sqgtsk"),
            "heads": HEADS,
            "dims": DIMS,
            "dtype": ("bf16", "fp16"),
            "mask": ("none", "causal"),
        },
        where=lambda p: p["heads"] != (32, 8) or p["dims"][0] in (64, 128),
    ),
    Sweep(
        "window",
        {
            "batch": ("pfvar", "dec", "chunk", "mixdf", "pf257"),
            "mask": ("w0-0", "w1-0", "w16-0", "cw127", "cw128", "w32-32", "w64-inf", "winf-16", "cw4096"),
            "dims": ((64, 64), (128, 128), (256, 256)),
            "dtype": ("bf16", "fp16"),
        },
        {"heads": (8, 2)},
    ),
    # windows with q_len > kv_len: where FA2 clamps an unbounded right side to sk (flash-attention 895)
    Sweep(
        "window_sqgtsk",
        {
            "batch": ("sqgtsk",),
            "mask": ("w1-0", "w16-0", "w32-32", "w64-inf", "winf-16", "cw128"),
            "dims": ((64, 64), (128, 128)),
        },
        {"heads": (8, 2)},
    ),
    Sweep(
        "softcap",
        {
            "batch": ("pfvar", "dec", "chunk", "mixdl"),
            "softcap": (30.0, 50.0),
            "mask": ("none", "causal", "cw128"),
            "dims": ((64, 64), (128, 128), (256, 256)),
            "dtype": ("bf16", "fp16"),
        },
        {"heads": (8, 2)},
    ),
    Sweep(
        "sinks",
        {
            "batch": ("pfvar", "dec", "spec4", "mixdf"),
            "mask": ("none", "causal", "cw128"),
            "heads": ((8, 8), (8, 2)),
            "dims": ((64, 64), (128, 128)),
            "dtype": ("bf16", "fp16"),
        },
        {"sinks": True},
    ),
    Sweep(
        "alibi",
        {
            "batch": ("pfvar", "dec", "chunk", "mixdl"),
            "mask": ("none", "causal", "cw128"),
            "heads": ((8, 8), (8, 2)),
            "dims": ((64, 64), (128, 128)),
        },
        {"alibi": True},
    ),
    Sweep(
        "paged",
        {
            "batch": ("dec", "spec4", "chunk", "mixdf", "pfvar"),
            "kv": PAGED,
            "mask": ("causal", "cw128"),
            "dims": ((64, 64), (128, 128)),
        },
        {"heads": (8, 2)},
    ),
    Sweep(
        "paged_dims",
        {
            "batch": ("dec", "mixdf"),
            "kv": (("NHD", 16), ("NHD", 256)),
            "dims": ((64, 64), (256, 256)),
            "mask": ("causal",),
            "sinks": (False, True),
            "softcap": (None, 30.0),
        },
        {"heads": (8, 1)},
    ),
    Sweep(
        "append",
        {
            "batch": ("dec", "spec4"),
            "kv": (CONTIG, ("NHD", 16), ("NHD", 256)),
            "mask": ("causal", "cw128"),
            "num_splits": (None, 1, 4),
        },
        {"append": True, "heads": (8, 2), "dims": (128, 128)},
        where=lambda p: not (p["kv"] != CONTIG and p["num_splits"] == 4),
    ),
    Sweep(
        "splits",
        {
            "batch": ("dec", "spec4"),
            "num_splits": (1, 2, 8),
            "dims": ((64, 64), (128, 128)),
            "mask": ("none", "causal"),
        },
        {"heads": (8, 2)},
    ),
    Sweep(
        "dv",
        {"batch": ("pfvar", "dec", "chunk"), "dims": ((192, 128), (128, 64), (64, 128)), "mask": ("none", "causal")},
        {"heads": (8, 2)},
    ),
    Sweep(
        "cross",
        {
            "batch": ("cross", "emptykv"),
            "heads": ((8, 8), (8, 2), (8, 1)),
            "dims": ((64, 64), (128, 128)),
            "sinks": (False, True),
        },
    ),
    Sweep(
        "chunk", {"batch": ("pfvar", "chunk", "mixdf"), "mask": ("chunk64", "cchunk64", "cchunk128")}, {"heads": (8, 2)}
    ),
    # a sliding window inside a 2k prefill, every FA3 head-dim template: where fa3-vllm's d 96/192/256 kernels
    # let keys right of the window into the LSE (found by the perf suite's 8k case; the fork's window schedule,
    # ledgers/fa3-vllm.toml)
    Sweep(
        "window_long",
        {"dims": ((64, 64), (96, 96), (128, 128), (192, 192), (256, 256))},
        {"batch": "pf2k", "mask": "cw512", "heads": (4, 4)},
    ),
    Sweep("scale", {"batch": ("pfvar", "dec"), "scale": (0.05, 0.3), "mask": ("none", "causal")}, {"heads": (8, 2)}),
    Sweep(
        "heads",
        {
            "batch": MAIN,
            "heads": ((16, 2), (64, 8), (12, 4), (6, 3)),
            "mask": ("causal", "cw128"),
            "dtype": ("bf16", "fp16"),
        },
        {"dims": (128, 128)},
    ),
    Sweep(
        "long",
        {"batch": ("pf4k", "dec16k", "chunk8k"), "mask": ("causal", "cw128"), "kv": (CONTIG, ("NHD", 256))},
        {"heads": (8, 1), "dims": (128, 128)},
    ),
) + (*QUANT_MLA, *APPEND)
