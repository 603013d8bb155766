"""Named suites: unions of declarative sweeps (:mod:`conformance.cases.sweep`), deduplicated by case id and
returned in a stable order.  Adding a sweep or an axis value is a one-line change here; the runner,
reports and tests pick it up without edits.

Suites: ``smoke`` (~140 small cases, a minute on 2 CPU cores), ``default`` (~3,800, the CI suite on a GPU: 2,142
hand-picked sweep cases, 1,657 covering-array cases and the fuzzer's findings, :mod:`conformance.cases.found`),
``full`` (~15,900: 13,577 sweep cases with long contexts up to 32k, default's covering and found cases and 672
covering cases of its own), ``perf`` (long prefill and paged decode for timing
against the roofline), ``engines`` (engine replays).

Covering arrays (:mod:`conformance.cases.covering` over :mod:`conformance.cases.space`): ``default`` adds the
cases that make it cover every pair of levels of all axes and every triple of the kernel axes
(:data:`~conformance.cases.covering.DEFAULT_STRENGTHS`), ``full`` every triple of all axes
(:data:`~conformance.cases.covering.FULL_STRENGTHS`).  The generator is seeded with the sweep cases, so only
tuples they leave uncovered add cases, and the sweep cases keep their ids and come first; the tuples of plain
levels (:data:`~conformance.cases.space.PLAIN`) are covered by plain cases first (fa2 runs 819 of default's 1,657), so a
backend that refuses fp8, sinks or an HND cache still runs them; the added cases use the space's small canonical
batches.  ``attnconf cases --suite S --coverage [--backend B]`` prints the figures.  The added cases (and their
ids) change when the sweeps or the space change; the sweep cases never do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache

from conformance.cases import covering
from conformance.cases.case import AttentionCase
from conformance.cases.found import found_cases
from conformance.cases.sweep import BATCHES, CONTIG, MASKS, MLA_DIMS, MLA_PREFILL_DIMS, MLA_SCALE, PAGED, Sweep
from conformance.graphs.suite import graphs_suite
from conformance.models.suite import model_cases

__all__ = ["BATCHES", "MASKS", "Sweep", "SUITES", "all_case_ids", "covering_cases", "suite_names", "get_suite"]

_SMALL = ("s_pf", "s_dec", "s_spec", "s_mix")
_MAIN = ("pfvar", "dec", "spec4", "chunk", "mixdf", "mixdl")
_HEADS = ((8, 8), (8, 2), (8, 1), (32, 8))
_DIMS = ((32, 32), (64, 64), (96, 96), (128, 128), (256, 256))

SMOKE: tuple[Sweep, ...] = (
    Sweep(
        "core",
        {"batch": _SMALL, "heads": ((4, 4), (4, 1)), "mask": ("none", "causal"), "dtype": ("bf16", "fp16")},
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
)

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

DEFAULT: tuple[Sweep, ...] = (
    Sweep(
        "core",
        {
            "batch": _MAIN + ("pf1", "pf37", "sqgtsk"),
            "heads": _HEADS,
            "dims": _DIMS,
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
    # let keys left of the window into the LSE (found by the perf suite's 8k case, ledgers/fa3-vllm.toml)
    Sweep(
        "window_long",
        {"dims": ((64, 64), (96, 96), (128, 128), (192, 192), (256, 256))},
        {"batch": "pf2k", "mask": "cw512", "heads": (4, 4)},
    ),
    Sweep("scale", {"batch": ("pfvar", "dec"), "scale": (0.05, 0.3), "mask": ("none", "causal")}, {"heads": (8, 2)}),
    Sweep(
        "heads",
        {
            "batch": _MAIN,
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
) + QUANT_MLA

FULL: tuple[Sweep, ...] = DEFAULT + (
    Sweep(
        "core_x",
        {
            "batch": _MAIN + ("pf257", "cross"),
            "heads": _HEADS + ((16, 2),),
            "dims": _DIMS + ((80, 80), (160, 160)),
            "dtype": ("bf16", "fp16"),
            "mask": ("none", "causal", "cw128", "w32-32"),
            "sinks": (False, True),
        },
    ),
    Sweep(
        "paged_x",
        {
            "batch": _MAIN,
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
        {"batch": _MAIN, "mask": tuple(MASKS), "softcap": (None, 30.0), "alibi": (False, True), "sinks": (False, True)},
        {"heads": (8, 2), "dims": (128, 128)},
    ),
    Sweep(
        "window_x",
        {
            "batch": _MAIN,
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
            "batch": _MAIN + ("sqgtsk", "emptykv"),
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

#: Timing suite: long prefill (1k-32k, causal and windowed), paged decode (4k-128k), d 64/128/256, GQA 8.


def _perf_cases() -> list[AttentionCase]:
    cases = []
    for d in (64, 128, 256):
        for s in (1024, 4096, 8192, 16384, 32768):
            b = max(1, 32768 // s)
            for causal, window in ((True, (None, None)), (True, (4096, None)), (False, (None, None))):
                if window != (None, None) and s <= 4096:
                    continue
                if not causal and d != 128:
                    continue
                cases.append(
                    AttentionCase(
                        requests=tuple((s, s) for _ in range(b)),
                        num_heads=16,
                        num_kv_heads=16,
                        head_dim=d,
                        causal=causal,
                        window=window,
                        batch_name=f"pf{b}x{s}",
                    )
                )
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
    # GQA 8 prefill
    for s in (4096, 16384):
        cases.append(
            AttentionCase(
                requests=((s, s),) * (32768 // s),
                num_heads=64,
                num_kv_heads=8,
                head_dim=128,
                causal=True,
                batch_name=f"gqa_pf{32768 // s}x{s}",
            )
        )
    return cases


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


def _engine_cases() -> list[AttentionCase]:
    from conformance.engines import engine_cases  # the engines import the case model: import late

    return engine_cases()


#: The covering arrays' tie-breaking seed: changing it changes the added cases (and their ids).
COVERING_SEED = 0


@lru_cache(maxsize=None)
def covering_cases(name: str) -> tuple[AttentionCase, ...]:
    """The cases the covering arrays add to suite ``default`` or ``full`` (after its sweep cases), seeded with
    them (``full``: its sweeps and default's covering cases), plain tuples by plain cases first
    (:func:`conformance.cases.covering.cover`); built once per process (about 2 s and 4 s)."""
    if name == "default":
        base, strengths = _union(DEFAULT), covering.DEFAULT_STRENGTHS
    elif name == "full":
        base, strengths = _union(FULL, covering_cases("default")), covering.FULL_STRENGTHS
    else:
        raise ValueError(f"covering_cases: name must be 'default' or 'full', got {name!r}")
    return covering.cover(strengths, base, seed=COVERING_SEED)


SUITES: dict[str, Callable[[], list[AttentionCase]]] = {
    "smoke": lambda: _union(SMOKE),
    "default": lambda: _union(DEFAULT, covering_cases("default") + found_cases()),
    "full": lambda: _union(FULL, covering_cases("default") + covering_cases("full") + found_cases()),
    "perf": _perf_cases,
    "engines": _engine_cases,
    "models": model_cases,
    "graphs": graphs_suite,
}


def _union(sweeps: Sequence[Sweep], extra: Iterable[AttentionCase] = ()) -> list[AttentionCase]:
    seen: dict[str, AttentionCase] = {}
    for sweep in sweeps:
        for case in sweep.cases():
            seen.setdefault(case.id, case)
    for case in extra:
        seen.setdefault(case.id, case)
    return list(seen.values())


def suite_names() -> list[str]:
    return list(SUITES)


def all_case_ids() -> list[str]:
    """The case id of every case of every built-in suite (about 16,100; 5-10 s to build, the covering arrays
    included)."""
    return sorted({case.id for build in SUITES.values() for case in build()})


def get_suite(name: str) -> list[AttentionCase]:
    """Cases of a named suite, in a stable order; ``ValueError`` lists the names."""
    if name not in SUITES:
        raise ValueError(f"suite must be one of {suite_names()}, got {name!r}")
    return SUITES[name]()
