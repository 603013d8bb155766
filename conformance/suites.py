"""Named, declarative sweeps: each suite is a union of grids (axes x constraints).

A :class:`Sweep` crosses a few named axes; every combination passing its constraint becomes an
:class:`~conformance.case.AttentionCase`.  Suites are unions of sweeps, deduplicated by case id and
returned in a stable order.  Adding a sweep axis value is a one-line change here; the runner,
reports and tests pick it up without edits.

Axes (names used in the grids below):

* ``batch``: a named batch composition from :data:`BATCHES` (prefill, decode, spec-decode,
  chunked prefill, mixed with decodes first or last, sq > sk, cross, empty kv, long contexts)
* ``heads``: (num_heads, num_kv_heads): MHA, GQA ratios 2/4/8, MQA
* ``dims``: (head_dim, head_dim_v)
* ``dtype``: bf16 / fp16
* ``kv``: ("contiguous", None) or (layout, block size) with block sizes 1..256, NHD and HND
* ``mask``: causal / window / chunk combinations from :data:`MASKS`
* ``softcap``, ``alibi``, ``sinks``, ``append``, ``num_splits``, ``scale``

Suites: ``smoke`` (~100 small cases, a minute on 2 CPU cores), ``default`` (1,500+, the CI suite
on a GPU), ``full`` (10,000+, long contexts up to 32k), ``perf`` (long prefill and paged decode
for timing against the roofline).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .case import AttentionCase

__all__ = ["BATCHES", "MASKS", "Sweep", "SUITES", "suite_names", "get_suite"]

Req = tuple[tuple[int, int], ...]

#: Named batch compositions: (q_len, kv_len) per request; kv_len includes the new tokens.
BATCHES: dict[str, Req] = {
    "pf1": ((1, 1),),
    "pf37": ((37, 37),),
    "pf257": ((257, 257),),
    "pfvar": ((128, 128), (1, 1), (300, 300), (17, 17)),
    "dec": ((1, 16), (1, 300), (1, 1), (1, 1000)),
    "spec4": ((4, 300), (4, 77), (4, 1024)),
    "chunk": ((64, 512), (100, 1100)),
    "mixdf": ((1, 200), (1, 33), (128, 128), (50, 450)),
    "mixdl": ((128, 128), (50, 450), (1, 200), (1, 33)),
    "sqgtsk": ((40, 20), (9, 3), (16, 16)),
    "cross": ((77, 300), (1, 77), (200, 50)),
    "emptykv": ((5, 0), (3, 3), (1, 0)),
    # small versions for the CPU smoke suite
    "s_pf": ((33, 33), (1, 1), (70, 70)),
    "s_dec": ((1, 40), (1, 1), (1, 97)),
    "s_spec": ((3, 50), (3, 20)),
    "s_mix": ((1, 60), (24, 24), (10, 90)),
    # long contexts
    "pf2k": ((2048, 2048),),
    "pf4k": ((4096, 4096), (1000, 1000)),
    "dec16k": ((1, 16384), (1, 5000), (1, 9000), (1, 16384)),
    "chunk8k": ((512, 8192), (512, 4096)),
    "pf16k": ((16384, 16384),),
    "pf32k": ((32768, 32768),),
    "dec32k": tuple((1, 32768) for _ in range(4)),
    "chunk32k": ((2048, 32768),),
}

#: Masking modes: (causal, window, chunk).
MASKS: dict[str, tuple[bool, tuple[int | None, int | None], int | None]] = {
    "none": (False, (None, None), None),
    "causal": (True, (None, None), None),
    "w0-0": (False, (0, 0), None),
    "w1-0": (False, (1, 0), None),
    "w16-0": (False, (16, 0), None),
    "cw127": (True, (127, None), None),
    "cw128": (True, (128, None), None),
    "w32-32": (False, (32, 32), None),
    "w64-inf": (False, (64, None), None),
    "winf-16": (False, (None, 16), None),
    "cw4096": (True, (4096, None), None),
    "chunk64": (False, (None, None), 64),
    "cchunk64": (True, (None, None), 64),
    "cchunk128": (True, (None, None), 128),
}

CONTIG = ("contiguous", None)
PAGED = tuple((layout, bs) for layout in ("NHD", "HND") for bs in (1, 16, 32, 64, 128, 256))


@dataclass(frozen=True)
class Sweep:
    """A grid over named axes; ``fixed`` sets the other case fields; ``where`` filters combinations."""

    name: str
    axes: Mapping[str, Sequence[Any]]
    fixed: Mapping[str, Any] = field(default_factory=dict)
    where: Callable[[dict[str, Any]], bool] | None = None

    def points(self) -> Iterator[dict[str, Any]]:
        keys = list(self.axes)
        for values in itertools.product(*(self.axes[k] for k in keys)):
            point = {**self.fixed, **dict(zip(keys, values))}
            if self.where is None or self.where(point):
                yield point

    def cases(self) -> Iterator[AttentionCase]:
        for point in self.points():
            yield build_case(point)


def build_case(point: Mapping[str, Any]) -> AttentionCase:
    """AttentionCase from a grid point (axis names as in the module docstring)."""
    batch = point.get("batch", "pfvar")
    h, hk = point.get("heads", (8, 2))
    d, dv = point.get("dims", (128, 128))
    layout, bs = point.get("kv", CONTIG)
    causal, window, chunk = MASKS[point.get("mask", "none")]
    return AttentionCase(
        requests=BATCHES[batch],
        num_heads=h,
        num_kv_heads=hk,
        head_dim=d,
        head_dim_v=None if dv == d else dv,
        dtype=point.get("dtype", "bf16"),
        kv_layout=layout,
        block_size=bs,
        causal=causal,
        window=window,
        chunk=chunk,
        softcap=point.get("softcap"),
        alibi=point.get("alibi", False),
        sinks=point.get("sinks", False),
        scale=point.get("scale"),
        append=point.get("append", False),
        num_splits=point.get("num_splits"),
        batch_name=batch,
    )


def _no_sq_gt_sk_append(p: dict[str, Any]) -> bool:
    return not (p.get("append") and p.get("batch") in ("sqgtsk", "cross", "emptykv"))


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
)

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


SUITES: dict[str, Callable[[], list[AttentionCase]]] = {
    "smoke": lambda: _union(SMOKE),
    "default": lambda: _union(DEFAULT),
    "full": lambda: _union(FULL),
    "perf": _perf_cases,
}


def _union(sweeps: Sequence[Sweep]) -> list[AttentionCase]:
    seen: dict[str, AttentionCase] = {}
    for sweep in sweeps:
        for case in sweep.cases():
            seen.setdefault(case.id, case)
    return list(seen.values())


def suite_names() -> list[str]:
    return list(SUITES)


def get_suite(name: str) -> list[AttentionCase]:
    """Cases of a named suite, in a stable order; ``ValueError`` lists the names."""
    if name not in SUITES:
        raise ValueError(f"suite must be one of {suite_names()}, got {name!r}")
    return SUITES[name]()
