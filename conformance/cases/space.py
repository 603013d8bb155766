"""The case space as data: every axis a suite varies, its canonical levels, and the constraints between axes.

One place describes what an attention call can be.  The covering arrays of the suites
(:mod:`conformance.cases.covering`), ``attnconf cases --coverage`` and the fuzzer (:mod:`conformance.fuzz`) all
read it, so a new axis, level or constraint is one entry here:

* a new level: append it to the axis's ``values`` (and, for ``batch`` / ``heads``, to :data:`BATCH_SHAPES` /
  :data:`HEADS`, which map a level to the small request list or head counts :func:`build` uses); teach
  :func:`classify` to bucket cases into it;
* a new axis: one :class:`Axis` in :data:`AXES` (its first value is the default, the value a case has when the
  axis does not apply), one line in :func:`build` and one in :func:`classify`;
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

import itertools
import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from conformance.cases.case import DESCALES, DTYPES, LAYOUTS, QUANTS, AttentionCase
from conformance.cases.sweep import BATCHES, MASKS, MLA_DIMS, build_case

__all__ = [
    "AXES",
    "BATCH_SHAPES",
    "CONSTRAINTS",
    "HEADS",
    "KERNEL_AXES",
    "PLAIN",
    "Axis",
    "Constraint",
    "build",
    "classify",
    "classify_batch",
    "classify_dims",
    "classify_heads",
    "classify_mask",
    "describe",
    "extensible",
    "possible_tuples",
    "valid",
    "valid_points",
    "violations",
]

Point = Mapping[str, Hashable]


@dataclass(frozen=True)
class Axis:
    """One degree of freedom: its canonical ``values`` (the first is the default) and whether it is one of
    the axes that interact inside kernels (``kernel``: covered at strength 3 by ``default``)."""

    name: str
    values: tuple[Hashable, ...]
    kernel: bool
    doc: str

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError(f"Axis {self.name!r}: values must not be empty")
        if len(set(self.values)) != len(self.values):
            raise ValueError(f"Axis {self.name!r}: values must be distinct, got {self.values!r}")

    @property
    def default(self) -> Hashable:
        return self.values[0]


@dataclass(frozen=True)
class Constraint:
    """A rule between axes.  ``rule`` takes the values of ``axes`` positionally; :meth:`allowed` works on a
    partial point and allows it while any axis the rule reads is unassigned."""

    name: str
    axes: tuple[str, ...]
    rule: Callable[..., bool]
    reason: str

    def allowed(self, point: Point) -> bool:
        if any(a not in point for a in self.axes):
            return True
        return bool(self.rule(*(point[a] for a in self.axes)))


# ---------------------------------------------------------------------------------------------- levels
#: Batch-shape level -> the small request list (a :data:`~conformance.cases.sweep.BATCHES` name) built for it.
BATCH_SHAPES: dict[str, str] = {
    "prefill": "pfvar",  # several sequences, q_len == kv_len (one of them a single token)
    "prefill-single": "pf37",  # one sequence, q_len == kv_len > 1
    "single-token": "pf1",  # every request (1, 1)
    "decode": "dec",  # every q_len 1, kv_len > 1 somewhere
    "spec-decode": "spec4",  # one q_len 2..16 for every request, q_len <= kv_len
    "chunked": "chunk",  # 1 < q_len < kv_len (chunked prefill), no decodes
    "mixed-decode-first": "mixdf",  # decodes, then prefills / chunks
    "mixed-decode-last": "mixdl",  # prefills / chunks, then decodes
    "sq>sk": "sqgtsk",  # some q_len > kv_len, none below
    "cross": "cross",  # q_len above kv_len in some requests and below in others (encoder-decoder)
    "empty-kv": "emptykv",  # some kv_len == 0
}
#: Heads level -> (num_heads, num_kv_heads).
HEADS: dict[str, tuple[int, int]] = {
    "gqa4": (8, 2),
    "mha": (8, 8),
    "gqa2": (8, 4),
    "gqa3": (12, 4),  # a ratio that is not a power of two
    "gqa8": (16, 2),  # ratio 8 and above
    "mqa": (8, 1),
}
_EQUAL_DIMS = (32, 40, 64, 80, 96, 112, 128, 160, 192, 256)
#: d != dv levels: seed 004's MLA prefill (dv < d) and MLA's absorbed rope 64 + latent 512 (dv > d).
_DV_LT_D, _DV_GT_D = (192, 128), MLA_DIMS
_BLOCK_SIZES = (1, 16, 32, 64, 128, 256)
#: Mask levels (keys of :data:`~conformance.cases.sweep.MASKS`), one per masking mode.
_MASK_LEVELS = ("none", "causal", "w0-0", "w16-0", "cw128", "w32-32", "w64-inf", "winf-16", "chunk64", "cchunk64")
_SOFTCAP, _SCALE, _SPLITS = 30.0, 0.3, 3
assert set(_MASK_LEVELS) <= set(MASKS) and all(b in BATCHES for b in BATCH_SHAPES.values())

_AXES: tuple[Axis, ...] = (
    Axis(
        "batch",
        tuple(BATCH_SHAPES),
        True,
        "batch composition (request list shape); see BATCH_SHAPES and classify_batch",
    ),
    Axis("heads", tuple(HEADS), True, "q heads / kv heads: MHA, GQA ratio 2, 3, 4, 8+, MQA (HEADS)"),
    Axis(
        "dims",
        tuple((d, d) for d in (128,) + tuple(x for x in _EQUAL_DIMS if x != 128)) + (_DV_LT_D, _DV_GT_D),
        True,
        "(head_dim, head_dim_v): equal dims 32..256 (40, 80, 96, 112, 160, 192 included), 192/128, 64/512",
    ),
    Axis("dtype", tuple(DTYPES), True, "activation and output dtype"),
    Axis("layout", LAYOUTS, True, "KV layout: contiguous, or a paged cache NHD / HND"),
    Axis("block_size", (None,) + _BLOCK_SIZES, True, "paged block size (None: contiguous)"),
    Axis("mask", _MASK_LEVELS, True, "masking mode (a MASKS key): causal / window / chunk combination"),
    Axis("quant", tuple(QUANTS), True, "quantization mode (case.QUANTS)"),
    Axis("softcap", (None, _SOFTCAP), False, "logits soft-cap"),
    Axis("alibi", (False, True), False, "ALiBi slopes"),
    Axis("sinks", (False, True), False, "per-head attention sinks"),
    Axis("append", (False, True), False, "the kernel appends the new k/v to the cache"),
    Axis("num_splits", (None, 1, _SPLITS), False, "split-KV: heuristic (None), 1, pinned > 1"),
    Axis("scale", (None, _SCALE), False, "softmax scale: default or custom"),
    Axis(
        "descale",
        (None,) + tuple(dict.fromkeys(m for modes in DESCALES.values() for m in modes)),
        False,
        "descale granularity (None: the quant family's default)",
    ),
    Axis("quant_q", (True, False), False, "q (and qv) quantized with k, v (False: fp8 k/v only)"),
    Axis("qv", (False, True), False, "MLA absorbed query part scored against V"),
    Axis("v_padded", (False, True), False, "V zero-padded to head_dim, output stripped back (seed 004)"),
    Axis("scheduler_metadata", (False, True), False, "precomputed FA3 scheduler metadata"),
    Axis("cp", ((1, 0), (2, 1)), False, "context parallel (cp_world, cp_rank): off, or one rank's key shard"),
)
#: Every axis by name, in a fixed order (kernel axes first).
AXES: dict[str, Axis] = {a.name: a for a in _AXES}
#: The axes that interact inside kernels (covered at strength 3 by ``default``).
KERNEL_AXES: tuple[str, ...] = tuple(a.name for a in _AXES if a.kernel)


# ---------------------------------------------------------------------------------------------- constraints
def _requests_of(batch: str) -> tuple[tuple[int, int], ...]:
    return BATCHES[BATCH_SHAPES[batch]]


def _family(quant: str) -> str | None:
    return None if quant == "none" else quant.split("_")[0]


#: The constraints between axes: what AttentionCase rejects, and the semantic rule for qv.
CONSTRAINTS: tuple[Constraint, ...] = (
    Constraint(
        "block_size_iff_paged",
        ("layout", "block_size"),
        lambda layout, bs: (layout == "contiguous") == (bs is None),
        "block_size is set exactly when kv_layout is paged (NHD/HND); a contiguous cache has no blocks",
    ),
    Constraint(
        "append_needs_q_le_kv",
        ("append", "batch"),
        lambda append, batch: not append or all(q <= k for q, k in _requests_of(batch)),
        "append writes the q_len new tokens as the last keys, so every request needs q_len <= kv_len",
    ),
    Constraint(
        "append_without_quant",
        ("append", "quant"),
        lambda append, quant: not (append and quant != "none"),
        "engines quantize new keys while writing the cache, before the kernel reads it: no append with quant",
    ),
    Constraint(
        "quant_needs_16bit_dtype",
        ("quant", "dtype"),
        lambda quant, dtype: quant == "none" or dtype in ("bf16", "fp16"),
        "a quantized case's activation and output dtype is bf16 or fp16",
    ),
    Constraint(
        "descale_per_family",
        ("quant", "descale"),
        lambda quant, descale: (
            descale is None if _family(quant) is None else descale in (None, *DESCALES[_family(quant)])
        ),
        "descales exist only for a quantized case: per tensor or per (sequence, kv head) for fp8, per token for int8",
    ),
    Constraint(
        "quant_q_only_fp8",
        ("quant", "quant_q"),
        lambda quant, quant_q: quant_q or _family(quant) == "fp8",
        "only fp8 can leave q in the activation dtype (fp8 k/v only); int8 types quantize q by definition",
    ),
    Constraint(
        "qv_needs_mla_dims",
        ("qv", "dims"),
        lambda qv, dims: not qv or tuple(dims) == MLA_DIMS,
        "qv is MLA's absorbed query: rope head_dim 64 scored with K, latent head_dim_v 512 scored with V",
    ),
    Constraint(
        "qv_not_int8",
        ("qv", "quant"),
        lambda qv, quant: not (qv and _family(quant) == "int8"),
        "seed 001's int8 types have no MLA path",
    ),
    Constraint(
        "cp_needs_causal_mask",
        ("cp", "mask"),
        lambda cp, mask: cp == (1, 0) or mask == "causal",
        "cp_world > 1 needs causal=True without window or chunk (the kernel applies cp_* in its causal mask only)",
    ),
    Constraint(
        "cp_without_alibi_or_append",
        ("cp", "alibi", "append"),
        lambda cp, alibi, append: cp == (1, 0) or not (alibi or append),
        "cp_world > 1 cannot be combined with ALiBi or append (positions are absolute under cp)",
    ),
    Constraint(
        "v_padded_needs_dv_lt_d",
        ("v_padded", "dims"),
        lambda v_padded, dims: not v_padded or dims[1] < dims[0],
        "v_padded zero-pads V to head_dim, so head_dim_v < head_dim",
    ),
)


#: The plain sub-space: on the kernel axes, the levels every kernel family served here handles (equal head dims,
#: bf16 / fp16, a contiguous or NHD cache, masks without chunking, no quantization); every other axis at its
#: default (no soft-cap, ALiBi, sinks, append, pinned splits, custom scale, qv, padded V, scheduler metadata).
#: Not a constraint: the space keeps every level.  The suites' covering arrays cover it first (``covering.py``),
#: so a tuple of plain levels is covered by a plain case, which a backend that refuses some extension still
#: runs, rather than only by a case that also carries fp8, sinks or an HND cache.
PLAIN: dict[str, tuple[Hashable, ...]] = {
    "dims": tuple(d for d in AXES["dims"].values if d[0] == d[1]),
    "dtype": ("bf16", "fp16"),
    "layout": ("contiguous", "NHD"),
    "mask": tuple(m for m in _MASK_LEVELS if "chunk" not in m),
    "quant": ("none",),
    **{a.name: (a.default,) for a in _AXES if not a.kernel},
}


def violations(point: Point) -> list[str]:
    """``"name: reason"`` of every constraint the (possibly partial) point breaks, and of unknown axes or values."""
    out = [f"unknown axis {a!r}: axes are {list(AXES)}" for a in point if a not in AXES]
    out += [
        f"{a}: {v!r} is not a level of {a} ({list(AXES[a].values)})"
        for a, v in point.items()
        if a in AXES and v not in AXES[a].values
    ]
    out += [f"{c.name}: {c.reason}" for c in CONSTRAINTS if not c.allowed(point)]
    return out


def valid(point: Point) -> bool:
    """True when the point names only known axes and levels and breaks no constraint (a partial point is
    checked on the axes it assigns; :func:`extensible` says whether it extends to a valid full point)."""
    return not violations(point)


# ---------------------------------------------------------------------------------------------- exact search
def _components() -> list[tuple[str, ...]]:
    """Axes grouped into connected components of the constraint graph (singletons for unconstrained axes)."""
    parent = {a: a for a in AXES}

    def find(a: str) -> str:
        while parent[a] != a:
            a = parent[a]
        return a

    for c in CONSTRAINTS:
        for a, b in itertools.pairwise(c.axes):
            parent[find(a)] = find(b)
    groups: dict[str, list[str]] = {}
    for a in AXES:
        groups.setdefault(find(a), []).append(a)
    return [tuple(g) for g in groups.values()]


COMPONENTS: tuple[tuple[str, ...], ...] = tuple(_components())
_COMPONENT_OF: dict[str, tuple[str, ...]] = {a: comp for comp in COMPONENTS for a in comp}


Within = tuple[tuple[str, tuple[Hashable, ...]], ...]


def _within_key(within: Mapping[str, Iterable[Hashable]] | None) -> Within:
    """A sub-space (axis -> allowed levels; axes left out keep all) as a hashable cache key."""
    if within is None:
        return ()
    unknown = [a for a in within if a not in AXES]
    if unknown:
        raise ValueError(f"within: unknown axes {unknown}; axes are {list(AXES)}")
    return tuple((a, tuple(within[a])) for a in AXES if a in within)


@lru_cache(maxsize=None)
def _component_points(component: tuple[str, ...], within: Within = ()) -> tuple[tuple[Hashable, ...], ...]:
    """Every valid assignment of one component's axes (in component order) inside the sub-space, by
    backtracking: a brute force, for tests (the component of ``cp`` / ``quant`` / ``dims`` has about 10**5
    points; :func:`_eliminate` answers projections and extensibility without listing them)."""
    rules = [c for c in CONSTRAINTS if set(c.axes) <= set(component)]
    allowed = dict(within)
    out: list[tuple[Hashable, ...]] = []

    def extend(partial: dict[str, Hashable], i: int) -> None:
        if i == len(component):
            out.append(tuple(partial[a] for a in component))
            return
        axis = component[i]
        for value in AXES[axis].values:
            if axis in allowed and value not in allowed[axis]:
                continue
            partial[axis] = value
            if all(c.allowed(partial) for c in rules):
                extend(partial, i + 1)
            del partial[axis]

    extend({}, 0)
    return tuple(out)


Relation = tuple[tuple[str, ...], frozenset[tuple[Hashable, ...]]]


def _join(a: Relation, b: Relation) -> Relation:
    """Natural join of two relations (scope, rows)."""
    (sa, ra), (sb, rb) = a, b
    shared = [x for x in sa if x in sb]
    extra = tuple(x for x in sb if x not in sa)
    ia, ib = [sa.index(x) for x in shared], [sb.index(x) for x in shared]
    ie = [sb.index(x) for x in extra]
    index: dict[tuple[Hashable, ...], list[tuple[Hashable, ...]]] = {}
    for row in rb:
        index.setdefault(tuple(row[i] for i in ib), []).append(tuple(row[i] for i in ie))
    rows = frozenset(row + tail for row in ra for tail in index.get(tuple(row[i] for i in ia), ()))
    return sa + extra, rows


@lru_cache(maxsize=None)
def _eliminate(
    component: tuple[str, ...], domains: tuple[tuple[Hashable, ...], ...], keep: tuple[str, ...]
) -> frozenset[tuple[Hashable, ...]]:
    """The tuples of ``keep`` (axes of ``component``) that extend to a valid assignment of the whole component
    with each axis in its domain (``domains``: in component order), by variable elimination: the constraints
    as relations, each other axis joined out in turn (the one with the smallest joined table first).  Exact,
    and fast on the space's nearly tree-shaped constraint graph, where listing the component's points is not."""
    dom = dict(zip(component, domains))
    factors: list[Relation] = [((a,), frozenset((v,) for v in dom[a])) for a in component]
    for c in CONSTRAINTS:
        if set(c.axes) <= set(component):
            scope = tuple(dict.fromkeys(c.axes))
            rows = frozenset(
                vals
                for vals in itertools.product(*(dom[a] for a in scope))
                if c.rule(*(vals[scope.index(a)] for a in c.axes))
            )
            factors.append((scope, rows))
    todo = [a for a in component if a not in keep]

    def cost(axis: str) -> int:
        scope = {x for s, _ in factors if axis in s for x in s}
        return math.prod(len(dom[x]) for x in scope)

    while todo:
        axis = min(todo, key=cost)
        todo.remove(axis)
        involved = [f for f in factors if axis in f[0]]
        factors = [f for f in factors if axis not in f[0]]
        joined = involved[0]
        for f in involved[1:]:
            joined = _join(joined, f)
        scope, rows = joined
        i = scope.index(axis)
        factors.append((scope[:i] + scope[i + 1 :], frozenset(r[:i] + r[i + 1 :] for r in rows)))
    result: Relation = ((), frozenset({()}))
    for f in factors:
        result = _join(result, f)
    scope, rows = result
    idx = [scope.index(a) for a in keep]
    return frozenset(tuple(r[i] for i in idx) for r in rows)


def _domains(
    component: tuple[str, ...], within: Within, fixed: Point | None = None
) -> tuple[tuple[Hashable, ...], ...]:
    allowed = dict(within)
    fixed = fixed or {}
    return tuple(
        (fixed[a],) if a in fixed else tuple(v for v in AXES[a].values if a not in allowed or v in allowed[a])
        for a in component
    )


@lru_cache(maxsize=None)
def _component_projection(
    component: tuple[str, ...], axes: tuple[str, ...], within: Within = ()
) -> frozenset[tuple[Hashable, ...]]:
    inside = tuple(w for w in within if w[0] in component)
    return _eliminate(component, _domains(component, inside), axes)


@lru_cache(maxsize=None)
def _component_extensible(
    component: tuple[str, ...], assigned: tuple[tuple[str, Hashable], ...], within: Within
) -> bool:
    inside = tuple(w for w in within if w[0] in component)
    return bool(_eliminate(component, _domains(component, inside, dict(assigned)), ()))


def extensible(point: Point, within: Mapping[str, Iterable[Hashable]] | None = None) -> bool:
    """True when the partial point extends to a valid full point (inside the sub-space ``within``: axis ->
    allowed levels); exact, per constraint component."""
    if violations(point):
        return False
    key = _within_key(within)
    by_comp: dict[tuple[str, ...], list[str]] = {}
    for a in point:
        by_comp.setdefault(_COMPONENT_OF[a], []).append(a)
    for comp, axes in by_comp.items():
        if len(axes) <= 3:  # small projections are shared by many queries
            ordered = tuple(a for a in comp if a in axes)
            if tuple(point[a] for a in ordered) not in _component_projection(comp, ordered, key):
                return False
        elif not _component_extensible(comp, tuple((a, point[a]) for a in comp if a in axes), key):
            return False
    return True


def possible_tuples(
    axes: tuple[str, ...], within: Mapping[str, Iterable[Hashable]] | None = None
) -> frozenset[tuple[Hashable, ...]]:
    """Every tuple of values of ``axes`` that occurs in some valid full point (inside the sub-space ``within``):
    exact, as the product over constraint components of each component's projection (components constrain
    independently)."""
    return _possible_tuples(tuple(axes), _within_key(within))


@lru_cache(maxsize=None)
def _possible_tuples(axes: tuple[str, ...], within: Within) -> frozenset[tuple[Hashable, ...]]:
    parts: list[tuple[tuple[int, ...], frozenset[tuple[Hashable, ...]]]] = []
    for comp in dict.fromkeys(_COMPONENT_OF[a] for a in axes):
        ordered = tuple(a for a in comp if a in axes)
        parts.append((tuple(axes.index(a) for a in ordered), _component_projection(comp, ordered, within)))
    out = set()
    for combo in itertools.product(*(sorted(proj, key=repr) for _, proj in parts)):
        values: list[Hashable] = [None] * len(axes)
        for (positions, _), part in zip(parts, combo):
            for i, v in zip(positions, part):
                values[i] = v
        out.add(tuple(values))
    return frozenset(out)


def valid_points(
    axes: tuple[str, ...], within: Mapping[str, Iterable[Hashable]] | None = None
) -> Iterator[tuple[Hashable, ...]]:
    """:func:`possible_tuples` of ``axes`` in level order."""
    rank = {a: {v: i for i, v in enumerate(AXES[a].values)} for a in axes}
    yield from sorted(possible_tuples(tuple(axes), within), key=lambda t: tuple(rank[a][v] for a, v in zip(axes, t)))


# ---------------------------------------------------------------------------------------------- build
def build(point: Point) -> AttentionCase:
    """The AttentionCase of a point, through the sweep builder.  Axes the point leaves out take the first level
    that keeps it valid (the axis default where that is allowed: ``{"layout": "NHD"}`` gets block size 1,
    ``{"qv": True}`` the MLA dims).

    Raises ``ValueError`` naming the axis for an unknown axis or level, and naming the constraint for a point
    that breaks one."""
    problems = violations(point)
    if problems:
        raise ValueError("invalid case-space point: " + "; ".join(problems))
    if not extensible(point):
        raise ValueError(f"invalid case-space point: {dict(point)!r} does not extend to a valid case")
    p = dict(point)
    for name, axis in AXES.items():
        if name not in p:
            p[name] = next(v for v in axis.values if extensible({**p, name: v}))
    return build_case(
        {
            "batch": BATCH_SHAPES[p["batch"]],
            "heads": HEADS[p["heads"]],
            "dims": p["dims"],
            "dtype": p["dtype"],
            "kv": (p["layout"], p["block_size"]),
            "mask": p["mask"],
            "softcap": p["softcap"],
            "alibi": p["alibi"],
            "sinks": p["sinks"],
            "append": p["append"],
            "num_splits": p["num_splits"],
            "scale": p["scale"],
            "quant": p["quant"],
            "descale": p["descale"],
            "quant_q": p["quant_q"],
            "qv": p["qv"],
            "v_padded": p["v_padded"],
            "scheduler_metadata": p["scheduler_metadata"],
            "cp": p["cp"],
        }
    )


# ---------------------------------------------------------------------------------------------- classify
def classify_batch(requests: tuple[tuple[int, int], ...]) -> str:
    """Batch-shape level of a request list (rules in order; the first that matches wins):
    any kv_len 0 -> empty-kv; all (1, 1) -> single-token; some q_len > kv_len -> cross if another request has
    q_len < kv_len else sq>sk; all q_len == kv_len -> prefill (several) / prefill-single; all q_len 1 ->
    decode; decodes with longer queries -> mixed-decode-first when the decodes come first (or the first request
    is one), else mixed-decode-last; one q_len 2..16 for all -> spec-decode; else chunked."""
    reqs = tuple(requests)
    if any(k == 0 for _, k in reqs):
        return "empty-kv"
    if all(r == (1, 1) for r in reqs):
        return "single-token"
    if any(q > k for q, k in reqs):
        return "cross" if any(q < k for q, k in reqs) else "sq>sk"
    if all(q == k for q, k in reqs):
        return "prefill" if len(reqs) > 1 else "prefill-single"
    if all(q == 1 for q, _ in reqs):
        return "decode"
    if any(q == 1 for q, _ in reqs):
        is_dec = [q == 1 for q, _ in reqs]
        decodes_first = is_dec == sorted(is_dec, reverse=True)
        decodes_last = is_dec == sorted(is_dec)
        if decodes_first or (not decodes_last and is_dec[0]):
            return "mixed-decode-first"
        return "mixed-decode-last"
    qs = {q for q, _ in reqs}
    if len(qs) == 1 and 2 <= next(iter(qs)) <= 16:
        return "spec-decode"
    return "chunked"


def classify_heads(num_heads: int, num_kv_heads: int) -> str:
    """Heads level: mha (equal), mqa (one kv head), gqa2 / gqa4 / gqa8 (power-of-two ratio; 16+ -> gqa8),
    gqa3 (any other ratio)."""
    if num_heads == num_kv_heads:
        return "mha"
    if num_kv_heads == 1:
        return "mqa"
    ratio = num_heads // num_kv_heads
    if ratio & (ratio - 1):
        return "gqa3"
    return {2: "gqa2", 4: "gqa4"}.get(ratio, "gqa8")


def classify_dims(head_dim: int, head_dim_v: int) -> tuple[int, int]:
    """Dims level: the nearest equal-dims level (ties to the smaller), or 192/128 when head_dim_v < head_dim,
    64/512 when head_dim_v > head_dim."""
    if head_dim_v < head_dim:
        return _DV_LT_D
    if head_dim_v > head_dim:
        return _DV_GT_D
    d = min(_EQUAL_DIMS, key=lambda x: (abs(x - head_dim), x))
    return (d, d)


def classify_mask(causal: bool, window: tuple[int | None, int | None], chunk: int | None) -> str:
    """Mask level: chunk -> cchunk64 / chunk64 (with causal or not); causal with a left window -> cw128,
    otherwise causal; without causal: no window -> none, (0, 0) -> w0-0, (l, 0) -> w16-0, left and right
    bounded -> w32-32, left only -> w64-inf, right only -> winf-16."""
    left, right = window
    if chunk is not None:
        return "cchunk64" if causal else "chunk64"
    if causal:
        return "cw128" if left is not None else "causal"
    if left is None and right is None:
        return "none"
    if left is None:
        return "winf-16"
    if right is None:
        return "w64-inf"
    if left == 0 and right == 0:
        return "w0-0"
    if right == 0:
        return "w16-0"
    return "w32-32"


def _nearest_block(bs: int) -> int:
    return min(_BLOCK_SIZES, key=lambda x: (abs(math.log2(x) - math.log2(bs)), x))


def classify(case: AttentionCase) -> dict[str, Hashable]:
    """The level of every axis for any AttentionCase (bucketed to the nearest level; see the classify_* rules).

    Engine fields are not an axis; the call an engine replay makes is classified by its other fields."""
    return {
        "batch": classify_batch(case.requests),
        "heads": classify_heads(case.num_heads, case.num_kv_heads),
        "dims": classify_dims(case.head_dim, case.dv),
        "dtype": case.dtype,
        "layout": case.kv_layout,
        "block_size": None if case.block_size is None else _nearest_block(case.block_size),
        "mask": classify_mask(case.causal, case.window, case.chunk),
        "quant": case.quant,
        "softcap": None if case.softcap is None else _SOFTCAP,
        "alibi": case.alibi,
        "sinks": case.sinks,
        "append": case.append,
        "num_splits": None if case.num_splits is None else (1 if case.num_splits <= 1 else _SPLITS),
        "scale": None if case.scale is None else _SCALE,
        "descale": case.descale,
        "quant_q": case.quant_q,
        "qv": case.qv,
        "v_padded": case.v_padded,
        "scheduler_metadata": case.scheduler_metadata,
        "cp": (1, 0) if case.cp_world == 1 else (2, 1),
    }


def describe(point: Point) -> str:
    """``axis=value`` pairs, for messages and groupings."""
    return ", ".join(f"{a}={_fmt(v)}" for a, v in point.items())


def _fmt(value: Any) -> str:
    if isinstance(value, tuple):
        return "/".join(str(x) for x in value)
    return str(value)
