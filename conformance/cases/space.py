"""The case space as data: every axis a suite varies, its canonical levels, and the constraints between axes.

The space is split by concern: :mod:`.space_axes` (axes, levels, constraints, :data:`PLAIN`),
:mod:`.space_search` (exact extensibility and possible tuples), :mod:`.space_classify` (any case to its levels);
this module builds a point's case and re-exports every name, so ``from conformance.cases.space import X``
is the one import.

One place describes what an attention call can be.  The covering arrays of the suites
(:mod:`conformance.cases.covering`), ``attnconf cases --coverage`` and the fuzzer (:mod:`conformance.fuzz`) all
read it, so a new axis, level or constraint is one entry here (this list is the one place that says how; the
package docstring, :mod:`.sweep`, ``docs/reference/layout.md`` and the add-an-axis guide point here):

* a new level: append it to the axis's ``values`` (and, for ``batch`` / ``heads``, to :data:`BATCH_SHAPES` /
  :data:`HEADS`, which map a level to the small request list or head counts :func:`build` uses; a heads level
  of a real model is one :data:`HEAD_MODELS` entry naming its registry model); teach :func:`classify` to bucket
  cases into it; the axis's earlier levels in :data:`EARLIER` keep the cases the covering arrays added before it;
* a new axis: one :class:`Axis` in :data:`AXES` (its first value is the default, the value a case has when the
  axis does not apply), one line in :func:`build` and one in :func:`classify`; an axis named after a case field
  whose level is the field's value is instead ``levels`` (and ``level``) in the field's row
  (:mod:`conformance.cases.fields`) and ``field_axis(name)`` in :data:`AXES`, which build and classify read;
* a new constraint: one :class:`Constraint` in :data:`CONSTRAINTS`.

Constraints encode only what the case model itself rejects (:meth:`AttentionCase._problems`) and what the
semantics define (qv is MLA's absorbed query); what some *kernel* does not support is never a constraint
here: adapters refuse such cases as ``unsupported``, and the cases stay in the space so every backend is asked.

:func:`classify` buckets ANY :class:`~conformance.cases.case.AttentionCase` (hand-picked sweep cases, long
contexts, random fuzz draws with arbitrary request lists, head dims and windows) to the nearest level of every
axis, so coverage can be measured on any suite and fuzz failures grouped by axis values.  ``classify(build(p))
== p`` for every valid full point ``p``.
"""

from __future__ import annotations

from conformance.cases import space_axes
from conformance.cases.case import AttentionCase
from conformance.cases.space_axes import *  # noqa: F403  (re-exports every name of space_axes.__all__)
from conformance.cases.space_axes import (
    AXES,
    BATCH_SHAPES,
    FIELD_AXES,
    HEADS,
    WIDE_BATCH_SHAPES,
    WIDE_HEADS,
    Point,
    short_append_len,
    violations,
)
from conformance.cases.space_classify import (
    classify,
    classify_append,
    classify_batch,
    classify_dims,
    classify_heads,
    classify_mask,
    describe,
)
from conformance.cases.space_search import COMPONENTS, extensible, possible_tuples, valid_points
from conformance.cases.space_search import _COMPONENT_OF as _COMPONENT_OF  # re-exported for the tests
from conformance.cases.space_search import _component_points as _component_points  # the tests' brute force
from conformance.cases.sweep import BATCHES, build_case

__all__ = [
    *space_axes.__all__,
    "COMPONENTS",
    "build",
    "classify",
    "classify_append",
    "classify_batch",
    "classify_dims",
    "classify_heads",
    "classify_mask",
    "describe",
    "extensible",
    "possible_tuples",
    "valid_points",
]


# ---------------------------------------------------------------------------------------------- build
def build(point: Point) -> AttentionCase:
    """The AttentionCase of a point, through the sweep builder.  Axes the point leaves out take the first level
    that keeps it valid (the axis default where that is allowed: ``{"layout": "NHD"}`` gets block size 1,
    ``{"qv": True}`` the MLA dims).  A wide heads level (32 q heads or more, :data:`WIDE_HEADS`) gets the
    shortened request list of its batch shape (:data:`WIDE_BATCH_SHAPES`); the ``short`` append level gets the
    ``append_len`` of :func:`short_append_len` over that list.

    Raises ``ValueError`` naming the axis for an unknown axis or level, and naming the constraint for a point
    that breaks one."""
    problems = violations(point)
    if problems:
        raise ValueError("invalid case-space point: " + "; ".join(problems))
    if len(point) < len(AXES) and not extensible(point):  # a full point without violations is valid
        raise ValueError(f"invalid case-space point: {dict(point)!r} does not extend to a valid case")
    p = dict(point)
    for name, axis in AXES.items():
        if name not in p:
            p[name] = next(v for v in axis.values if extensible({**p, name: v}))
    heads, shape = p["heads"], p["batch"]
    assert isinstance(heads, str) and isinstance(shape, str)  # levels of the heads and batch axes (checked above)
    batch = (WIDE_BATCH_SHAPES if heads in WIDE_HEADS else BATCH_SHAPES)[shape]
    return build_case(
        {
            "batch": batch,
            "heads": HEADS[heads],
            "dims": p["dims"],
            "kv": (p["layout"], p["block_size"]),
            "mask": p["mask"],
            "append": p["append"] is not False,
            "append_len": short_append_len(BATCHES[batch]) if p["append"] == "short" else None,
            "cp": p["cp"],
            **{name: p[name] for name in FIELD_AXES},
        }
    )
