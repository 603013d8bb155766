"""The backward cases of the suites (issue 20): hand-picked sweeps and a covering array of the backward sub-space.

A backward case (``AttentionCase.backward``, :mod:`conformance.backward`) is a training call: contiguous packed
varlen keys, no cache, no quantization (:mod:`conformance.cases.backward_fields`).  :data:`BACKWARD_SPACE` is that
part of the case space (:mod:`conformance.cases.space`): every batch shape, the narrow heads levels (MHA, GQA
ratios 2, 3, 4 and 8, MQA), the equal head dims and d != dv (192/128), bf16 and fp16, every mask level, soft-cap,
ALiBi, sinks and a custom scale; the inference-only axes at their defaults.  :func:`backward_covering` covers every
pair of levels of it (:data:`STRENGTHS`) with backward cases, seeded with the hand-picked ones.

The hand-picked sweeps add what the space does not vary: the input distributions that Gaussian data misses
(``data``: outlier rows, near-one-hot softmax, an offset V where ``dP - D`` cancels;
:mod:`conformance.cases.data_inputs`), the deterministic backward (``deterministic``: gradients compared bitwise
run to run), long rows (a 2k prefill) and GQA/MQA x masks x dtypes at the head dims training uses.
:data:`SMOKE_BACKWARD` is a handful of small CPU-sized ones for ``smoke``; :data:`DEFAULT_BACKWARD` is
``default``'s (and ``full``'s).

Backward case ids carry ``_bwd`` / ``_bwddet`` (and ``_data<name>``), so no forward case id changes; the forward
suites' covering arrays are built without these cases, so their added cases do not change either.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from conformance.cases import covering, space
from conformance.cases.case import AttentionCase
from conformance.cases.space_axes import DIMS
from conformance.cases.sweep import Sweep

__all__ = ["BACKWARD_SPACE", "DEFAULT_BACKWARD", "SMOKE_BACKWARD", "STRENGTHS", "backward_covering"]

#: The backward sub-space of the case space (axis -> allowed levels; axes left out keep all their levels).
BACKWARD_SPACE: dict[str, tuple[Hashable, ...]] = {
    "heads": tuple(h for h in space.HEADS if h not in space.WIDE_HEADS),
    "dims": tuple(d for d in DIMS if d[0] == d[1] or d == (192, 128)),
    "dtype": ("bf16", "fp16"),
    "layout": ("contiguous",),
    "block_size": (None,),
    "quant": ("none",),
    "append": (False,),
    "num_splits": (None,),
    "descale": (None,),
    "quant_q": (True,),
    "qv": (False,),
    "v_padded": (False,),
    "scheduler_metadata": (False,),
    "cp": ((1, 0),),
}
#: Every pair of levels over all axes, inside :data:`BACKWARD_SPACE` (134 rows unseeded).
STRENGTHS = (covering.Strength(covering.ALL_AXES, 2),)

_BWD = {"backward": True}

SMOKE_BACKWARD: tuple[Sweep, ...] = (
    Sweep("bwd", {"batch": ("s_pf", "s_mix"), "heads": ((4, 2), (4, 1))}, {**_BWD, "mask": "causal", "dims": (64, 64)}),
    Sweep(
        "bwd_sinks", {"mask": ("w16-0",)}, {**_BWD, "batch": "s_pf", "sinks": True, "heads": (4, 2), "dims": (64, 64)}
    ),
    Sweep(
        "bwd_softcap",
        {"mask": ("causal",)},
        {**_BWD, "batch": "s_mix", "softcap": 30.0, "heads": (4, 2), "dims": (64, 64)},
    ),
    Sweep(
        "bwd_alibi",
        {"data": ("peaked",)},
        {**_BWD, "batch": "s_pf", "mask": "causal", "alibi": True, "dtype": "fp16", "heads": (4, 4), "dims": (32, 32)},
    ),
    Sweep(
        "bwd_dv",
        {"data": ("offset_v",)},
        {**_BWD, "batch": "s_spec", "mask": "none", "dtype": "fp16", "heads": (4, 2), "dims": (64, 32)},
    ),
    Sweep(
        "bwd_det",
        {"data": ("outliers",)},
        {**_BWD, "deterministic": True, "batch": "s_mix", "mask": "causal", "heads": (4, 2), "dims": (64, 64)},
    ),
)

DEFAULT_BACKWARD: tuple[Sweep, ...] = (
    Sweep(
        "bwd_core",
        {
            "batch": ("pfvar", "chunk", "mixdf"),
            "heads": ((8, 8), (8, 2), (8, 1)),
            "dims": ((64, 64), (128, 128), (256, 256)),
            "mask": ("none", "causal"),
            "dtype": ("bf16", "fp16"),
        },
        _BWD,
    ),
    Sweep(
        "bwd_mods",
        {"mask": ("causal", "cw128", "w32-32"), "softcap": (None, 30.0), "sinks": (False, True)},
        {**_BWD, "batch": "pfvar", "heads": (8, 2), "dims": (128, 128)},
    ),
    Sweep(
        "bwd_alibi",
        {"mask": ("none", "causal"), "heads": ((8, 8), (8, 2))},
        {**_BWD, "alibi": True, "batch": "pfvar", "dims": (128, 128)},
    ),
    Sweep(
        "bwd_dv",
        {"dims": ((192, 128), (128, 64), (64, 128)), "mask": ("none", "causal")},
        {**_BWD, "batch": "pfvar", "heads": (8, 2)},
    ),
    Sweep(
        "bwd_data",
        {
            "data": ("outliers", "peaked", "offset_v"),
            "mask": ("none", "causal", "cw128"),
            "dtype": ("bf16", "fp16"),
            "dims": ((64, 64), (128, 128)),
        },
        {**_BWD, "batch": "pfvar", "heads": (8, 2)},
    ),
    Sweep(
        "bwd_det",
        {"batch": ("pfvar", "chunk", "mixdf"), "heads": ((8, 8), (8, 2)), "mask": ("none", "causal")},
        {**_BWD, "deterministic": True, "dims": (128, 128)},
    ),
    # long rows: dS = P (dP - D) summed over 2k keys, where a low-precision D or row sum shows
    Sweep(
        "bwd_long",
        {"data": ("", "offset_v"), "mask": ("none", "causal")},
        {**_BWD, "batch": "pf2k", "heads": (4, 4), "dims": (128, 128)},
    ),
)


def backward_covering(base: Iterable[AttentionCase], seed: int = 0) -> tuple[AttentionCase, ...]:
    """The backward cases that, with the backward cases of ``base``, cover every pair of levels of
    :data:`BACKWARD_SPACE` (about 2 s; :func:`conformance.cases.suites.backward_cases` builds it once)."""
    seeds = [space.classify(c) for c in base if c.backward]
    rows = covering.covering_array(STRENGTHS, seeds=seeds, seed=seed, within=BACKWARD_SPACE)
    return tuple(space.build(row).replace(backward=True) for row in rows)
