"""The case space's axes, their levels and the constraints between them (:mod:`conformance.cases.space` re-exports
every name here; see its docstring for how the space is used).

The levels that real models have are read from the model registry (:mod:`conformance.models`, ``data/*.toml``,
each entry citing its published config) rather than typed here: the wide head-count levels name the model they
come from (:data:`HEAD_MODELS`) and the MLA head dims are DeepSeek V3's :class:`~conformance.models.registry.MLA`
dims.  A registry edit that changes such a model moves its level with it (the covering arrays' added cases
change then; sweep case ids never do).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

from conformance.cases.case import DESCALES, LAYOUTS
from conformance.cases.fields import SPEC
from conformance.cases.sweep import BATCHES, MASKS, MLA_DIMS
from conformance.models.load import builtin_registry

__all__ = [
    "APPEND_LEVELS",
    "AXES",
    "BATCH_SHAPES",
    "CONSTRAINTS",
    "DIMS",
    "EARLIER",
    "EQUAL_DIMS",
    "FA_HEAD_DIM_TEMPLATES",
    "FIELD_AXES",
    "HEADS",
    "HEAD_MODELS",
    "KERNEL_AXES",
    "MLA_MODEL",
    "PLAIN",
    "WIDE_BATCH_SHAPES",
    "WIDE_HEADS",
    "Axis",
    "Constraint",
    "field_axis",
    "short_append_len",
    "valid",
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
        try:
            values = [point[a] for a in self.axes]
        except KeyError:  # an axis the rule reads is unassigned
            return True
        return bool(self.rule(*values))


def field_axis(name: str, kernel: bool = False) -> Axis:
    """The axis named after the case field ``name``: its levels and doc are the field's row
    (:data:`~conformance.cases.fields.SPEC`), a level is the field's value (:func:`~conformance.cases.space.build`
    passes it through, :func:`~conformance.cases.space.classify` buckets a value with the row's ``level``)."""
    spec = SPEC[name]
    return Axis(name, spec.levels, kernel, spec.help)


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
#: The request lists of a wide heads level (:data:`WIDE_HEADS`): the same batch shapes, their long requests
#: shortened (still crossing a 128-key tile) so that a 128-head case costs the CPU reference about what an
#: 8-head case of :data:`BATCH_SHAPES` does; the short lists are shared.
WIDE_BATCH_SHAPES: dict[str, str] = {
    **BATCH_SHAPES,
    "prefill": "w_pfvar",
    "chunked": "w_chunk",
    "mixed-decode-first": "w_mixdf",
    "mixed-decode-last": "w_mixdl",
    "cross": "w_cross",
}

#: Wide heads level -> (registry model, kv heads override): the level is that model's (num_heads, num_kv_heads),
#: or (num_heads, override) for MLA's absorbed decode, which reads one latent kv head.
HEAD_MODELS: dict[str, tuple[str, int | None]] = {
    "h32-mha": ("llama-2-7b", None),  # 32/32, as MPT-7B, Phi-3 and BLOOM-7B1
    "h32-gqa4": ("llama-3.1-8b", None),  # 32/8, as Mistral 7B and Qwen3 8B
    "h40-gqa5": ("llama-4-scout-17b-16e", None),  # 40/8: a ratio of 5
    "h64-gqa8": ("llama-3.1-70b", None),  # 64/8, as gpt-oss and Qwen2.5 72B
    "h64-gqa16": ("qwen3-235b-a22b", None),  # 64/4: ratio 16
    "h128-gqa16": ("llama-3.1-405b", None),  # 128/8, as Falcon 40B
    "h128-mha": ("deepseek-v3", None),  # 128/128: MLA prefill (kv heads = heads)
    "h128-mqa": ("deepseek-v3", 1),  # 128/1: MLA absorbed decode over the latent cache
}


def _model_heads(model: str, kv: int | None) -> tuple[int, int]:
    m = builtin_registry().get(model)
    return m.num_heads, m.num_kv_heads if kv is None else kv


#: Heads level -> (num_heads, num_kv_heads): six narrow levels (8 to 16 q heads) and the wide ones of real
#: models (:data:`HEAD_MODELS`, 32 to 128 q heads, GQA ratios up to 16).
HEADS: dict[str, tuple[int, int]] = {
    "gqa4": (8, 2),
    "mha": (8, 8),
    "gqa2": (8, 4),
    "gqa3": (12, 4),  # a ratio that is not a power of two
    "gqa8": (16, 2),  # ratio 8 and above
    "mqa": (8, 1),
    **{name: _model_heads(model, kv) for name, (model, kv) in HEAD_MODELS.items()},
}
#: The heads levels with 32 q heads or more (built from :data:`WIDE_BATCH_SHAPES`).
WIDE_HEADS: frozenset[str] = frozenset(name for name, (h, _) in HEADS.items() if h >= 32)

#: flash-attention's compiled head-dim templates (Dao-AILab/flash-attention, csrc/flash_attn/src/
#: generate_kernels.py: ``HEAD_DIMENSIONS = [32, 64, 96, 128, 160, 192, 224, 256]``); a kernel runs another
#: head dim in the next template up, so 40, 80 and 112 (GPT-2-style 40 and 80, MPT-30B's 112) are levels too.
FA_HEAD_DIM_TEMPLATES = (32, 64, 96, 128, 160, 192, 224, 256)
EQUAL_DIMS = tuple(sorted({*FA_HEAD_DIM_TEMPLATES, 40, 80, 112}))
#: The registry's MLA model: its unabsorbed prefill dims (nope + rope, v: 192/128), the absorbed decode over the
#: latent cache as one head (rope + latent, latent: 576/512), and (as ``MLA_DIMS``) rope 64 with a q_v part of
#: the latent 512, FA3's qv form.
MLA_MODEL = "deepseek-v3"
_MLA = builtin_registry().get(MLA_MODEL).mla
assert _MLA is not None and (_MLA.qk_rope_head_dim, _MLA.kv_lora_rank) == MLA_DIMS
_DV_LT_D: tuple[tuple[int, int], ...] = (_MLA.prefill_dims, _MLA.decode_dims)
_DV_GT_D: tuple[tuple[int, int], ...] = (MLA_DIMS,)
#: The ``dims`` axis' levels, ``(head_dim, head_dim_v)``: equal dims (128 first, the default), then MLA's.
DIMS: tuple[tuple[int, int], ...] = tuple((d, d) for d in (128,) + tuple(x for x in EQUAL_DIMS if x != 128)) + (
    _DV_LT_D + _DV_GT_D
)
_BLOCK_SIZES = (1, 16, 32, 64, 128, 256)
#: Mask levels (keys of :data:`~conformance.cases.sweep.MASKS`), one per masking mode.
_MASK_LEVELS = ("none", "causal", "w0-0", "w16-0", "cw128", "w32-32", "w64-inf", "winf-16", "chunk64", "cchunk64")
#: Append levels: none (False), every query token a new key in the activation dtype (True), a *short* append
#: (``append_len`` < some ``q_len``: flash-attention's ``seqlen_new < seqlen_q``, 16-bit or fp8 new keys) and an
#: fp8 append of every query token (FA3's fp8 kvcache append: new keys given in fp8 with the cache's descales).
APPEND_LEVELS: tuple[bool | str, ...] = (False, True, "short", "fp8")
assert set(_MASK_LEVELS) <= set(MASKS)
assert all(b in BATCHES for b in WIDE_BATCH_SHAPES.values()) and set(WIDE_BATCH_SHAPES) == set(BATCH_SHAPES)

_AXES: tuple[Axis, ...] = (
    Axis(
        "batch",
        tuple(BATCH_SHAPES),
        True,
        "batch composition (request list shape); see BATCH_SHAPES and classify_batch",
    ),
    Axis(
        "heads",
        tuple(HEADS),
        True,
        "q heads / kv heads: 8-16 q heads MHA, GQA ratio 2, 3, 4, 8, MQA; real models' 32/32, 32/8, 40/8, 64/8, "
        "64/4, 128/8, 128/128, 128/1 (HEADS)",
    ),
    Axis(
        "dims",
        DIMS,
        True,
        "(head_dim, head_dim_v): equal dims 32..256 (every flash-attention template, 40, 80, 112), MLA's 192/128, "
        "576/512 and 64/512",
    ),
    field_axis("dtype", kernel=True),
    Axis("layout", LAYOUTS, True, "KV layout: contiguous, or a paged cache NHD / HND"),
    Axis("block_size", (None,) + _BLOCK_SIZES, True, "paged block size (None: contiguous)"),
    Axis("mask", _MASK_LEVELS, True, "masking mode (a MASKS key): causal / window / chunk combination"),
    field_axis("quant", kernel=True),
    field_axis("softcap"),
    field_axis("alibi"),
    field_axis("sinks"),
    Axis(
        "append",
        APPEND_LEVELS,
        False,
        "the kernel appends the new k/v to the cache: no, the q_len new keys (16-bit), a short append (append_len "
        "< q_len) or the q_len new keys in fp8 (APPEND_LEVELS)",
    ),
    field_axis("num_splits"),
    field_axis("scale"),
    field_axis("descale"),
    field_axis("quant_q"),
    field_axis("qv"),
    field_axis("v_padded"),
    field_axis("scheduler_metadata"),
    Axis("cp", ((1, 0), (2, 1)), False, "context parallel (cp_world, cp_rank): off, or one rank's key shard"),
)
#: Every axis by name, in a fixed order (kernel axes first).
AXES: dict[str, Axis] = {a.name: a for a in _AXES}
#: The axes that interact inside kernels (covered at strength 3 by ``default``).
KERNEL_AXES: tuple[str, ...] = tuple(a.name for a in _AXES if a.kernel)
#: The axes named after a case field whose level is the field's value (:func:`field_axis`).
FIELD_AXES: tuple[str, ...] = tuple(a.name for a in _AXES if a.name in SPEC and SPEC[a.name].levels)


# ---------------------------------------------------------------------------------------------- constraints
def _requests_of(batch: str) -> tuple[tuple[int, int], ...]:
    return BATCHES[BATCH_SHAPES[batch]]


def _family(quant: str) -> str | None:
    return None if quant == "none" else quant.split("_")[0]


def short_append_len(requests: Sequence[tuple[int, int]]) -> int | None:
    """The ``append_len`` of a short append over ``requests`` (what :func:`~conformance.cases.space.build` gives the
    ``short`` level): half the shortest query (at least 1), at most the shortest ``kv_len``; None where the case model
    allows no short append (a request without queries or keys, or every ``q_len`` 1)."""
    if not requests or min(q for q, _ in requests) < 1 or min(k for _, k in requests) < 1:
        return None
    if max(q for q, _ in requests) < 2:
        return None
    return max(1, min(min(q for q, _ in requests) // 2, min(k for _, k in requests)))


#: Append level -> the quantization families (None: unquantized) its new keys may have.
_APPEND_QUANT: dict[bool | str, tuple[str | None, ...]] = {
    False: (None, "fp8", "int8"),
    True: (None,),
    "short": (None, "fp8"),
    "fp8": ("fp8",),
}


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
        lambda append, batch: append in (False, "short") or all(q <= k for q, k in _requests_of(batch)),
        "an append of every query token (True, fp8) writes the q_len new tokens as the last keys, so every request "
        "needs q_len <= kv_len",
    ),
    Constraint(
        "short_append_fits_batch",
        ("append", "batch"),
        lambda append, batch: append != "short" or short_append_len(_requests_of(batch)) is not None,
        "a short append writes 1 <= append_len <= every q_len and kv_len new keys, below some q_len: no request "
        "without queries or keys, and some q_len >= 2",
    ),
    Constraint(
        "append_quant",
        ("append", "quant"),
        lambda append, quant: _family(quant) in _APPEND_QUANT[append],
        "append True is unquantized, fp8 is fp8 (FA3 takes the new keys in fp8 with the cache's descales), a short "
        "append either; int8 new keys are quantized by the engine while writing the cache, never appended",
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
            descale is None if (family := _family(quant)) is None else descale in (None, *DESCALES[family])
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
    "dims": tuple(d for d in DIMS if d[0] == d[1]),
    "dtype": ("bf16", "fp16"),
    "layout": ("contiguous", "NHD"),
    "mask": tuple(m for m in _MASK_LEVELS if "chunk" not in m),
    "quant": ("none",),
    **{a.name: (a.default,) for a in _AXES if not a.kernel},
}


#: The space as it was before levels were added to an existing axis, oldest first, each as a sub-space of today's
#: (axis -> the levels it had then).  The covering arrays cover each one in turn, after :data:`PLAIN` and before the
#: whole space (:func:`conformance.cases.covering.cover`), so the cases they added before a level arrived keep their
#: rows and ids and only the tuples the new levels make possible add cases, after them.  Issue 31: the append levels
#: ``short`` and ``fp8``.
EARLIER: tuple[dict[str, tuple[Hashable, ...]], ...] = ({"append": (False, True)},)


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
