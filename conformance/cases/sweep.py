"""Sweep axes and the declarative grid: named batch compositions, masking modes, KV layouts, and
:class:`Sweep` (axes x constraint -> :class:`~conformance.cases.case.AttentionCase`).

Axis names used by the grids of :mod:`conformance.suites.registry`:

* ``batch``: a named batch composition from :data:`BATCHES` (prefill, decode, spec-decode,
  chunked prefill, mixed with decodes first or last, sq > sk, cross, empty kv, long contexts)
* ``heads``: (num_heads, num_kv_heads); ``dims``: (head_dim, head_dim_v); ``dtype``: bf16 / fp16
* ``kv``: ("contiguous", None) or (layout, block size), block sizes 1..256, NHD and HND
* ``mask``: a causal / window / chunk combination from :data:`MASKS`
* ``cp``: ``(cp_world, cp_rank)``, a context-parallel call over one rank's key shard (default ``(1, 0)``)
* any other case field by its own name, its value as it is (``softcap``, ``alibi``, ``sinks``, ``append``,
  ``append_len``, ``num_splits``, ``scale``, ``quant``, ``quant_q``, ``descale``, ``qv``, ``v_padded``,
  ``scheduler_metadata``, ``backward``, ``deterministic``, ``data``, ...); absent, the field's default

The case space itself (every axis, its canonical levels and the constraints between axes, which the covering arrays
of the suites and the fuzzer read) is data in :mod:`conformance.cases.space`: a new axis, level or constraint goes
where its docstring says (the one place that says it).  A new request list or mask is one entry in a table here; a
new case field is a grid key of its own name at once (:func:`build_case` reads every field the composite keys do not
set).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conformance.cases.case import AttentionCase

__all__ = ["BATCHES", "CONTIG", "MASKS", "MLA_DIMS", "MLA_PREFILL_DIMS", "MLA_SCALE", "PAGED", "Sweep", "build_case"]

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
    # MLA decode batches: 32 decodes of varied context (FlashMLA's shape: one q_len per batch), spec decode 2
    "mla32": tuple((1, 64 + 97 * i) for i in range(32)),
    "mlaspec2": ((2, 300), (2, 2), (2, 1500), (2, 64)),
    # the case space's batch shapes for 32+ q heads (space.WIDE_BATCH_SHAPES): long requests shortened
    "w_pfvar": ((136, 136), (1, 1), (33, 33)),
    "w_chunk": ((16, 160), (40, 300)),
    "w_mixdf": ((1, 200), (1, 33), (40, 40), (24, 150)),
    "w_mixdl": ((40, 40), (24, 150), (1, 200), (1, 33)),
    "w_cross": ((33, 150), (1, 77), (100, 20)),
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
    "cw512": (True, (512, None), None),
    "w32-32": (False, (32, 32), None),
    "w64-inf": (False, (64, None), None),
    "winf-16": (False, (None, 16), None),
    "cw4096": (True, (4096, None), None),
    "chunk64": (False, (None, None), 64),
    "cchunk64": (True, (None, None), 64),
    "cchunk128": (True, (None, None), 128),
}

#: DeepSeek's MLA softmax scale 1/sqrt(qk_nope 128 + rope 64), rounded: what the engines pass explicitly.
MLA_SCALE = 0.0722
#: MLA absorbed geometry (head_dim = rope 64, head_dim_v = latent 512) and seed 004's prefill dims.
MLA_DIMS, MLA_PREFILL_DIMS = (64, 512), (192, 128)

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


#: The case fields the composite grid keys set (``batch``, ``heads``, ``dims``, ``kv``, ``mask``, ``cp``); every other
#: field is a grid key of its own name, its value the field's (absent: the field's default).
_COMPOSED = frozenset(
    "requests batch_name num_heads num_kv_heads head_dim head_dim_v kv_layout block_size causal window chunk "
    "cp_world cp_rank".split()
)
_OWN_KEYS = frozenset(f.name for f in dataclasses.fields(AttentionCase)) - _COMPOSED


def build_case(point: Mapping[str, Any]) -> AttentionCase:
    """AttentionCase from a grid point (axis names as in the module docstring; keys that name nothing are ignored)."""
    batch = point.get("batch", "pfvar")
    h, hk = point.get("heads", (8, 2))
    d, dv = point.get("dims", (128, 128))
    layout, bs = point.get("kv", CONTIG)
    causal, window, chunk = MASKS[point.get("mask", "none")]
    cp_world, cp_rank = point.get("cp", (1, 0))
    return AttentionCase(
        requests=BATCHES[batch],
        num_heads=h,
        num_kv_heads=hk,
        head_dim=d,
        head_dim_v=None if dv == d else dv,
        kv_layout=layout,
        block_size=bs,
        causal=causal,
        window=window,
        chunk=chunk,
        cp_world=cp_world,
        cp_rank=cp_rank,
        batch_name=batch,
        **{key: value for key, value in point.items() if key in _OWN_KEYS},
    )
