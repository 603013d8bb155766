"""Random cases from the whole case space, seeded and deterministic: draw ``index`` of seed ``seed`` is always
the same case (or the same rejection), whatever was drawn before it.

A draw has two stages:

1. **Levels.**  Every axis of :data:`conformance.cases.space.AXES` gets one of its levels, drawn in the order
   of :data:`_ORDER` among the levels that keep the partial point extensible to a valid one
   (:func:`conformance.cases.space.extensible`), so the space's constraints shape the draw instead of
   rejecting it afterwards.  Rare modes (qv, V padding, quantization, append, ...) keep their default level
   with the probability in :data:`_P_DEFAULT`; the others are uniform over their levels.
2. **Values.**  Each level becomes concrete values between and beyond the named levels: a random request list
   of the drawn batch shape (lengths biased to edge values: 0, 1, the block size and tile sizes +-1 up to 4096,
   sq > sk), head counts that classify to the drawn heads level (any count up to ``max_heads``, 256 by default:
   the 128 level's bucket holds 91 to 256 q heads, Falcon-7B's 71/1 falls in the 128 MQA one), head dims at or
   near the drawn level, any multiple of 8 up to 256 and now and then one that is not (which adapters must
   refuse where their kernel does), d != dv pairs around 192/128, 576/512 and 64/512, block sizes off the
   levels up to 1024, window extents and chunk sizes around the sequence lengths, soft-caps, scales from 0.001
   to 2 (the default ``head_dim ** -0.5`` passed explicitly too) and split counts up to 64.  The ``short`` append
   level gets an ``append_len`` from a generator of its own (:func:`_append_len`); the ``fp8`` one is an append with
   the drawn fp8 quantization.

3. **Invariance.**  From a generator of its own (so the drawn fields above are the same with or without it), a
   draw with at least two requests becomes an invariance case with probability :data:`P_INVARIANCE`: ``run``,
   ``batch`` or ``neighbour`` (two requests: the target and a neighbour of at least two query tokens; a longer
   batch keeps its first two), with ``num_splits`` pinned to 1 half the time when the draw left it to the kernel
   (the batch-invariant promise).  Where the case model refuses the invariance with the drawn fields (a graph, a
   quantized cache, context parallelism, ...), the draw stays the plain case.

The case is then checked by the case model (:class:`~conformance.cases.case.AttentionCase` validation) and by
the space's constraints on its classified point; a draw either fails is *rejected*: returned with its reason,
never run, and counted by the campaign.  Sizes stay affordable: ``max_tokens`` bounds the summed q and kv
lengths of a case and ``max_tokens**2 * WORK_PER_TOKEN2`` its work ``sum(q_len * kv_len) * h * (d + dv)``
(request lengths are capped before they are drawn, so a draw with many heads or wide dims gets shorter
sequences rather than a rejection).

Draw ``i`` depends on ``(seed, i)`` only (``random.Random`` seeded per index), so a resumed campaign continues the
stream exactly; why not Hypothesis strategies: ``docs/concepts/fuzzing.md`` (*Why the draws are not Hypothesis
strategies*).
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from conformance.cases import space
from conformance.cases.case import AttentionCase
from conformance.cases.sweep import BATCHES, MASKS, MLA_DIMS, MLA_SCALE
from conformance.graphs.assemble import assemble_refusal

__all__ = ["DRAWN_AXES", "P_INVARIANCE", "Draw", "DrawLimits", "WORK_PER_TOKEN2", "draw", "stream"]

#: Probability that a draw of two or more requests is made an invariance case (stage 3 of the module docstring).
P_INVARIANCE = 0.15

#: ``max_work = max_tokens**2 * WORK_PER_TOKEN2``: a prefill of ``max_tokens`` with h * (d + dv) = 128
#: (e.g. 1 head of d = 64).  Measured on 2 CPU cores: inputs + reference + baseline of a work of 2**25
#: (max_tokens 512) take about 0.1-0.3 s.
WORK_PER_TOKEN2 = 128

#: The order in which axes get their level: rare modes first, so the constraints they impose (qv: the MLA
#: dims; quantization: a 16-bit dtype, no append) shape the common axes rather than the reverse.
_ORDER = (
    "qv",
    "v_padded",
    "scheduler_metadata",
    "cp",
    "quant",
    "descale",
    "quant_q",
    "append",
    "batch",
    "heads",
    "dims",
    "dtype",
    "layout",
    "block_size",
    "mask",
    "softcap",
    "alibi",
    "sinks",
    "num_splits",
    "scale",
)
#: Every axis this module turns into values (a test checks that it covers :data:`space.AXES`).
DRAWN_AXES = frozenset(_ORDER)

#: The axes named after a case field (:data:`space.FIELD_AXES`) whose level is the drawn value as it is; the others
#: among them draw a value within their level (:func:`_case_fields`).
_AS_LEVEL = tuple(a for a in space.FIELD_AXES if a not in ("softcap", "num_splits", "scale", "qv"))

#: Probability that an axis keeps its default level (axes not listed: uniform over their levels).
_P_DEFAULT: dict[str, float] = {
    "qv": 0.95,
    "v_padded": 0.95,
    "scheduler_metadata": 0.95,
    "cp": 0.95,
    "quant": 0.8,
    "quant_q": 0.7,
    "append": 0.88,
    "softcap": 0.82,
    "alibi": 0.88,
    "sinks": 0.82,
    "num_splits": 0.8,
    "scale": 0.85,
}

#: Tile and block boundaries kernels care about; lengths near them are drawn often (those within the cap).
_TILE_EDGES = tuple(e + o for e in (64, 128, 256, 512, 1024, 2048, 4096) for o in (-1, 0, 1))


@dataclass(frozen=True)
class DrawLimits:
    """Size bounds of a draw: summed q and kv lengths, heads, and (derived) work."""

    max_tokens: int = 512
    max_heads: int = 256

    def __post_init__(self) -> None:
        if self.max_tokens < 64:
            raise ValueError(f"max_tokens must be >= 64, got {self.max_tokens}")
        if self.max_heads < 1:
            raise ValueError(f"max_heads must be >= 1, got {self.max_heads}")

    @property
    def max_work(self) -> int:
        """Bound on ``sum(q_len * kv_len) * num_heads * (head_dim + head_dim_v)``."""
        return self.max_tokens**2 * WORK_PER_TOKEN2


@dataclass(frozen=True)
class Draw:
    """Draw ``index`` of a seed: the case, or why the case model rejected it (``case`` is None then).
    ``levels`` are the drawn axis levels (before values were chosen)."""

    index: int
    case: AttentionCase | None
    rejected: str = ""
    levels: tuple[tuple[str, Hashable], ...] = ()


def work(case: AttentionCase) -> int:
    """``sum(q_len * kv_len) * num_heads * (head_dim + head_dim_v)``: what the reference costs."""
    return sum(q * k for q, k in case.requests) * case.num_heads * (case.head_dim + case.dv)


# ---------------------------------------------------------------------------------------------- levels
def _levels(rng: random.Random, max_heads: int) -> dict[str, Hashable]:
    point: dict[str, Hashable] = {}
    for name in _ORDER:
        if name not in space.AXES:
            continue
        axis = space.AXES[name]
        allowed = [v for v in axis.values if space.extensible({**point, name: v})]
        if name == "heads":  # only the levels some head count within the limit classifies to
            allowed = [v for v in allowed if _head_pairs(max_heads).get(str(v))]
        if not allowed:  # cannot happen for a consistent space; the case model would reject the draw
            continue
        p_default = _P_DEFAULT.get(name)
        others = [v for v in allowed if v != axis.default]
        if p_default is not None and axis.default in allowed and (not others or rng.random() < p_default):
            point[name] = axis.default
        else:
            point[name] = rng.choice(others if p_default is not None and others else allowed)
    return point


# ---------------------------------------------------------------------------------------------- values
def _length(rng: random.Random, lo: int, hi: int, block: int | None) -> int:
    """A length in [lo, hi], biased to edges: lo, lo + 1, tile sizes +-1, the block size +-1 and 2 blocks + 1."""
    if hi <= lo:
        return lo
    u = rng.random()
    if u < 0.4:
        edges = {lo, lo + 1, hi, *_TILE_EDGES}
        if block:
            edges |= {block - 1, block, block + 1, 2 * block + 1}
        return rng.choice(sorted(e for e in edges if lo <= e <= hi))
    if u < 0.8:
        return rng.randint(lo, min(hi, lo + 64))
    return rng.randint(lo, hi)


def _requests(
    rng: random.Random, level: str, max_tokens: int, per_req: int, block: int | None
) -> list[tuple[int, int]]:
    """A random request list of batch shape ``level`` (see :func:`space.classify_batch`): 1-8 requests, each
    length at most ``min(max_tokens / requests, per_req)`` (and at least 3, so every shape can be drawn)."""
    n = 1 if level == "prefill-single" else rng.choice((1, 2, 2, 3, 3, 4, 5, 6, 8))
    if level in ("prefill", "mixed-decode-first", "mixed-decode-last", "cross"):
        n = max(n, 2)
    cap = max(3, min(max_tokens // n, per_req))
    L = lambda lo=1, hi=cap: _length(rng, lo, max(lo, hi), block)
    if level == "prefill":
        return [(x, x) for x in (L() for _ in range(n))]
    if level == "prefill-single":
        x = L(2)
        return [(x, x)]
    if level == "single-token":
        return [(1, 1)] * n
    if level == "decode":
        reqs = [(1, L()) for _ in range(n)]
        return reqs if any(k > 1 for _, k in reqs) else [(1, L(2))] + reqs[1:]
    if level == "spec-decode":
        s = rng.randint(2, min(16, cap))
        return [(s, L(s)) for _ in range(n)]
    if level == "chunked":
        reqs = []
        for _ in range(n):
            k = L(3)
            reqs.append((rng.randint(2, k - 1), k))
        return reqs
    if level in ("mixed-decode-first", "mixed-decode-last"):
        m = rng.randint(1, n - 1)
        decodes = [(1, L(2)) for _ in range(m)]
        others = []
        for _ in range(n - m):
            k = L(2)
            others.append((rng.choice((k, rng.randint(2, k))), k))
        return decodes + others if level == "mixed-decode-first" else others + decodes
    if level == "sq>sk":
        reqs = []
        for i in range(n):
            if i == 0 or rng.random() < 0.5:
                k = L(1, cap - 1)
                reqs.append((L(k + 1), k))
            else:
                x = L()
                reqs.append((x, x))
        rng.shuffle(reqs)
        return reqs
    if level == "cross":
        k_small = L(1, cap - 1)
        q_small = L(1, cap - 1)
        reqs = [(L(k_small + 1), k_small), (q_small, L(q_small + 1))]
        reqs += [(L(0), L(0)) for _ in range(n - 2)]
        rng.shuffle(reqs)
        return reqs
    if level == "empty-kv":
        reqs = [(L(0), 0)]
        reqs += [(L(0), rng.choice((0, L()))) for _ in range(n - 1)]
        rng.shuffle(reqs)
        return reqs
    # a batch shape added to the space after this module: its canonical request list, clipped to the cap
    return [(min(q, cap), min(k, cap)) for q, k in BATCHES[space.BATCH_SHAPES[level]]]


@lru_cache(maxsize=None)
def _head_pairs(max_heads: int) -> dict[str, tuple[tuple[int, int], ...]]:
    """Heads level -> every (num_heads, num_kv_heads) with at most ``max_heads`` q heads that classifies to it."""
    out: dict[str, list[tuple[int, int]]] = {}
    for hk in range(1, max_heads + 1):
        for h in range(hk, max_heads + 1, hk):
            out.setdefault(space.classify_heads(h, hk), []).append((h, hk))
    return {level: tuple(sorted(pairs)) for level, pairs in out.items()}


def _heads(rng: random.Random, level: str, max_heads: int) -> tuple[int, int]:
    """The level's own head counts (when within the limit) 40 % of the time, else any pair of its bucket."""
    pairs = _head_pairs(max_heads).get(level) or ((1, 1),)
    own = space.HEADS.get(level)
    if own is not None and own in pairs and rng.random() < 0.4:
        return own
    return rng.choice(pairs)


def _dim_near(rng: random.Random, d: int) -> int:
    """``d`` itself, a multiple of 8 within +-16 of it, any multiple of 8 up to 256, or (one draw in ten) a dim
    that is not a multiple of 8, up to 263."""
    u = rng.random()
    if u < 0.4:
        return d
    if u < 0.65:
        return max(8, d + 8 * rng.randint(-2, 2))
    if u < 0.9:
        return 8 * rng.randint(1, 32)
    return 8 * rng.randint(0, 32) + rng.randint(1, 7)


def _dims(rng: random.Random, level: tuple[int, int], qv: bool) -> tuple[int, int]:
    d, dv = level
    if qv or (d, dv) == MLA_DIMS and rng.random() < 0.5:
        return MLA_DIMS
    if d == dv:
        x = _dim_near(rng, d)
        return x, x
    if dv < d:  # value head dim below the qk one (MLA prefill's 192/128, absorbed 576/512 and their relatives)
        if rng.random() < 0.5:
            return d, dv
        d2 = 8 * (rng.randint(3, 32) if d <= 256 else rng.randint(33, 80))
        return d2, 8 * rng.randint(max(1, d2 // 8 - 16), d2 // 8 - 1)
    d2 = 8 * rng.randint(1, 16)  # value head dim above the qk one
    return d2, 8 * rng.randint(d2 // 8 + 1, 64)


def _block_size(rng: random.Random, level: Hashable) -> int | None:
    """The level's block size, or (one draw in four) any size up to 300, a multiple of 16 up to 1024, 512 or 1024."""
    if level is None:
        return None
    u = rng.random()
    if u < 0.15:
        return rng.randint(1, 300)
    if u < 0.25:
        return rng.choice((512, 1024, 16 * rng.randint(1, 64)))
    assert isinstance(level, int)  # a block_size level of the case space
    return level


def _scale(rng: random.Random, head_dim: int) -> float:
    """A softmax scale from 0.001 to 2 (log-uniform), or an edge: the default ``head_dim ** -0.5`` passed
    explicitly, MLA's scale, 1."""
    if rng.random() < 0.3:
        return rng.choice((round(head_dim**-0.5, 6), MLA_SCALE, 1.0))
    return round(10 ** rng.uniform(-3.0, 0.3), 4)


def _extent(rng: random.Random, kv_max: int) -> int:
    """A window extent: an edge (0, 1, 2, the longest kv length +-1) or a random value up to it."""
    if rng.random() < 0.4:
        return rng.choice(sorted({0, 1, 2, max(0, kv_max - 1), kv_max, kv_max + 1}))
    return rng.randint(0, kv_max + 2)


def _mask(rng: random.Random, level: str, kv_max: int) -> tuple[bool, tuple[int | None, int | None], int | None]:
    causal, (left, right), chunk = MASKS[level]
    if level != "w0-0" or rng.random() < 0.3:  # w0-0 (only the aligned key) stays zero-width most of the time
        left = None if left is None else _extent(rng, kv_max)
        right = None if right is None or causal else (0 if right == 0 else _extent(rng, kv_max))
    if chunk is not None:
        chunk = rng.choice((1, 2, 16, 64, 128, max(1, kv_max), rng.randint(1, kv_max + 1)))
    return causal, (left, right), chunk


def _case_fields(rng: random.Random, levels: dict[str, Hashable], limits: DrawLimits) -> dict[str, Any]:
    get = lambda name, default=None: levels.get(name, default)
    qv = bool(get("qv", False))
    h, hk = _heads(rng, str(get("heads", "mha")), limits.max_heads)
    dims = get("dims", (64, 64))
    assert isinstance(dims, tuple)  # a dims level of the case space: (head_dim, head_dim_v)
    d, dv = _dims(rng, dims, qv)
    layout = str(get("layout", "contiguous"))
    block = _block_size(rng, get("block_size")) if layout != "contiguous" else None
    per_req = math.isqrt(max(1, limits.max_work // (h * (d + dv))))  # a prefill of this length meets the bound
    requests = _requests(rng, str(get("batch", "prefill")), limits.max_tokens, per_req, block)
    while work_of(requests, h, d + dv) > limits.max_work and any(k > 1 or q > 1 for q, k in requests):
        # several long requests: shorten all alike (down to single tokens, which are kept whatever their work)
        requests = [((q + 1) // 2, (k + 1) // 2) for q, k in requests]
    kv_max = max(k for _, k in requests)
    causal, window, chunk = _mask(rng, str(get("mask", "none")), kv_max)
    softcap = None if get("softcap") is None else round(rng.uniform(1.0, 50.0), 1)
    scale = None if get("scale") is None else _scale(rng, d)
    splits = get("num_splits")
    num_splits = None if splits is None else (1 if splits == 1 else rng.randint(2, rng.choice((8, 8, 8, 64))))
    # cp level (2, 1) stands for any world > 1: the draw picks the world (2 to 4 ranks) and the rank
    cp_world = 1 if get("cp", (1, 0)) == (1, 0) else rng.randint(2, 4)
    append_len = _append_len(requests) if get("append") == "short" else None
    return {
        "requests": tuple(requests),
        "num_heads": h,
        "num_kv_heads": hk,
        "head_dim": d,
        "head_dim_v": None if dv == d else dv,
        "kv_layout": layout,
        "block_size": block,
        "causal": causal,
        "window": window,
        "chunk": chunk,
        "softcap": softcap,
        "scale": scale,
        "append": get("append", False) is not False and (get("append") != "short" or append_len is not None),
        "append_len": append_len,
        "num_splits": num_splits,
        "qv": qv,
        "cp_world": cp_world,
        "cp_rank": rng.randrange(cp_world) if cp_world > 1 else 0,
        **{name: get(name, space.AXES[name].default) for name in _AS_LEVEL},
    }


def _append_len(requests: list[tuple[int, int]]) -> int | None:
    """The ``append_len`` of a draw at the ``short`` append level: uniform in ``[1, min(q_len, kv_len)]`` and below
    the longest q_len, drawn from its own generator (seeded by the requests, so the draw's other fields are those of
    the stream); None where the requests allow no short append (a request without queries or keys, every q_len 1):
    :func:`draw` then makes the draw a plain case."""
    hi = min(min(q for q, _ in requests), min(k for _, k in requests), max(q for q, _ in requests) - 1)
    return random.Random(repr(tuple(requests))).randint(1, hi) if hi >= 1 else None


def work_of(requests: list[tuple[int, int]], h: int, dims: int) -> int:
    return sum(q * k for q, k in requests) * h * dims


# ---------------------------------------------------------------------------------------------- draws
def _invariance(rng: random.Random, fields: dict[str, Any]) -> dict[str, Any] | None:
    """The fields of the draw made an invariance case, or None (stage 3 of the module docstring)."""
    requests = fields["requests"]
    if len(requests) < 2 or rng.random() >= P_INVARIANCE:
        return None
    kinds = ["run", "batch"] + (["neighbour", "neighbour"] if requests[1][0] >= 2 else [])
    kind = rng.choice(kinds)
    changed = dict(fields, invariance=kind)
    if kind == "neighbour":
        changed["requests"] = tuple(requests[:2])
    if fields["num_splits"] is None and kind != "run" and rng.random() < 0.5:
        changed["num_splits"] = 1
    return changed


def draw(seed: int, index: int, limits: DrawLimits = DrawLimits()) -> Draw:
    """Draw ``index`` of the stream of ``seed`` (depends on nothing else)."""
    rng = random.Random(f"attnconf-fuzz:{seed}:{index}")
    levels = _levels(rng, limits.max_heads)
    fields = _case_fields(rng, levels, limits)
    frozen_levels = tuple(levels.items())
    try:
        case = AttentionCase(**fields)
    except ValueError as exc:
        return Draw(index, None, f"case model: {exc}", frozen_levels)
    invariant = _invariance(random.Random(f"attnconf-fuzz-invariance:{seed}:{index}"), fields)
    if invariant is not None:
        try:
            made = AttentionCase(**invariant)
        except ValueError:
            made = None  # the case model refuses this invariance with these fields: the plain case stays
        if made is not None and not assemble_refusal(made):  # nor one every backend would refuse
            case = made
    problems = space.violations(space.classify(case))
    if problems:
        return Draw(index, None, "case space: " + "; ".join(problems), frozen_levels)
    return Draw(index, case, "", frozen_levels)


def stream(seed: int, limits: DrawLimits = DrawLimits(), start: int = 0) -> Iterator[Draw]:
    """Draws ``start, start + 1, ...`` of ``seed``, rejected ones included (an endless iterator)."""
    index = start
    while True:
        yield draw(seed, index, limits)
        index += 1
